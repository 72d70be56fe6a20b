"""The costs profile: everything the cost model needs, measured on the local device and gathered
into a `Costs`: T_target and C_ver(gamma) (see `forward`), the decoding loops' own overheads (see
`overheads`), T_draft and the acceptance vector per drafter, copy bandwidth, matmul throughput,
roofline share.
It only measures (never searches); every timing goes through `timing`.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..domain import Costs, DraftCosts
from ..errors import SpecDecError
from ..limits import check_count, check_gamma
from ..runtime.caches.modes import ExecutionContext
from ..runtime.decode import SpecStats
from ..runtime.drafting.drafters import Drafter
from ..runtime.drafting.hybrid import reset_sources, source_stats
from ..runtime.graphs import prebuild
from ..runtime.workloads import Case
from .bench import run_pass
from .forward import (
    calls_per_block,
    check_context_fits,
    context_ids,
    decode_weight_bytes,
    forward_curve_ms,
    measure_copy_bandwidth_gbps,
    measure_matmul_tflops,
    no_gc,
    repeat_block,
    vocab_size,
)
from .overheads import LoopClock, measure_loop_overheads_ms
from .timing import median, spread, time_repeated

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# The acceptance pass at an envelope's longer lengths (`carry`): enough verifications for the
# cost model's prediction there; the races at that length measure the acceptance of what they race.
CARRIED_ACCEPTANCE_STEPS = 64


@torch.inference_mode()
def measure_t_draft_ms(drafter: Drafter, seq: list[int], repeats: int, gamma: int = 4) -> float:
    """Milliseconds per proposed token: `propose(gamma)` + `commit` cycles after `seq` is prefilled.

    Each cycle feeds one new token (as the engine feeds the target's bonus token) and drafts from
    there; `commit(len(seq))` rolls the draft back, so every cycle sees the same context. A drafter
    that proposes nothing (prompt lookup without a match) is charged its overhead per call.
    """
    if not seq:
        raise SpecDecError("measuring a drafter needs a non-empty context")
    check_count(repeats, "repeats")
    check_gamma(gamma, allow_zero=False)
    device = str(getattr(drafter, "device", "cpu"))
    seq = list(seq)
    drafter.start(seq)
    first, _ = drafter.propose(seq, 1, 0.0, 0.0, None)  # prefill: the draft's cache now holds seq
    # The draft's own guess as the new token keeps prompt lookup on the sequence's pattern.
    seq_plus = [*seq, int(first[0]) if first.numel() else seq[-1]]
    proposed = 0

    def cycle() -> None:
        nonlocal proposed
        draft, _ = drafter.propose(seq_plus, gamma, 0.0, 0.0, None)
        drafter.commit(len(seq))
        proposed = draft.numel()

    with no_gc():
        calls = calls_per_block(time_repeated(cycle, device, 1, warmup=1)[0])
        times_ms = time_repeated(repeat_block(cycle, calls), device, repeats, warmup=0)
    return median(times_ms) / calls / max(1, proposed)


def _pad(values: list[float], length: int) -> list[float]:
    values = list(values[:length])
    return values + [values[-1] if values else 0.0] * (length - len(values))


@torch.inference_mode()
def acceptance_vector(
    target: PreTrainedModel,
    drafter: Drafter,
    case: Case,
    max_gamma: int,
    max_steps: int | None = None,
    ctx: ExecutionContext | None = None,
) -> tuple[list[float], float, SpecStats]:
    """Per-position conditional acceptance from one greedy pass at gamma = max_gamma, threshold 0.

    A position the drafter left empty (prompt lookup without a match, or with a short one) counts
    as rejected, so the vector predicts tokens per step (`SpecStats.effective_acceptance`).
    Returns (vector of length max_gamma, alpha, the pass's stats). Positions the pass never
    reached reuse the last measured value (0.0 when nothing was ever verified), as
    `costmodel.expected_tokens` does past a vector's end. With `max_steps`, prompts are taken in
    order until that many verifications were counted: a poor draft at a large gamma spends gamma
    draft forwards per emitted token, and a few hundred verifications pin its rates down.
    """
    check_gamma(max_gamma, allow_zero=False, what="max_gamma")
    if max_steps is not None:
        check_count(max_steps, "max_steps")
    stats = SpecStats()
    for prompt, budget in zip(case.prompts, case.max_new_tokens, strict=True):
        one = Case([prompt], [budget], case.eos, temperature=0.0)
        _, s = run_pass(target, drafter, max_gamma, 0.0, one, ctx=ctx)
        stats.add(s)
        if max_steps is not None and stats.target_forwards >= max_steps:
            break
    return _pad(stats.effective_acceptance, max_gamma), stats.acceptance_rate, stats


def _models_of(drafter: Drafter) -> list[Any]:
    """The models a drafter runs (a hybrid's through its model part), whose caches it fills."""
    parts = [drafter, getattr(drafter, "drafter", None)]
    return [m for m in (getattr(x, "model", None) for x in parts) if m is not None]


def default_context_len(case: Case) -> int:
    """Median prompt length + half the median max_new_tokens: the typical mid-generation context."""
    prompt = statistics.median(len(p) for p in case.prompts)
    new = statistics.median(case.max_new_tokens)
    return max(16, round(prompt + new / 2))


# ----------------------------------------------------------------------------- all together


@torch.inference_mode()
def measure_costs(
    target: PreTrainedModel,
    drafters: dict[str, Drafter],
    case: Case | None,
    device: str,
    max_gamma: int = 16,
    repeats: int = 5,
    context_len: int | None = None,
    with_bandwidth: bool = True,
    progress: Callable[[str, float], None] | None = None,
    acceptance_tokens: int = 64,
    acceptance_steps: int | None = 256,
    measure_acceptance: Collection[str] | None = None,
    ctx: ExecutionContext | None = None,
    carry: Costs | None = None,
) -> Costs:
    """Measure every field of `Costs` for `target` and each drafter on `device`.

    Acceptance vectors come from one greedy pass over `case` with each prompt's budget capped at
    `acceptance_tokens`, stopping after the prompt that reaches `acceptance_steps` verifications;
    only for the drafters named in `measure_acceptance` (default: all). The others (random
    weights on either side) get an empty vector with `acceptance_source` "unknown". Without a
    `case` no acceptance is measured and `context_len` must be given.
    T_target, C_ver and T_draft use a seeded random context of `context_len` tokens.
    `with_bandwidth=False` skips the synthetic micro-benchmarks (copy bandwidth, matmul
    throughput). `progress(label, fraction_done)` is called before each stage and once with 1.0
    at the end.
    `carry` (the costs of an envelope's first length, app.envelope): what does not change with
    the context is taken from it, not measured again: the loop overheads, copy bandwidth and
    matmul throughput; the acceptance pass stops after CARRIED_ACCEPTANCE_STEPS verifications.
    T_target, C_ver, T_draft and acceptance are measured at `context_len`.
    """
    check_gamma(max_gamma, allow_zero=False, what="max_gamma")
    check_count(repeats, "repeats")
    check_count(acceptance_tokens, "acceptance_tokens")
    if acceptance_steps is not None:
        check_count(acceptance_steps, "acceptance_steps")
    measured, context_len = _measured_and_context(drafters, case, context_len, measure_acceptance)
    check_context_fits(target, context_len, max_gamma + 1)

    if carry is not None:
        with_bandwidth = False
        if acceptance_steps is not None:
            acceptance_steps = min(acceptance_steps, CARRIED_ACCEPTANCE_STEPS)
    stages = _Stages(progress, drafters, measured, max_gamma, with_bandwidth, carry is None)
    copy_gbps, tflops = (carry.copy_bandwidth_gbps, carry.matmul_tflops) if carry else (None, None)
    if with_bandwidth:
        copy_gbps, tflops = _machine_rates(stages, device, next(target.parameters()).dtype, repeats)

    stages.next()
    # T_target (1 token) and C_ver (gamma + 1 tokens) in one interleaved loop: same drift for all.
    samples = forward_curve_ms(target, context_len, list(range(1, max_gamma + 2)), repeats, ctx)
    t_target_ms = median(samples[0])
    if carry is None:
        stages.next()
        loop_overhead_ms, step_overhead_ms = measure_loop_overheads_ms(
            target, context_len, min(4, max_gamma), repeats, ctx=ctx
        )
    else:  # the loop's own work per token and per step does not grow with the context
        loop_overhead_ms, step_overhead_ms = carry.loop_overhead_ms, carry.step_overhead_ms

    vocab = min(
        [vocab_size(target)] + [vocab_size(d.model) for d in drafters.values() if hasattr(d, "model")]
    )
    timing = _DraftTiming(
        target, context_ids(vocab, context_len), repeats, max_gamma, t_target_ms, ctx, device
    )
    capped = None
    if case is not None:
        budgets = [min(m, acceptance_tokens) for m in case.max_new_tokens]
        capped = Case(case.prompts, budgets, case.eos, case.temperature)
    draft_costs = []
    for name, drafter in drafters.items():
        stages.next()
        if name not in measured:
            draft_costs.append(_unknown_acceptance(timing, name, drafter))
            continue
        stages.next()
        draft_costs.append(_draft_costs(timing, name, drafter, capped, acceptance_steps))

    decode_gbps = decode_weight_bytes(target) * (1000.0 / t_target_ms) / 1e9
    if progress is not None:
        progress("done", 1.0)
    return Costs(
        t_target_ms=t_target_ms,
        t_target_spread=spread(samples[0]),
        verify_ms=[median(s) for s in samples[1:]],
        verify_spread=max(spread(s) for s in samples[1:]),
        context_len=context_len,
        drafts=draft_costs,
        copy_bandwidth_gbps=copy_gbps,
        decode_bandwidth_gbps=decode_gbps,
        roofline_share=decode_gbps / copy_gbps if copy_gbps else None,
        matmul_tflops=tflops,
        loop_overhead_ms=loop_overhead_ms,
        step_overhead_ms=step_overhead_ms,
    )


def _measured_and_context(
    drafters: dict[str, Drafter],
    case: Case | None,
    context_len: int | None,
    measure_acceptance: Collection[str] | None,
) -> tuple[list[str], int]:
    """The drafters whose acceptance is measured (none without prompts), and the context length the
    costs are measured at (given, else the workload's typical mid-generation context)."""
    measured = [n for n in drafters if measure_acceptance is None or n in measure_acceptance]
    if case is None:  # no prompts: nothing to measure acceptance on, nor to take a context length from
        measured = []
        if context_len is None:
            raise SpecDecError("without prompts the context length must be given (--context-len)")
    if context_len is None:
        context_len = default_context_len(case)
    check_count(context_len, "context_len")
    return measured, context_len


def _machine_rates(stages: _Stages, device: str, dtype: torch.dtype, repeats: int) -> tuple[float, float]:
    """The synthetic micro-benchmarks: copy bandwidth (GB/s) and matmul throughput (TFLOP/s)."""
    stages.next()
    copy_gbps, _ = measure_copy_bandwidth_gbps(device, repeats=repeats)
    stages.next()
    return copy_gbps, measure_matmul_tflops(device, dtype, repeats=repeats)


class _Stages:
    """The stages of a costs profile with their rough shares of the time: `next()` reports the one
    starting and how much of the whole is done before it."""

    def __init__(
        self,
        progress: Callable[[str, float], None] | None,
        drafters: dict[str, Drafter],
        measured: list[str],
        max_gamma: int,
        with_bandwidth: bool,
        with_overheads: bool,
    ) -> None:
        stages: list[tuple[str, float]] = []  # (label, rough share of the time)
        if with_bandwidth:
            stages += [("memory bandwidth", 1.0), ("matmul throughput", 1.0)]
        stages.append((f"target forward + verification curve (γ 1..{max_gamma})", 3.0))
        if with_overheads:
            stages.append(("decoding-loop overheads", 2.0))
        for name in drafters:
            stages.append((f"draft cost: {name}", 1.0))
            if name in measured:
                stages.append((f"acceptance: {name}", 4.0))
        self.progress, self.total, self.done, self._step = (
            progress,
            sum(w for _, w in stages),
            0.0,
            iter(stages),
        )

    def next(self) -> None:
        label, weight = next(self._step)
        if self.progress is not None:
            self.progress(label, self.done / self.total)
        self.done += weight


@dataclass(frozen=True)
class _DraftTiming:
    """What every drafter's costs are measured against: the target, a random context, T_target."""

    target: PreTrainedModel
    context: list[int]
    repeats: int
    max_gamma: int
    t_target_ms: float
    ctx: ExecutionContext | None
    device: str

    def t_draft_ms(self, drafter: Drafter) -> float:
        return measure_t_draft_ms(drafter, self.context, self.repeats, gamma=min(4, self.max_gamma))


def _unknown_acceptance(timing: _DraftTiming, name: str, drafter: Drafter) -> DraftCosts:
    """A drafter whose acceptance is not measured: its T_draft alone. No acceptance pass, so no share
    of the lookup's steps: a hybrid is charged its model's T_draft per token, an upper bound."""
    if getattr(drafter, "kind", None) == "hybrid":
        t_draft_ms = timing.t_draft_ms(drafter.drafter)
        timing.t_draft_ms(drafter.lookup)  # its lookup is timed too, as for a measured hybrid
    else:
        t_draft_ms = timing.t_draft_ms(drafter)
    unknown = DraftCosts(name, t_draft_ms, t_draft_ms / timing.t_target_ms, 0.0, [])
    unknown.acceptance_source = "unknown"
    return unknown


def _draft_costs(
    timing: _DraftTiming, name: str, drafter: Drafter, capped: Case | None, acceptance_steps: int | None
) -> DraftCosts:
    """A drafter's T_draft, its acceptance vector from one greedy pass, and the loop's own timings
    of that pass. A hybrid's T_draft is per source: the lookup's tokens cost next to nothing, the
    model's T_draft each, weighted by the model's share of the drafted tokens."""
    target, ctx = timing.target, timing.ctx
    hybrid = getattr(drafter, "kind", None) == "hybrid"
    if hybrid:
        t_model, t_lookup = timing.t_draft_ms(drafter.drafter), timing.t_draft_ms(drafter.lookup)
    else:
        t_draft_ms = timing.t_draft_ms(drafter)
    reset_sources(drafter)
    # The graphs this pass reaches (verification at max_gamma + 1, every draft width up to it)
    # are built first: the loop clocks below never time a compile.
    prebuild(ctx, target, [timing.max_gamma], only=[target, *_models_of(drafter)])
    with LoopClock(target, drafter, timing.device, ctx is not None and ctx.compiled) as clock:
        vector, alpha, _ = acceptance_vector(target, drafter, capped, timing.max_gamma, acceptance_steps, ctx)
    if hybrid:
        share = source_stats(drafter)[drafter.drafter.name]["share"]
        t_draft_ms = share * t_model + (1.0 - share) * t_lookup
    dc = DraftCosts(name, t_draft_ms, t_draft_ms / timing.t_target_ms, alpha, vector)
    dc.loop_t_draft_ms = clock.draft_ms_per_token
    dc.loop_verify_ms = clock.mean_verify_ms
    dc.loop_verify_tokens = clock.mean_verify_tokens
    return dc
