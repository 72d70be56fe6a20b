"""Every threshold `check` decides by, in one frozen `CheckPolicy`, each field with the measurement
that set it; a backend's differences (llama.cpp's stricter busy rule) are values of it, not branches.
A shared leaf: the OS busy rule (measure.noise) and the reference processes (app.reference) read it too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class CheckPolicy:
    """What `check` counts as busy, other hardware, a pass and a doubt worth measuring again.

    Grouped as `check` meets them: the machine's load, the machine anchors, the speedup test, the
    acceptance, the rates, and the confirming re-measurement. The measurements cited are in
    benchmarks/ (README.md says where each series ran)."""

    # ---------------------------------------------------------------- the machine's load (OS)
    busy_others_share: float = 0.25
    """Other processes taking more than this share of all CPUs is a busy machine (measure.noise's
    OS rule, also `run`'s and the reference processes'): with one core of two kept busy (others
    about 0.5), checks of an unchanged setup measured 0.63-0.89x the stored speedup
    (benchmarks/interference.py). Busy: anchors far apart are the load's, not other hardware, and
    a confirmation takes one fresh process, not replaced (`busy_confirm_processes`)."""

    busy_steal_share: float = 0.10
    """The hypervisor's steal over this share of all CPU time is a busy machine too (the same rule
    as `busy_others_share`, for the time a shared VM's neighbours take)."""

    busy_beyond_free_cores_share: float | None = None
    """For an engine whose threads wait for each other at every step: busy already when other
    processes take more than the cores its threads leave free plus this share of all CPUs (None:
    no such rule, the native engine). llama.cpp: 0.10, as bursts averaging a quarter of a 2-core VM,
    below `busy_others_share`, halved SmolLM2's plain decoding and took an unchanged setup's
    speedup to 0.86x, a false regression (567850c, docs/llamacpp.md)."""

    shared_others_share: float = 0.10
    """Other processes over this share of all CPUs, short of busy, is a shared machine: a speedup
    or rate drop there is inconclusive, never a regression. Under 2 s bursts on one of two cores
    (18 % of all CPUs) one of 20 loaded checks said regression at 0.650x, and one check's speedup
    read 2.43x in its process and 1.87x in the confirming one (0ae9c4e,
    benchmarks/interference.py)."""

    load_explains_down_to: float = 0.5
    """A speedup whose whole interval of now / stored lies below this ratio is a regression even on a
    shared or busy machine: other work explains a drop only so far. With one core of two kept busy,
    checks of an unchanged setup measured 0.63-0.89x the stored speedup (benchmarks/interference.py);
    a planted 100 ms per drafting step measured 0.11x [0.10, 0.12] on a shared CI runner and was
    called inconclusive before this rule (tests/output/test_check.py, CI of 42f9c17)."""

    min_clean_repeats: int = 3
    """A speedup measured beside other work is judged as a quiet machine's when at least this many
    whole repeats can be rebuilt from prompts no other process preempted (measure.preemption: their
    threads never waited for a CPU); fewer is inconclusive, and the note says how many repeats would
    give them. Three, as a first measurement's `--repeats` default: the bootstrap interval of fewer
    is too wide to resolve the tolerance."""

    max_repeats_asked: int = 30
    """An inconclusive check names the `--repeats` that would give `min_clean_repeats` unpreempted
    repeats only up to this many (a few minutes of the demo profile on 2 cores); beyond, it asks for
    a quiet machine instead."""

    shared_steal_share: float = 0.05
    """Steal over this share of all CPU time, short of busy, is a shared machine too (the steal
    counterpart of `shared_others_share`, half the busy line as the others' share is)."""

    max_anchor_drift: float = 0.05
    """The matmul anchor moving more than this (relative) from before this process's measurement to
    after it is a drifting machine: absolute rates are then inconclusive (the speedup and the rate
    per decode-anchor step, in which the host's speed cancels, are still judged). On the 2-core VM
    plain decoding fell 23 % within half an hour of quiet checks while the matmul moved 3-17 %,
    and the one false regression of that series came from there (3fde8fe,
    benchmarks/process_modes.py). Not across processes: fresh ones differ by 5-10 % in it, and a
    rule across them made planted regressions inconclusive."""

    # ------------------------------------------------------ the machine anchors (other hardware)
    anchor_tolerance: float = 0.30
    """Machine anchors (the matmul rate; copy bandwidth where it is the only one) more than 1.3x
    slower or faster than the profile's on a machine that is not busy are other hardware (exit 3),
    unless their own spread is larger. A regression of the target moves no machine anchor, and on
    one quiet shared VM the matmul stayed within 5 % while copy moved 76 -> 43 GB/s (a7e7072,
    benchmarks/interference.py)."""

    plain_cv_multiple: float = 4.0
    """Profiles without machine anchors decide other hardware by plain decoding: beyond
    `anchor_tolerance` or this many times the plain passes' variation the profile recorded,
    whichever is wider (short passes of a small model vary a lot; 4d45a8f)."""

    anchor_retries: int = 3
    """Anchors that say other hardware are measured this many more times, `anchor_gap_s` apart, and
    the faster of each decides: load in 2 s bursts landed on both measurements of one loaded check,
    which then read 2.17x slower "on a quiet machine" (a09a6c1, benchmarks/interference.py)."""

    anchor_gap_s: float = 1.0
    """Seconds between those retries, so that they do not all land in one 2 s burst (a09a6c1)."""

    # --------------------------------------------------------------------- the speedup test
    tolerance: float = 0.10
    """`--tolerance`'s default: a speedup (or a judged rate) clearly below stored x (1 - this) is a
    regression. Kept above a profile's own speedup spread (docs/ci.md) and below the 15 % slower
    target forward benchmarks/interference.py plants, which the judged plain rate catches."""

    confidence: float = 0.95
    """The bootstrap interval of now / stored that the floor is tested against (measure.stats)."""

    bootstrap_resamples: int = 2000
    """Resamples of that interval; seeded, so the same numbers always give the same verdict."""

    min_reference_processes: int = 2
    """The fresh reference processes a profile needs before `check` judges against them: one alone
    carries no spread between processes, and the same config measured 2.04x in some fresh processes
    of one quiet VM and 2.43x in others (eb9aef8, benchmarks/process_modes.py)."""

    # ----------------------------------------------------------------------- the acceptance
    greedy_acceptance_tolerance: float = 0.02
    """`--acceptance-tolerance`'s default at temperature 0: greedy acceptance is deterministic on
    the same hardware and dtype, so a change beyond rounding points to other weights, tokenizer,
    workload or engine logic (a1552ae, docs/ci.md)."""

    sampled_acceptance_tolerance: float = 0.08
    """Its default when sampling: sampled acceptance varies with the random draws (a1552ae)."""

    stored_spread_said: float = 0.02
    """An answer that only a quiet machine would give names the stored side's spread from this much
    on (relative): more repeats now cannot narrow what the stored repeats leave (5 vLLM repeats 4 %
    apart, stop 57, docs/vllm.md)."""

    # ---------------------------------------------------------------------------- the rates
    judged_rates: tuple[str, ...] = ("baseline_tokens_per_s",)
    """The absolute rates judged where the machine anchors agree; the rest are information only.
    The speculative tokens/s is the speedup times the plain tokens/s, both judged, and judged on its
    own it failed 3 of 10 quiet checks of an unchanged setup (benchmarks/interference.py)."""

    # ----------------------------------------------------------- the confirming re-measurement
    confirm_resolve_share: float = 0.05
    """A confirmation in this process takes the repeats its first spread needs to resolve this
    relative difference of the speedup (measure.noise.repeats_needed), half the default tolerance."""

    max_confirm_repeats: int = 12
    """At most this many repeats for that confirmation (b4c50b9): more on one process mostly
    resolves that process's own speed level more finely (benchmarks/process_modes.py)."""

    confirm_pair_spread: bool = False
    """A first speedup passes at once only when its whole interval clears the floor, not already
    where its estimate does (True: vLLM, and every check on the check slice: `on_slice`). For an
    engine whose measurement is one pair of servers, two pairs of one config differ by more than
    one pair's repeats show: the plain server read 34.9 tokens/s in one check and 31.0 in the next
    (stop 57), and a 15 % slower speculative side read 0.925 [0.867, 1.011] of stored in one pair,
    a pass by its estimate, where two earlier checks read 0.864 over two pairs (docs/vllm.md).
    Confirmed in a new pair, the interval of both decides."""

    confirm_looks: int = 2
    """A speedup still inconclusive for noise after its confirmation in the session (quiet, or
    judged on unpreempted repeats) is measured once more, with the repeats that would likely answer
    and at least as many as ran so far (at most `max_confirm_repeats`), and judged on all of them:
    this many confirmations at most. A 15 % slower vLLM speculative side read 0.864 [0.794, 0.905]
    over two server pairs, 6 repeats, an interval 0.111 wide where 0.10 decides, 2 checks of 2
    (stop 56, docs/vllm.md). A third look comes where the estimate is below the floor already, so
    it can only turn "too noisy to tell" into an answer, either way; and, with `confirm_pair_spread`,
    where the estimate passes but the interval reaches below the floor (output.check.straddling_pass):
    a planted 15 % drop passed so, 0.915 [0.852, 0.946] (stop 61, docs/ci.md)."""

    confirm_processes: int = 2
    """A doubtful result of a profile with a fresh-process reference is confirmed in this many fresh
    processes, one sample each: on one quiet VM the same config measured about 2.04x in some fresh
    processes and 2.43x in others, a process mostly keeping its level over its repeats (eb9aef8,
    benchmarks/process_modes.py)."""

    busy_confirm_processes: int = 1
    """A check whose own measurement found the machine busy confirms in this many, a busy one not
    replaced: under one busy core of two each fresh process found it busy too and was left out,
    four in a row, and the check took 459 s to say inconclusive (de12414)."""

    max_plain_spread: float = 0.08
    """A reference or confirming process whose plain passes spread wider than this was disturbed
    though the OS saw nothing (quiet, they agree within a few per cent): it is left out, like a busy
    one (75126e8)."""

    extra_processes: int = 2
    """Up to this many more processes take the places of those left out (75126e8; none when the
    check was busy: `busy_confirm_processes`)."""

    reference_agreement: float = 0.04
    """`specdec-tune reference` keeps the largest group of quiet processes whose speedups agree
    within this (largest / smallest - 1), and starts more while fewer than it asked for agree. On
    another VM of the slug, checks against 3 quiet processes that read 1.866, 1.985 and 2.071 caught
    a planted 15 % drop 0 times in 10 (their intervals carried that spread); against 2 that read
    1.972 and 1.983, 3 times in 4 (docs/ci.md)."""

    reference_max_processes: int = 8
    """The most processes `specdec-tune reference` starts looking for agreeing ones."""

    def acceptance_tolerance(self, temperature: float) -> float:
        """The default allowed change of α at `temperature`."""
        return self.greedy_acceptance_tolerance if temperature == 0 else self.sampled_acceptance_tolerance


