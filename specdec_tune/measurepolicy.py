"""Every threshold and size measuring decides by, in one frozen `MeasurePolicy`, each field with what
it is and what set it: the search's intervals and races (measure.stats), the repeats the OS noise
asks for (measure.noise), the machine anchors (measure.anchors) and the fresh-process reference
(app.reference). `check`'s verdict rules are `checkpolicy.CheckPolicy`'s. A shared leaf.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MeasurePolicy:
    """How measuring is sized and when a measured difference counts as resolved.

    Grouped by the module that reads it. Where no measurement set a number, the docstring says what
    reasoning did; the measurements cited are in benchmarks/ (README.md says where each series ran).
    """

    # ------------------------------------------- statistics of paired measurements (measure.stats)
    confidence: float = 0.95
    """The search's bootstrap intervals: a speedup's interval in a profile and a race's paired
    comparison (`check`'s is `CheckPolicy.confidence`). The usual 95 %, not set by a measurement."""

    bootstrap_resamples: int = 2000
    """Resamples of those intervals; seeded, so the same numbers always give the same interval."""

    min_pairs: int = 5
    """Fewer paired repeats than this never resolve a race: with four all on one side the exact
    sign test still gives p = 0.125 > `sign_alpha`, and a bootstrap of four values cannot see the
    tails; five is the fewest at which a unanimous sign test passes (p = 0.0625). It is also the
    fewest final-round repeats the budget plans (search.budget) and `run` asks for (app.common)."""

    sign_alpha: float = 0.1
    """A race is resolved only when the two-sided sign test of its paired ratios is at or below this
    as well as the interval excluding 1.0: the bootstrap alone is too narrow on a handful of pairs
    (4267a86, tests/search/test_racing.py)."""

    # --------------------------------------------------------------- the OS noise (measure.noise)
    resolve_share: float = 0.05
    """The smallest relative speedup difference `run`'s interleaved repeats should resolve: the
    noise's `repeats_needed` and the noisy-machine line say how many repeats that takes (40232bb);
    half `CheckPolicy.tolerance`'s 10 %."""

    interval_z: float = 1.96
    """The normal quantile of a 95 % interval, by which `repeats_needed` sizes a paired ratio's
    interval from one pass's variation (2 x z x sqrt(2) cv / sqrt(n) < `resolve_share`)."""

    unseen_note_share: float = 0.02
    """Busy time that no process seen at both ends of a window used, beyond what those processes
    used by more than this share of all CPUs, is named among the busiest as short-lived processes
    (a test run, a compiler: 75126e8). A line for the user only: the busy rule counts it whatever
    its size."""

    clean_wait_share: float = 0.03
    """A timed prompt whose threads waited for a CPU (run queue, measure.preemption) at most this
    share of its seconds counts as unpreempted; `check` judges a speedup measured beside other work
    on the repeats rebuilt from such prompts (`preemption.clean_ratios`). Quiet prompts of the
    shared 2-core VM waited 1.0-1.4 % (kernel threads, short-lived processes); loaded ones 25-75 %."""

    # -------------------------------------------------------- the machine anchors (measure.anchors)
    anchor_copy_mib: int = 256
    """The copy anchor's buffer (the costs profile's copy too): past any cache, so it reads memory.
    Copy and matmul together take about 0.35 s on a 2-core CPU (a7e7072)."""

    anchor_matmul_n_cpu: int = 512
    """The float32 matmul anchor's size on a CPU, timed over blocks of calls (forward.MIN_BLOCK_MS):
    about 0.15 s on a 2-core CPU, and on one quiet shared VM it stayed within 5 % while the copy
    moved 76 -> 43 GB/s, which is why the matmul decides other hardware (a7e7072,
    benchmarks/interference.py)."""

    anchor_matmul_n_cuda: int = 2048
    """Its size on a CUDA device (a7e7072); no series in benchmarks/ set it."""

    anchor_repeats: int = 5
    """Samples of each anchor: the anchor is their median, its spread their (max - min) / median
    (a7e7072)."""

    # -------------------------------------------------- the fresh-process reference (app.reference)
    reference_processes: int = 3
    """Fresh processes `run` ends with to measure the reference `check` judges tokens/s against:
    one process's absolute rate differs from another's on the same quiet VM by several per cent
    (20 quiet checks measured 0.955-1.083x the run's stored plain rate, benchmarks/interference.py;
    2a64469). `CheckPolicy.min_reference_processes` are needed to judge against them."""

    reference_repeats: int = 3
    """Interleaved repeats in each reference process: `check`'s default, so the reference is
    measured as `check` measures."""

    reference_startup_s: float = 5.0
    """A fresh interpreter importing torch and loading the models, on a small pair: the start-up
    part of a reference process's estimated length (the budget's reserve for the references)."""

    reference_anchor_share: float = 0.4
    """The decode anchor's parts beside one plain pass, as a share of it, in that estimate: half as
    many steps as tokens (decode_anchor.STEPS_PER_TOKEN), a step about 0.7 of a token's time on the
    demo pair (4bd9356)."""

    def anchor_matmul_n(self, device: str) -> int:
        """The matmul anchor's size on `device` (a CUDA device or anything else: the CPU's)."""
        return self.anchor_matmul_n_cuda if str(device).startswith("cuda") else self.anchor_matmul_n_cpu


MEASURE_POLICY = MeasurePolicy()
