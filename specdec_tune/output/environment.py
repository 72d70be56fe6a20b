"""What the machine did while `check` measured, as one value: its load (quiet, shared, busy) and
whether its own speed drifted; and whether the engine build is another (other software). Pure:
what the OS said and the anchors measured go in, the thresholds are the policy's (checkpolicy).

    others_cpu_share 0.02, steal 0.0                 -> quiet: every drop is judged
    others_cpu_share 0.18 (2 s bursts on 1 of 2 cores) -> shared: a speedup or rate drop is inconclusive
    others_cpu_share 0.40, or any window found busy  -> busy: also anchors far apart are the load's
    matmul anchor moved 0.10 within the measurement  -> drifting: absolute rates inconclusive
    (llama.cpp, 2 threads on 2 CPUs: others 0.12 -> busy; 1 thread: others 0.20 -> quiet)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..checkpolicy import CHECK_POLICY, CheckPolicy
from ..measure.noise import busy_info

QUIET, SHARED, BUSY = "quiet", "shared", "busy"
LOADS = (QUIET, SHARED, BUSY)  # from the least load to the most


@dataclass(frozen=True)
class Environment:
    """The machine while `check` measured: `load` QUIET, SHARED or BUSY, and `drifting`: its own
    speed (the matmul anchor) moved beyond the policy's `max_anchor_drift` meanwhile."""

    load: str = QUIET
    drifting: bool = False

    @property
    def quiet(self) -> bool:
        """No other work to speak of: a drop of the speedup is the setup's."""
        return self.load == QUIET

    @property
    def busy(self) -> bool:
        """The OS rule's busy: slow anchors are the load's, and one fresh process confirms."""
        return self.load == BUSY

    def at_worst(self, load: str) -> Environment:
        """This environment with `load` where that is the worse of the two (a later window of the same
        check, such as a further look, can only add to what the check saw)."""
        return replace(self, load=load) if LOADS.index(load) > LOADS.index(self.load) else self

    @property
    def rates_doubtful(self) -> bool:
        """Absolute tokens/s say as much about the host as about the setup: not quiet, or drifting."""
        return not self.quiet or self.drifting


def load_of(
    os_noise: dict[str, Any],
    policy: CheckPolicy = CHECK_POLICY,
    *,
    busy_seen: bool = False,
    threads: int | None = None,
    cpus: int | None = None,
) -> str:
    """QUIET, SHARED or BUSY from what the OS said over a measurement (measure.noise.os_since).
    BUSY: the OS busy rule (measure.noise.busy_info, `threads` and `cpus` for an engine's
    stricter rule), or `busy_seen` (another window of the same check, e.g. the anchors measured
    again or a confirming process, found it busy). SHARED: other processes over the policy's
    `shared_others_share` of all CPUs, or steal over `shared_steal_share`."""
    if busy_seen or busy_info(os_noise, policy, threads=threads, cpus=cpus):
        return BUSY
    others = os_noise.get("others_cpu_share") or 0.0
    steal = os_noise.get("steal_share") or 0.0
    if others > policy.shared_others_share or steal > policy.shared_steal_share:
        return SHARED
    return QUIET


def classify(
    os_noise: dict[str, Any],
    policy: CheckPolicy = CHECK_POLICY,
    *,
    busy_seen: bool = False,
    drift: float = 0.0,
    drift_cancels: bool = False,
    threads: int | None = None,
    cpus: int | None = None,
) -> Environment:
    """The Environment of one measurement (`load_of`); `drift`: how far the matmul anchor moved
    from before it to after it (measure.anchors.measure_twice), drifting beyond the policy's
    `max_anchor_drift` unless `drift_cancels` (the plain rate was timed per decode-anchor step,
    in which the host's own speed cancels)."""
    load = load_of(os_noise, policy, busy_seen=busy_seen, threads=threads, cpus=cpus)
    return Environment(load, drift > policy.max_anchor_drift and not drift_cancels)


def other_software(stored_build: dict[str, Any], build: dict[str, Any]) -> bool:
    """Whether the engine build here is not the one the profile was measured with (llama.cpp:
    the server binary's sha256): exit 3 unless allowed, as other hardware is."""
    return stored_build.get("binary_sha256") != build.get("binary_sha256")
