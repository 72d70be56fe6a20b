"""What the decoding loops spend besides the models' forwards, (o_loop, o_step), and the clocks
that time forwards and proposals inside a real loop (`ForwardClock`, `LoopClock`); an
`OracleDrafter` makes every proposal accepted so a speculative step costs C_ver(γ) plus the loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ..limits import check_count, check_gamma
from ..runtime.caches.modes import ExecutionContext
from ..runtime.caches.slots import SlotCache
from ..runtime.decode import autoregressive_generate, speculative_generate
from ..runtime.drafting.drafters import Drafter
from ..runtime.models.devices import synchronize
from .forward import (
    check_context_fits,
    context_ids,
    model_device,
    no_gc,
    vocab_size,
)
from .timing import interleaved, median

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class OracleDrafter(Drafter):
    """Proposes a known continuation at no cost: with the target's own greedy output every token
    is accepted, so a speculative step costs C_ver(γ) plus the engine's own per-step overhead."""

    name = kind = "oracle"

    def __init__(self, full: list[int], device: torch.device | str = "cpu"):
        self.full = torch.tensor(full, dtype=torch.long, device=device)

    def propose(
        self,
        seq: list[int],
        gamma: int,
        threshold: float,
        temperature: float,
        generator: torch.Generator | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.full[len(seq) : len(seq) + gamma], None


class SlotClock:
    """Clocks `model`'s calls of the static slot cache (`SlotCache.forward`, `SlotCache.prefill`)
    instead of the model's forward: under the compiled engine that forward runs inside a compiled
    graph, and a clock patched onto it would be traced by dynamo, recompiling every graph inside
    the timed region (and breaking the graph at the clock). `on_call(ms, tokens, prefill)` after
    each call (as `surface._BatchLoopClock` does at B > 1)."""

    def __init__(
        self, model: PreTrainedModel, device: str, on_call: Callable[[float, int, bool], None]
    ) -> None:
        self.model, self.device, self.on_call = model, device, on_call

    def __enter__(self) -> SlotClock:
        forward, prefill = self._saved = SlotCache.forward, SlotCache.prefill
        model, device, on_call = self.model, self.device, self.on_call

        def timed(fn: Callable[[], Any], tokens: int, is_prefill: bool) -> Any:
            synchronize(device)
            t0 = time.perf_counter()
            out = fn()
            synchronize(device)
            on_call((time.perf_counter() - t0) * 1e3, tokens, is_prefill)
            return out

        def clocked_forward(kv: SlotCache, tokens: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
            if kv.model is not model:
                return forward(kv, tokens, counts)
            return timed(lambda: forward(kv, tokens, counts), int(tokens.shape[-1]), False)

        def clocked_prefill(kv: SlotCache, row: int, ids: list[int]) -> torch.Tensor:
            if kv.model is not model:
                return prefill(kv, row, ids)
            return timed(lambda: prefill(kv, row, ids), len(ids), True)

        SlotCache.forward, SlotCache.prefill = clocked_forward, clocked_prefill  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        SlotCache.forward, SlotCache.prefill = self._saved  # type: ignore[method-assign]


class ForwardClock:
    """Wraps `model.forward` to add up the wall time spent inside it (device synchronised); with
    `compiled`, the model's calls of its slot caches (`SlotClock`)."""

    def __init__(self, model: PreTrainedModel, device: str, compiled: bool = False):
        self.model, self.device, self.ms, self.calls = model, device, 0.0, 0
        self.slots = SlotClock(model, device, self._count) if compiled else None

    def _count(self, ms: float, tokens: int, prefill: bool) -> None:
        self.ms += ms
        self.calls += 1

    def __enter__(self) -> ForwardClock:
        if self.slots is not None:
            self.slots.__enter__()
            return self
        inner = self.model.forward

        def clocked(*args: Any, **kwargs: Any) -> Any:
            synchronize(self.device)
            t0 = time.perf_counter()
            out = inner(*args, **kwargs)
            synchronize(self.device)
            self.ms += (time.perf_counter() - t0) * 1e3
            self.calls += 1
            return out

        self.model.forward = clocked
        return self

    def __exit__(self, *exc: object) -> None:
        if self.slots is not None:
            self.slots.__exit__()
            return
        del self.model.forward  # the class's forward is visible again


class LoopClock:
    """Clocks inside a real speculative loop: each verification forward of the target (prefills,
    called with `logits_to_keep`, are left out) and each `propose` of the drafter.

    In the loop the two models alternate and evict each other's weights from the CPU caches, so
    they cost more than in a micro-benchmark that calls one of them hot and repeatedly.
    """

    def __init__(
        self, target: PreTrainedModel, drafter: Drafter, device: str, compiled: bool = False
    ) -> None:
        self.target, self.drafter, self.device = target, drafter, device
        self.verify_ms = self.draft_ms = 0.0
        self.verifies = self.verify_tokens = self.proposed = 0
        # compiled: the target's slot-cache calls are clocked, not its forward (see SlotClock)
        self.slots = SlotClock(target, device, self._verified) if compiled else None

    def _verified(self, ms: float, tokens: int, prefill: bool) -> None:
        if not prefill:
            self.verify_ms += ms
            self.verifies += 1
            self.verify_tokens += tokens

    @property
    def mean_verify_ms(self) -> float | None:
        return self.verify_ms / self.verifies if self.verifies else None

    @property
    def mean_verify_tokens(self) -> float | None:
        return self.verify_tokens / self.verifies if self.verifies else None

    @property
    def draft_ms_per_token(self) -> float | None:
        return self.draft_ms / self.proposed if self.proposed else None

    def __enter__(self) -> LoopClock:
        forward, propose = self.target.forward, self.drafter.propose

        def clocked_forward(*args: Any, **kwargs: Any) -> Any:
            if "logits_to_keep" in kwargs:
                return forward(*args, **kwargs)
            synchronize(self.device)
            t0 = time.perf_counter()
            out = forward(*args, **kwargs)
            synchronize(self.device)
            self.verify_ms += (time.perf_counter() - t0) * 1e3
            self.verifies += 1
            self.verify_tokens += int(kwargs["input_ids"].shape[-1])
            return out

        def clocked_propose(*args: Any, **kwargs: Any) -> Any:
            synchronize(self.device)
            t0 = time.perf_counter()
            out = propose(*args, **kwargs)
            synchronize(self.device)
            self.draft_ms += (time.perf_counter() - t0) * 1e3
            self.proposed += int(out[0].numel())
            return out

        self.drafter.propose = clocked_propose
        if self.slots is not None:
            self.slots.__enter__()
        else:
            self.target.forward = clocked_forward
        return self

    def __exit__(self, *exc: object) -> None:
        if self.slots is not None:
            self.slots.__exit__()
        else:
            del self.target.forward  # the classes' methods are visible again
        del self.drafter.propose


@torch.inference_mode()
def measure_loop_overheads_ms(
    target: PreTrainedModel,
    context_len: int,
    gamma: int,
    repeats: int,
    new_tokens: int = 40,
    ctx: ExecutionContext | None = None,
) -> tuple[float, float]:
    """What the decoding loops spend besides the target's forwards: (o_loop, o_step) in ms.

    Runs the plain loop and the speculative loop (with an `OracleDrafter`: every proposal is
    accepted and no draft model runs) for `new_tokens` tokens from a context of about
    `context_len`, timing the whole call and, inside it, every target forward. The wall time
    outside the forwards, per decode step, is the overhead: sampling, host syncs, tensor
    building, cache bookkeeping. Measuring both parts in the same call keeps machine drift out
    of the difference. Medians over `repeats`.
    """
    check_gamma(gamma, allow_zero=False)
    check_count(repeats, "repeats")
    check_count(new_tokens, "new_tokens")
    prompt_len = max(8, context_len - new_tokens // 2)
    check_context_fits(target, prompt_len, new_tokens + gamma + 1)
    prompt = context_ids(vocab_size(target), prompt_len)
    device = model_device(target)
    full = prompt + autoregressive_generate(target, prompt, new_tokens, ctx=ctx).tokens
    compiled = ctx is not None and ctx.compiled
    oracle = OracleDrafter(full, device)

    def clocked(generate: Callable[[], Any]) -> Callable[[int], tuple[int, float]]:
        def run(_r: int) -> tuple[int, float]:
            with ForwardClock(target, device, compiled) as clock:
                steps = generate().stats.target_forwards
            return steps, clock.ms

        return run

    runs = {
        "plain": clocked(lambda: autoregressive_generate(target, prompt, new_tokens, ctx=ctx)),
        "spec": clocked(
            lambda: speculative_generate(target, oracle, prompt, gamma, 0.0, 0.0, new_tokens, ctx=ctx)
        ),
    }
    with no_gc():
        for fn in runs.values():
            fn(0)  # warm-up
        timings = interleaved(runs, repeats, device)
    out = {
        k: [max(0.0, sec * 1e3 - forward_ms) / steps for sec, (steps, forward_ms) in v]
        for k, v in timings.items()
    }
    return median(out["plain"]), median(out["spec"])
