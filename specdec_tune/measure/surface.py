"""The cost surface over batch sizes: C_ver(B, gamma) for gamma = 0..Gamma (gamma 0 is the plain
decode step T_target(B)) and T_draft(B) per draft, with B rows at the workload's mid-generation
context length, through the batched engine's own caches and forwards.

At B > 1 each batch size also gets costs clocked inside real batched loops over the workload
(`loop_costs`); at B = 1 the cost model reads the costs profile's own in-loop clocks (its
acceptance pass), so none are clocked again. An envelope's longer lengths carry the loop terms of
its first length (`carried_loop_terms`): the loop's own work does not change with the context,
and the forward and draft times inside it scale as the micro-benchmarks at the new length do.

Verification of gamma + 1 tokens costs about one decode step while the forward is bound by
memory bandwidth (the weights are read once for all tokens); once B x (gamma + 1) tokens make it
compute-bound, C_ver(B, gamma) / T_target(B) rises. `memory_bound_until` is the largest measured
B where C_ver(B, 1) is still within 15 % of T_target(B).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ..domain import BatchCosts, Costs
from ..limits import check_count, check_gamma
from ..runtime.batch import BatchDrafter, batch_generate
from ..runtime.caches.modes import ExecutionContext
from ..runtime.caches.slots import SlotCache
from ..runtime.workloads import Case
from .batched import fill_slots
from .forward import calls_per_block, context_ids, no_gc, repeat_block, vocab_size
from .timing import interleaved, median, time_repeated

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from ..runtime.caches.rowcache import RowCache

MEMORY_BOUND_RATIO = 1.15


def _prefill_rows(kv: SlotCache | RowCache, vocab: int, context_len: int) -> None:
    for r in range(kv.rows):
        kv.prefill(r, context_ids(vocab, context_len, seed=1234 + r))


@torch.inference_mode()
def verify_surface_ms(
    target: PreTrainedModel,
    batch_size: int,
    context_len: int,
    max_gamma: int,
    repeats: int,
    ctx: ExecutionContext | None = None,
) -> list[float]:
    """[C_ver(B, 0) = T_target(B), C_ver(B, 1), .., C_ver(B, max_gamma)] in ms (medians)."""
    check_count(batch_size, "batch size")
    check_gamma(max_gamma, allow_zero=False, what="max_gamma")
    kv = (ctx or ExecutionContext()).row_kv(target, batch_size, context_len + max_gamma + 2)
    vocab = vocab_size(target)
    _prefill_rows(kv, vocab, context_len)
    held = kv.lengths.clone()
    device = str(kv.device)
    tokens = torch.tensor(
        [context_ids(vocab, max_gamma + 1, seed=99 + r) for r in range(batch_size)], device=kv.device
    )

    def forward(n: int) -> Callable[[], None]:
        counts = torch.full((batch_size,), n, dtype=torch.long, device=kv.device)

        def run() -> None:
            kv.forward(tokens[:, :n], counts)
            kv.truncate(held)  # every forward sees the same context

        return run

    sizes = list(range(1, max_gamma + 2))
    with no_gc():
        calls = {n: calls_per_block(time_repeated(forward(n), device, 1, warmup=1)[0]) for n in sizes}
        blocks = {n: (lambda r, b=repeat_block(forward(n), calls[n]): b()) for n in sizes}
        samples = interleaved(blocks, repeats, device)
    return [median([sec * 1e3 / calls[n] for sec, _ in samples[n]]) for n in sizes]


@torch.inference_mode()
def draft_cost_ms(drafter: BatchDrafter, vocab: int, context_len: int, repeats: int, gamma: int = 4) -> float:
    """ms per draft position for all rows of a batched drafter (one `propose` of gamma tokens per
    row, rolled back after every cycle so each sees the same context)."""
    kv = getattr(drafter, "kv", None)
    rows = drafter.rows
    seqs = {r: context_ids(vocab, context_len, seed=1234 + r) for r in range(rows)}
    for r, seq in seqs.items():
        drafter.start(r, seq)
    gammas = dict.fromkeys(seqs, gamma)
    proposed = [gamma]

    def cycle() -> None:
        out = drafter.propose(seqs, gammas, 0.0, 0.0, None)
        proposed[0] = max(1, max(d.numel() for d, _ in out.values()))
        for r, seq in seqs.items():
            drafter.commit(r, len(seq) - 1)  # back to the state `start` left

    device = str(kv.device) if kv is not None else "cpu"
    with no_gc():
        calls = calls_per_block(time_repeated(cycle, device, 1, warmup=1)[0])
        times = time_repeated(repeat_block(cycle, calls), device, repeats, warmup=0)
    return median(times) / calls / proposed[0]


class _BatchLoopClock:
    """Wall time of a real batched loop, and inside it the target's decode forwards and the
    drafter's proposals (one-row prefills, called with `logits_to_keep`, are left out)."""

    def __init__(self, target: PreTrainedModel, drafter: BatchDrafter | None, static: bool) -> None:
        self.target, self.drafter, self.static = target, drafter, static
        self.forward_ms = self.draft_ms = 0.0
        self.forwards = self.tokens = self.positions = 0

    def __enter__(self) -> _BatchLoopClock:
        if self.static:
            # The slot cache's forward is clocked, not the model's: patching the model inside a
            # compiled graph would recompile it and break the graph at the clock.
            self._slot_forward = slot_forward = SlotCache.forward
            target = self.target

            def clocked_slots(kv: SlotCache, tokens: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
                if kv.model is not target:
                    return slot_forward(kv, tokens, counts)
                t0 = time.perf_counter()
                out = slot_forward(kv, tokens, counts)
                self.forward_ms += (time.perf_counter() - t0) * 1e3
                self.forwards += 1
                self.tokens += int(tokens.shape[-1])
                return out

            SlotCache.forward = clocked_slots
        else:
            self._slot_forward = None
            forward = self.target.forward

            def clocked(*args: Any, **kwargs: Any) -> Any:
                if "logits_to_keep" in kwargs:
                    return forward(*args, **kwargs)
                t0 = time.perf_counter()
                out = forward(*args, **kwargs)
                self.forward_ms += (time.perf_counter() - t0) * 1e3
                self.forwards += 1
                self.tokens += int(kwargs["input_ids"].shape[-1])
                return out

            self.target.forward = clocked
        if self.drafter is not None:
            propose = self.drafter.propose

            def timed_propose(*args: Any, **kwargs: Any) -> Any:
                t0 = time.perf_counter()
                out = propose(*args, **kwargs)
                self.draft_ms += (time.perf_counter() - t0) * 1e3
                self.positions += max((d.numel() for d, _ in out.values()), default=0)
                return out

            self.drafter.propose = timed_propose
        return self

    def __exit__(self, *exc: object) -> None:
        if self._slot_forward is not None:
            SlotCache.forward = self._slot_forward
        else:
            del self.target.forward
        if self.drafter is not None:
            del self.drafter.propose


def loop_costs(
    target: PreTrainedModel,
    make_drafters: dict[str, Callable[[int], BatchDrafter]],
    case: Case,
    batch_size: int,
    gamma: int,
    repeats: int = 3,
    ctx: ExecutionContext | None = None,
) -> dict[str, Any]:
    """Costs clocked inside real closed-loop batched runs over `case` (plain, then each draft at
    `gamma`), after a warm-up, medians over `repeats` interleaved runs: what the micro-benchmarks
    miss (the loop's own work, refills included, and the draft and the target evicting each
    other's weights from the caches)."""
    ctx = ctx or ExecutionContext()
    drafters = {name: make(batch_size) for name, make in make_drafters.items()}
    warm = case.head(min(len(case.prompts), batch_size))
    batch_generate(target, None, warm, batch_size, 0, ctx=ctx)
    for d in drafters.values():
        batch_generate(target, d, warm, batch_size, gamma, ctx=ctx)
    samples: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        samples.setdefault(key, []).append(value)

    for r in range(repeats):
        order = [None, *drafters]
        for name in order if r % 2 == 0 else order[::-1]:
            drafter = drafters[name] if name is not None else None
            with _BatchLoopClock(target, drafter, ctx.static) as clock:
                t0 = time.perf_counter()
                g = gamma if drafter is not None else 0
                batch_generate(target, drafter, case, batch_size, g, ctx=ctx)
                wall = (time.perf_counter() - t0) * 1e3
            if not clock.forwards:
                continue
            if name is None:
                add("loop_overhead_ms", max(0.0, wall - clock.forward_ms) / clock.forwards)
                continue
            add(
                f"step_overhead_ms:{name}",
                max(0.0, wall - clock.forward_ms - clock.draft_ms) / clock.forwards,
            )
            add(f"loop_verify_ms:{name}", clock.forward_ms / clock.forwards)
            add(f"loop_verify_tokens:{name}", clock.tokens / clock.forwards)
            if clock.positions:
                add(f"loop_t_draft_ms:{name}", clock.draft_ms / clock.positions)
    out: dict[str, Any] = {
        "step_overhead_ms": {},
        "loop_verify_ms": {},
        "loop_verify_tokens": {},
        "loop_t_draft_ms": {},
    }
    for key, values in samples.items():
        field_name, _, name = key.partition(":")
        if name:
            out[field_name][name] = median(values)
        else:
            out[field_name] = median(values)
    return out


def measure_surface(
    target: PreTrainedModel,
    make_drafters: dict[str, Callable[[int], BatchDrafter]],
    batch_sizes: list[int],
    context_len: int,
    max_gamma: int,
    repeats: int = 3,
    progress: Callable[[str], None] | None = None,
    case: Case | None = None,
    ctx: ExecutionContext | None = None,
    carry: Costs | None = None,
) -> tuple[list[BatchCosts], int | None]:
    """The surface at each batch size, and the largest B that is still memory-bound. With `case`
    (the workload), each batch size above 1 also gets costs clocked inside real batched loops over
    it; with `carry` (the costs of an envelope's first length), a batch size whose loop terms were
    clocked there takes them from it instead (`carried_loop_terms`)."""
    carried = {c.batch_size: c for c in (carry.batch if carry else []) if c.loop_verify_ms}
    vocab = vocab_size(target)
    surface = []
    for b in sorted(set(batch_sizes)):
        if progress is not None:
            progress(f"cost surface at batch size {b}")
        curve = verify_surface_ms(target, b, context_len, max_gamma, repeats, ctx)
        drafts = {}
        for name, make in make_drafters.items():
            drafts[name] = draft_cost_ms(make(b), vocab, context_len, repeats, gamma=min(4, max_gamma))
        costs = BatchCosts(b, curve[0], curve[1:], drafts)
        if b in carried:
            carried_loop_terms(costs, carried[b], carry.context_len)
        elif case is not None and b > 1:
            # Enough requests that every slot is refilled at least once.
            prompts = fill_slots(case, 2 * b).prompts
            loop_case = Case(prompts, [min(32, max(case.max_new_tokens))] * len(prompts), case.eos, 0.0)
            for key, value in loop_costs(
                target, make_drafters, loop_case, b, min(4, max_gamma), ctx=ctx
            ).items():
                setattr(costs, key, value)
        surface.append(costs)
    bound = [s.batch_size for s in surface if s.verify_ms[0] <= MEMORY_BOUND_RATIO * s.t_target_ms]
    return surface, max(bound) if bound else None


def carried_loop_terms(costs: BatchCosts, measured: BatchCosts, context_len: int | None) -> None:
    """`measured`'s loop terms (clocked inside batched loops at another context length) on `costs`:
    the loop's own work per step as it was, the in-loop verification forward scaled as the
    micro-benchmark's C_ver at the same width, and the in-loop draft time as the micro T_draft."""
    costs.loop_overhead_ms = measured.loop_overhead_ms
    costs.step_overhead_ms = dict(measured.step_overhead_ms)
    costs.loop_verify_tokens = dict(measured.loop_verify_tokens)
    for name, ms in measured.loop_verify_ms.items():
        width = max(1, round(measured.loop_verify_tokens.get(name, 2.0) - 1))
        at = min(width, len(costs.verify_ms), len(measured.verify_ms)) - 1
        then, now = measured.verify_ms[at], costs.verify_ms[at]
        costs.loop_verify_ms[name] = ms * now / then if then > 0 else ms
    for name, ms in measured.loop_t_draft_ms.items():
        then, now = measured.t_draft_ms.get(name, 0.0), costs.t_draft_ms.get(name, 0.0)
        costs.loop_t_draft_ms[name] = ms * now / then if then > 0 and now > 0 else ms
    costs.loop_terms_from = context_len
