"""Other hardware or a regression? `check` compares the profile's anchors with this machine's before
judging anything.

The machine anchors (copy bandwidth and a small matmul rate, measure.anchors) depend on the
machine alone: their geometric mean of stored / measured beyond the policy's `anchor_tolerance` (or their own
noise) on a quiet machine is other hardware (CLI exit 3). Within it, the machine is the profile's, so
a slower target is the target's: `check` then judges the tokens/s as well. A profile without machine
anchors (written before them) keeps the older rule: the target's plain tokens/s decides other
hardware, and tokens/s stays information only (a slower target reads as other hardware there).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..checkpolicy import CHECK_POLICY, CheckPolicy
from ..measure.stats import geometric_mean
from ..store.schema import Profile

if TYPE_CHECKING:
    from ..measure.anchors import MachineSpeed

MACHINE_ANCHORS = {"copy_bandwidth_gbps": "copy", "matmul_gflops": "matmul"}


@dataclass
class AnchorVerdict:
    """What the anchors say: this machine measured `slowdown` times slower than the profile's (< 1:
    faster), by the machine anchors or (older profiles) plain decoding, and what follows."""

    slowdown: float | None  # None: nothing to compare
    by: str  # "machine anchors", "plain tokens/s" or ""
    tolerance: float
    other_hardware: bool  # beyond the tolerance on a quiet machine
    judge_rates: bool  # the tokens/s are judged items (the machine anchors agree, or load explains them)
    compared: dict[str, list[float]] = field(default_factory=dict)  # anchor: [stored, measured]

    @property
    def rate_scale(self) -> float:
        """What measured tokens/s are multiplied by before they are judged: the machine anchors'
        slowdown where they decided and agree within the tolerance (the rates then read at the
        profile's machine speed), else 1: anchors apart on a busy machine are the load's, which
        slows a small matmul differently from the target."""
        if self.by != "machine anchors" or self.slowdown is None or beyond(self.slowdown, self.tolerance):
            return 1.0
        return self.slowdown

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.compared,
            "slowdown": None if self.slowdown is None else round(self.slowdown, 3),
            "by": self.by,
            "tolerance": round(self.tolerance, 3),
            "other_hardware": self.other_hardware,
            "rates_judged": self.judge_rates,
            "rate_scale": round(self.rate_scale, 4),
        }


def anchor_slowdown(profile: Profile, plain_tokens_per_s: float) -> float | None:
    """How many times slower plain decoding runs here than where the profile was made (None:
    the profile has no anchors); on the check slice, than the reference processes ran it there."""
    a = profile.anchors
    if a is None or not plain_tokens_per_s > 0:
        return None
    return stored_plain(a) / plain_tokens_per_s


def stored_plain(a: Any) -> float:
    """The plain tokens/s this machine had where the profile was made: on the check slice, the
    reference processes' median there (the run's own ran on every core)."""
    if a.sliced and a.reference_baseline_tokens_per_s:
        return float(statistics.median(a.reference_baseline_tokens_per_s))
    return float(a.plain_tokens_per_s)


def plain_tolerance(profile: Profile | None, policy: CheckPolicy = CHECK_POLICY) -> float:
    """How far plain decoding (older profiles) may move before it says other hardware: the policy's
    `anchor_tolerance`, or `plain_cv_multiple` times the plain passes' variation the profile
    recorded when that is larger (short passes of a small model vary a lot)."""
    cv = profile.noise.plain_pass_cv if profile is not None and profile.noise is not None else 0.0
    return max(policy.anchor_tolerance, policy.plain_cv_multiple * cv)


def other_hardware(
    slowdown: float | None,
    machine_busy: bool,
    profile: Profile | None = None,
    policy: CheckPolicy = CHECK_POLICY,
) -> bool:
    """Plain decoding (older profiles) differs beyond the noise (`plain_tolerance`): a different
    machine, unless other work explains it."""
    if slowdown is None or machine_busy:
        return False
    return beyond(slowdown, plain_tolerance(profile, policy))


def beyond(slowdown: float, tolerance: float) -> bool:
    return slowdown > 1 + tolerance or slowdown < 1 / (1 + tolerance)


def machine_slowdown(profile: Profile, machine: MachineSpeed) -> tuple[float | None, dict[str, list[float]]]:
    """Stored / measured of the deciding machine anchor (matmul; copy where it is the only one),
    and every pair both have. A profile whose reference was measured on the check slice (one
    thread, measure.narrow) compares the matmul rate those processes measured there, as `check`
    measures it now: the run's own anchors ran on every core."""
    a = profile.anchors
    if a is None or machine is None:
        return None, {}
    stored = {name: getattr(a, name, None) for name in MACHINE_ANCHORS}
    if a.sliced:  # measured on the check slice (measure.narrow): only the slice's own matmul compares
        stored = {"matmul_gflops": a.reference_matmul_gflops}
    pairs = {
        name: [value, getattr(machine, name)]
        for name, value in stored.items()
        if value and (getattr(machine, name, None) or 0) > 0
    }
    if not pairs:
        return None, {}
    # The matmul rate decides where both have it: on a shared VM the copy bandwidth of one machine
    # moved 76 -> 43 GB/s within minutes (benchmarks/interference.py) while matmul stayed within
    # 5 %; copy still decides for a profile that has nothing else, and is reported either way.
    deciding = {k: v for k, v in pairs.items() if k == "matmul_gflops"} or pairs
    slowdown = geometric_mean([stored / now for stored, now in deciding.values()])
    return slowdown, {k: [stored, round(now, 3)] for k, (stored, now) in pairs.items()}


