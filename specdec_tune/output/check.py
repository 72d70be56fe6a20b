"""Judge a re-measurement of a stored profile: the CI regression gate (the measuring is `app.check`).

The speedup is judged with a test, not a single threshold: the bootstrap interval of (speedup now /
speedup stored), over the per-repeat ratios of both, against the floor 1 - tolerance
(`measure.stats.judge_speedup`): a regression, a pass, or "inconclusive" when the machine was too
noisy to tell (CLI exit 6). Greedy acceptance is deterministic on the same hardware and dtype, so
its tolerance is tight.

Before judging, the anchors tell other hardware from a regression (`anchor_verdict`): the machine
anchors (copy bandwidth, a small matmul rate: measure.anchors) far from the profile's on a quiet
machine are other hardware (CLI exit 3). When they agree, a slower target is a regression even
though its speedup holds, so the plain and the speculative tokens/s are judged too, with the same
test (`rate_items`); absolute rates move with any other work, so on a machine that is not quiet a
drop of them is inconclusive. Profiles without machine anchors (written before them) keep the older
rule: plain tokens/s decides other hardware and tokens/s is information only.
"""

from __future__ import annotations

import statistics
from typing import Any

from ..domain import MIN_REFERENCE_PROCESSES
from ..errors import SpecDecError
from ..measure.noise import repeats_needed
from ..measure.stats import INCONCLUSIVE, PASS, REGRESSION, judge_speedup
from ..store.schema import Profile
from .rates import JUDGED_RATES, PER_ANCHOR, RATES, in_fresh, info_item, judge_rate, rate_items
from .verdicts import CheckItem, CheckReport