CHECK_POLICY = CheckPolicy()
# llama.cpp's threads spin-wait for one another, so any other work slows every step: busy by the
# cores its threads leave free, and that busy line is also where a drop stops being judged (its
# shared line is its busy line: no speedup drop is judged "shared" short of it).
LLAMACPP_CHECK_POLICY = replace(
    CHECK_POLICY,
    busy_beyond_free_cores_share=0.10,
    shared_others_share=CHECK_POLICY.busy_others_share,
    shared_steal_share=CHECK_POLICY.busy_steal_share,
)
# vLLM's servers load the CPUs as llama.cpp's do, and one server pair's reading passes only with its
# whole interval above the floor (`confirm_pair_spread`).
VLLM_CHECK_POLICY = replace(LLAMACPP_CHECK_POLICY, confirm_pair_spread=True)


def on_slice(policy: CheckPolicy) -> CheckPolicy:
    """`policy` for a check on the check slice (measure.narrow): a first speedup passes at once only
    with its whole interval above the floor (`confirm_pair_spread`). There a planted 15 % slower
    llama.cpp speculative side read 0.904 [0.846, 0.929] of stored over a first look of 3 repeats
    and passed by its estimate, 1 planted check of 8 (stop 60), where every unchanged llama.cpp
    check's first interval cleared the floor (lowest bound 0.924); of 24 unchanged native checks
    3 were measured again for it (49-81 s against 20-55 s) and passed. On the slice the rule costs
    an unchanged check little and confirms the drops that sit at the floor."""
    return replace(policy, confirm_pair_spread=True)
