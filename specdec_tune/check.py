"""Re-measure a stored profile on this machine and compare: the CI regression gate.

The speedup must stay within a relative tolerance of the stored one; greedy acceptance is
deterministic on the same hardware and dtype, so its tolerance is tight. Tokens/s is reported
for information only: absolute time depends on the machine's load, a ratio timed in one run less so.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from .drafters import build_drafter
from .errors import OtherHardwareError, SpecDecError
from .hardware import hardware_info, hardware_slug, same_hardware
from .measure import measure
from .profile import Profile


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


def check_profile(
    profile: Profile,
    profile_path: str,
    device: str = "auto",
    tolerance: float = 0.10,
    acceptance_tolerance: float | None = None,
    repeats: int = 3,
    allow_other_hardware: bool = False,
) -> CheckReport:
    """Measure the profile's best config and its baseline here; compare with what it stored."""
    import time

    from .session import open_session

    if not 0 < tolerance < 1:
        raise SpecDecError(f"--tolerance must be in (0, 1), got {tolerance}")
    started = time.monotonic()
    best = profile.best
    spec = best.config.draft
    drafts = [spec.path or spec.name] if spec.kind == "model" else []
    if spec.kind == "prompt_lookup":
        drafts = [f"prompt-lookup:{spec.ngram_min or 1}-{spec.ngram_max or 3}"]
    elif spec.kind == "layer_skip":
        drafts = [f"layer-skip:{spec.layers}"]
    s = open_session(
        profile.target.name if profile.target.name != profile.target.path else profile.target.path,
        drafts,
        workload=profile.workload.name,
        max_new_tokens=profile.workload.max_new_tokens,
        temperature=profile.workload.temperature,
        device=device,
        dtype=profile.target.dtype,
        limit=profile.workload.prompts,
    )
    hw = hardware_info(s.device)
    if not same_hardware(profile.hardware, hw) and not allow_other_hardware:
        raise OtherHardwareError(
            f"{profile_path} was measured on {profile.hardware.get('slug')}, this machine is {hardware_slug(hw)}; "
            "re-run `specdec-tune run` here or pass --allow-other-hardware"
        )
    if s.workload.sha256 != profile.workload.sha256:
        raise SpecDecError(
            f"workload '{profile.workload.name}' has changed since the profile was made "
            f"(hash {s.workload.sha256} != {profile.workload.sha256}); re-run `specdec-tune run`"
        )
    report = CheckReport(profile=profile_path, config=best.config.label)
    from .models import content_hash

    now_hash = content_hash(s.target.path)
    report.items.append(
        CheckItem(
            "target weights",
            profile.target.content_hash,
            now_hash,
            now_hash == profile.target.content_hash,
            "" if now_hash == profile.target.content_hash else "the target model files changed",
        )
    )
    if spec.kind != "none":
        # The drafter's name in this session may differ (slugged path); build it from the stored spec.
        models = {spec.name: next(iter(s.drafts.values())).model} if s.drafts else {}
        drafter = build_drafter(spec, s.target.model, models)
    else:
        drafter = None
    m = measure(s.target.model, drafter, best.config.gamma, best.config.threshold, s.case, repeats=repeats)
    stored = best.metrics
    floor = stored.speedup * (1 - tolerance)
    speedup, confirm = m.speedup, ""
    if speedup < floor:
        # Below the floor: measure as much again and judge on all repeats together. A real
        # regression stays below; one noisy run on a busy machine does not fail CI alone.
        again = measure(
            s.target.model, drafter, best.config.gamma, best.config.threshold, s.case, repeats=repeats, seed=1
        )
        speedup = statistics.median(m.speedups + again.speedups)
        confirm = f"; first {m.speedup:.3f}, so re-measured: median of {2 * repeats} repeats"
    report.items.append(
        CheckItem(
            "speedup",
            round(stored.speedup, 4),
            round(speedup, 4),
            speedup >= floor,
            f"must be >= {floor:.3f} (stored - {tolerance:.0%}); spread {m.speedup_spread:.1%}{confirm}",
        )
    )
    if spec.kind != "none":
        tol = acceptance_tolerance
        if tol is None:
            tol = 0.02 if profile.workload.temperature == 0 else 0.08
        diff = abs(m.acceptance_rate - stored.acceptance_rate)
        report.items.append(
            CheckItem(
                "acceptance_rate",
                round(stored.acceptance_rate, 4),
                round(m.acceptance_rate, 4),
                diff <= tol,
                f"must be within ±{tol:.3f}",
            )
        )
    if profile.workload.temperature == 0:
        report.items.append(
            CheckItem(
                "greedy exactness",
                0,
                m.mismatches,
                m.mismatches == 0,
                "prompts whose speculative output differs from the target's own",
            )
        )
    report.items.append(
        CheckItem(
            "tokens_per_s", round(stored.tokens_per_s, 2), round(m.tokens_per_s, 2), True, "information only"
        )
    )
    report.items.append(
        CheckItem(
            "baseline_tokens_per_s",
            round(stored.baseline_tokens_per_s, 2),
            round(m.baseline_tokens_per_s, 2),
            True,
            "information only",
        )
    )
    report.seconds = time.monotonic() - started
    return report


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