__all__ = ["CheckItem", "CheckReport", "rate_items"]  # where callers have always found them


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
    busy: bool = False,
    judge_rates: bool = False,
    rates_busy: bool = False,
    rate_scale: float = 1.0,
) -> CheckReport:
    """Compare a re-measurement (`bench.Measurement` of the best config; `again`: the second one
    taken when the first did not clearly pass) with what the profile stored. `busy`: the OS said
    other work shared the machine meanwhile (see `judge_config`); `judge_rates`, `rates_busy`: see
    `rate_items`."""
    report = CheckReport(profile=profile_path, config=profile.best.config.label)
    same = weights_hash == profile.target.content_hash
    note = "" if same else "the target model files changed"
    report.items.append(CheckItem("target weights", profile.target.content_hash, weights_hash, same, note))
    report.items += judge_config(
        profile.best,
        profile.workload.temperature,
        measured,
        again,
        tolerance,
        acceptance_tolerance,
        busy=busy,
        judge_rates=judge_rates,
        rates_busy=rates_busy,
        rate_scale=rate_scale,
        reference=reference_of(profile),
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
    busy: bool = False,
    judge_rates: bool = False,
    rates_busy: bool = False,
    rate_scale: float = 1.0,
    reference: dict[str, list[float]] | None = None,
) -> list[CheckItem]:
    """The items of one stored config re-measured (`where` names it, e.g. " @ B=4").

    On a `busy` machine other work takes the target's cores and speculation gains less, by more
    than any tolerance: with one core of two kept busy, checks of an unchanged setup measured
    0.75-0.89 of the stored speedup (benchmarks/interference.py). A drop there cannot be told from
    the load, so it is inconclusive, never a regression; acceptance and exactness, which no load
    changes, are still judged.
    """
    stored = stored_result.metrics
    m = measured.metrics
    items = []
    judged = judge_measured(stored, measured, again, tolerance, reference)
    if busy and judged.verdict == REGRESSION:
        judged.verdict = INCONCLUSIVE
    confirm = ""
    if again is not None:
        # Judged on all repeats together: a real regression stays below the floor, one noisy run
        # on a busy machine does not fail CI alone.
        confirm = f"; first {m.speedup:.3f}, so re-measured: {len(samples_of(measured, again))} repeats"
        if getattr(again, "processes", 0):
            confirm = (
                f"; first {m.speedup:.3f}, so {in_fresh(again.processes, len(samples_of(measured, again)))}"
            )
    ref = reference_speedups(reference)
    if ref:
        against = f"the reference ({len(ref)} fresh processes)"
    else:
        against = "stored repeats" if stored.speedup_samples else "stored median"
    note = f"{judged.note} vs {against}{confirm}"
    if judged.verdict == INCONCLUSIVE:
        note += "; inconclusive: " + (SHARED if busy else "too noisy to tell")
    elif busy:
        note += "; " + SHARED
    items.append(
        CheckItem(
            f"speedup{where}",
            round(statistics.median(ref) if ref else stored.speedup, 4),
            round(judged.ratio * (statistics.median(ref) if ref else stored.speedup), 4),
            judged.verdict != REGRESSION,
            note,
            inconclusive=judged.verdict == INCONCLUSIVE,
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
    if judge_rates:
        return items + rate_items(
            stored, measured, again, tolerance, rates_busy, where, rate_scale, reference
        )
    for metric in RATES:
        items.append(info_item(f"{metric}{where}", getattr(stored, metric), getattr(m, metric)))
    return items


def samples_of(measured: Any, again: Any | None) -> list[float]:
    """Every per-repeat speedup of a re-measurement (and its confirmation)."""
    out = list(measured.speedups or [measured.metrics.speedup])
    return out + (list(again.speedups or [again.metrics.speedup]) if again is not None else [])


def judge_measured(
    stored: Any,
    measured: Any,
    again: Any | None,
    tolerance: float,
    reference: dict[str, list[float]] | None = None,
) -> Any:
    """`stats.judge_speedup` of a re-measurement against the reference processes' speedups where the
    profile has them (`reference_of`), else against the stored metrics (the final round's repeats,
    all from the one process that ran the search)."""
    if not 0 < tolerance < 1:
        raise SpecDecError(f"--tolerance must be in (0, 1), got {tolerance}")
    ref = reference_speedups(reference)
    if ref:
        return judge_speedup(samples_of(measured, again), ref, statistics.median(ref), tolerance)
    return judge_speedup(samples_of(measured, again), stored.speedup_samples, stored.speedup, tolerance)


def reference_speedups(reference: dict[str, list[float]] | None) -> list[float]:
    """The reference processes' speedups (one each), when at least two processes recorded one."""
    ref = (reference or {}).get("speedup") or []
    return list(ref) if len(ref) >= MIN_REFERENCE_PROCESSES else []


MAX_CONFIRM_REPEATS = 12
# A speedup measured while other work took over 10 % of the CPUs (or steal time rose): said so,
# not "busy", which is the OS rule's word for over 25 % (the JSON's noise.busy)
SHARED = "other work shared the machine"


def reference_of(profile: Profile) -> dict[str, list[float]]:
    """The profile's reference tokens/s per metric (app.reference: one median per fresh process,
    measured as `check` measures), where it has at least two; {} for older profiles."""
    a = profile.anchors
    if a is None or not a.has_reference:
        return {}
    out = {
        "tokens_per_s": list(a.reference_tokens_per_s),
        "baseline_tokens_per_s": list(a.reference_baseline_tokens_per_s),
        "speedup": list(a.reference_speedups),
    }
    if a.has_anchor_reference:
        out[PER_ANCHOR] = list(a.reference_plain_per_anchor)
    return out


def needs_confirmation(
    stored: Any,
    measured: Any,
    tolerance: float,
    judge_rates: bool = False,
    rate_scale: float = 1.0,
    reference: dict[str, list[float]] | None = None,
) -> bool:
    """Measure again? When the speedup (or, judged, the plain tokens/s) did not clearly pass."""
    if judge_measured(stored, measured, None, tolerance, reference).verdict != PASS:
        return True
    return judge_rates and any(
        judge_rate(stored, measured, None, metric, tolerance, rate_scale, reference).verdict != PASS
        for metric in JUDGED_RATES
    )


def confirm_repeats(measured: Any, repeats: int) -> int:
    """Repeats for the confirming re-measurement: as many as the first one's spread needs to resolve
    5 % (`noise.repeats_needed`; a ratio of two passes varies sqrt(2) times one pass), capped."""
    import math

    xs = list(measured.speedups or [])
    if len(xs) < 2:
        return repeats
    mean = sum(xs) / len(xs)
    cv = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) / mean if mean > 0 else 0.0
    return max(repeats, min(MAX_CONFIRM_REPEATS, repeats_needed(cv / math.sqrt(2))))
