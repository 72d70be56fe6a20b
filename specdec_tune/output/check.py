"""Judge a re-measurement of a stored profile: the CI regression gate (the measuring is `app.check`).

The speedup must stay within a relative tolerance of the stored one; greedy acceptance is
deterministic on the same hardware and dtype, so its tolerance is tight. Tokens/s is reported
for information only: absolute time depends on the machine's load, a ratio timed in one run less so.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from ..errors import SpecDecError
from ..store.schema import Profile


@dataclass
class CheckItem:
    metric: str
    stored: float | str | None
    measured: float | str | None
    ok: bool
    note: str = ""


@dataclass
class CheckReport:
    profile: str
    config: str
    items: list[CheckItem] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return all(i.ok for i in self.items)

    def as_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "config": self.config,
            "passed": self.passed,
            "items": [asdict(i) for i in self.items],
            "seconds": self.seconds,
        }


def speedup_floor(profile: Profile, tolerance: float, stored: Any = None) -> float:
    """The lowest speedup that still passes: the stored one (the best config's, or `stored`
    metrics') minus `tolerance` (relative)."""
    if not 0 < tolerance < 1:
        raise SpecDecError(f"--tolerance must be in (0, 1), got {tolerance}")
    return (stored or profile.best.metrics).speedup * (1 - tolerance)


def judge(
    profile: Profile,
    profile_path: str,
    measured: Any,
    again: Any | None,
    weights_hash: str,
    tolerance: float = 0.10,
    acceptance_tolerance: float | None = None,
) -> CheckReport:
    """Compare a re-measurement (`bench.Measurement` of the best config; `again`: the second one
    taken when the first fell below the floor) with what the profile stored."""
    report = CheckReport(profile=profile_path, config=profile.best.config.label)
    same = weights_hash == profile.target.content_hash
    note = "" if same else "the target model files changed"
    report.items.append(CheckItem("target weights", profile.target.content_hash, weights_hash, same, note))
    report.items += judge_config(
        profile.best, profile.workload.temperature, measured, again, tolerance, acceptance_tolerance
    )
    return report


def judge_config(
    stored_result: Any,
    temperature: float,
    measured: Any,
    again: Any | None,
    tolerance: float = 0.10,
    acceptance_tolerance: float | None = None,
    where: str = "",
) -> list[CheckItem]:
    """The items of one stored config re-measured (`where` names it, e.g. " @ B=4")."""
    stored = stored_result.metrics
    m = measured.metrics
    items = []
    floor = stored.speedup * (1 - tolerance)
    speedup, confirm = m.speedup, ""
    if again is not None:
        # Judged on all repeats together: a real regression stays below the floor, one noisy run
        # on a busy machine does not fail CI alone.
        speedup = statistics.median(measured.speedups + again.speedups)
        confirm = f"; first {m.speedup:.3f}, so re-measured: median of {len(measured.speedups) + len(again.speedups)} repeats"
    items.append(
        CheckItem(
            f"speedup{where}",
            round(stored.speedup, 4),
            round(speedup, 4),
            speedup >= floor,
            f"must be >= {floor:.3f} (stored - {tolerance:.0%}); spread {m.speedup_spread:.1%}{confirm}",
        )
    )
    if stored_result.config.draft.kind != "none":
        tol = acceptance_tolerance
        if tol is None:
            tol = 0.02 if temperature == 0 else 0.08
        diff = abs(m.acceptance_rate - stored.acceptance_rate)
        items.append(
            CheckItem(
                f"acceptance_rate{where}",
                round(stored.acceptance_rate, 4),
                round(m.acceptance_rate, 4),
                diff <= tol,
                f"must be within ±{tol:.3f}",
            )
        )
    if temperature == 0:
        items.append(
            CheckItem(
                f"greedy exactness{where}",
                0,
                measured.mismatches,
                measured.mismatches == 0,
                "prompts whose speculative output differs from the target's own",
            )
        )
    for metric, digits in (("tokens_per_s", 2), ("baseline_tokens_per_s", 2)):
        items.append(
            CheckItem(
                f"{metric}{where}",
                round(getattr(stored, metric), digits),
                round(getattr(m, metric), digits),
                True,
                "information only",
            )
        )
    return items


def junit_xml(report: CheckReport) -> str:
    """JUnit XML: one test case per compared metric, so CI systems show a regression as a failed test."""
    failures = sum(not i.ok for i in report.items)
    lines = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<testsuites tests="{len(report.items)}" failures="{failures}" time="{report.seconds:.3f}">',
        f'  <testsuite name={quoteattr("specdec-tune check " + report.profile)} tests="{len(report.items)}" '
        f'failures="{failures}" time="{report.seconds:.3f}">',
    ]
    for i in report.items:
        name = quoteattr(f"{report.config}: {i.metric}")
        detail = f"stored {i.stored}, measured {i.measured}" + (f" ({i.note})" if i.note else "")
        if i.ok:
            lines.append(f'    <testcase classname="specdec_tune.check" name={name}>')
            lines.append(f"      <system-out>{escape(detail)}</system-out>")
            lines.append("    </testcase>")
        else:
            lines.append(f'    <testcase classname="specdec_tune.check" name={name}>')
            lines.append(
                f"      <failure message={quoteattr(i.metric + ' regressed')}>{escape(detail)}</failure>"
            )
            lines.append("    </testcase>")
    lines += ["  </testsuite>", "</testsuites>", ""]
    return "\n".join(lines)