def deciding_spread(machine: MachineSpeed, pairs: dict[str, list[float]]) -> float:
    """The own spread of the anchor that decided (`machine_slowdown`): the matmul's where both
    anchors were compared. Not the larger of the two: the copy bandwidth of one quiet VM moved
    between 43 and 78 GB/s from one check to the next, and a tolerance that wide let a machine
    measured 1.55x slower by its matmul pass as the profile's (benchmarks/interference.py)."""
    if "matmul_gflops" in pairs and getattr(machine, "matmul_spread", None) is not None:
        return float(machine.matmul_spread)
    return float(getattr(machine, "spread", 0.0) or 0.0)


def rate_scale_for(profile: Profile, verdict: AnchorVerdict, machine: MachineSpeed) -> float:
    """What `check` multiplies measured tokens/s by: `verdict.rate_scale`, except that rates judged
    against the reference processes (app.reference) are put at the speed those processes measured
    (their own matmul rate), not the run's: the reference and the check are both fresh processes,
    and the run's anchor came from minutes earlier in another one."""
    a = profile.anchors
    now = getattr(machine, "matmul_gflops", None)
    ref = a.reference_matmul_gflops if a is not None else None
    if verdict.rate_scale == 1.0 or not ref or not now or not a.has_reference:
        return verdict.rate_scale
    return ref / now


def anchor_verdict(
    profile: Profile,
    plain_tokens_per_s: float,
    machine: MachineSpeed,
    machine_busy: bool,
    policy: CheckPolicy = CHECK_POLICY,
) -> AnchorVerdict:
    """Other hardware or not, from the machine anchors (`machine`: measure.anchors.MachineSpeed, or
    None) when the profile has them, else from plain decoding (older profiles); `machine_busy`:
    the Environment's `busy` (output.environment).

        matmul 100 stored, 95 here, quiet              -> same machine (1.05x), rates judged
        matmul 100 stored, 55.6 here, quiet            -> other hardware (1.80x slower)
        matmul 100 stored, 55.6 here, busy             -> the load's: not other hardware, rates judged
        no machine anchors, plain 80 stored, 44.4 here -> other hardware (by plain tokens/s)"""
    plain = {}
    if profile.anchors is not None and plain_tokens_per_s > 0:
        plain = {"plain_tokens_per_s": [stored_plain(profile.anchors), round(plain_tokens_per_s, 3)]}
    slow, pairs = machine_slowdown(profile, machine)
    if slow is not None:
        tolerance = max(policy.anchor_tolerance, deciding_spread(machine, pairs))
        other = beyond(slow, tolerance) and not machine_busy
        # Anchors apart on a busy machine: the load explains them, and judged rates say inconclusive.
        return AnchorVerdict(slow, "machine anchors", tolerance, other, not other, {**plain, **pairs})
    slow = anchor_slowdown(profile, plain_tokens_per_s)
    if slow is None:
        return AnchorVerdict(None, "", policy.anchor_tolerance, False, False)
    tolerance = plain_tolerance(profile, policy)
    return AnchorVerdict(
        slow, "plain tokens/s", tolerance, other_hardware(slow, machine_busy, profile, policy), False, plain
    )


def other_hardware_message(path: str | Path, verdict: AnchorVerdict, rerun: str = "specdec-tune run") -> str:
    """The one line of exit 3: how many times slower (or faster) this machine measured, and on what."""
    n = verdict.slowdown or 1.0
    words = f"{n:.2f}× slower" if n >= 1 else f"{1 / n:.2f}× faster"
    if verdict.by == "machine anchors":
        units = {"copy_bandwidth_gbps": "GB/s", "matmul_gflops": "GFLOP/s"}
        what = ", ".join(
            f"{MACHINE_ANCHORS[k]} {v[1]:.1f} {units[k]} against the profile's {v[0]:.1f}"
            for k, v in verdict.compared.items()
            if k in MACHINE_ANCHORS
        )
    else:
        stored, now = verdict.compared["plain_tokens_per_s"]
        what = f"plain decoding {now:.1f} tokens/s against the profile's {stored:.1f}"
    return (
        f"{path}: other hardware (measured {words}: {what}) on a quiet machine, though the slug is "
        f"the same; re-run `{rerun}` here or pass --allow-other-hardware to judge anyway"
    )
