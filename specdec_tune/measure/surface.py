"""The cost surface over batch sizes: C_ver(B, gamma) for gamma = 0..Gamma (gamma 0 is the plain
decode step T_target(B)) and T_draft(B) per draft, with B rows at the workload's mid-generation
context length, through the batched engine's own caches and forwards.

Verification of gamma + 1 tokens costs about one decode step while the forward is bound by
memory bandwidth (the weights are read once for all tokens); once B x (gamma + 1) tokens make it
compute-bound, C_ver(B, gamma) / T_target(B) rises. `memory_bound_until` is the largest measured
B where C_ver(B, 1) is still within 15 % of T_target(B).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..domain import BatchCosts
from ..limits import check_count, check_gamma
from ..runtime.batch import BatchDrafter
from ..runtime.rowcache import RowCache
from .forward import calls_per_block, context_ids, no_gc, repeat_block, vocab_size
from .timing import interleaved, median, time_repeated

MEMORY_BOUND_RATIO = 1.15


def _prefill_rows(kv: Any, vocab: int, context_len: int) -> None:
    for r in range(kv.rows):
        kv.prefill(r, context_ids(vocab, context_len, seed=1234 + r))


@torch.inference_mode()
def verify_surface_ms(
    target: Any, batch_size: int, context_len: int, max_gamma: int, repeats: int
) -> list[float]:
    """[C_ver(B, 0) = T_target(B), C_ver(B, 1), .., C_ver(B, max_gamma)] in ms (medians)."""
    check_count(batch_size, "batch size")
    check_gamma(max_gamma, allow_zero=False, what="max_gamma")
    kv = RowCache(target, batch_size)
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
    rows = kv.rows if kv is not None else len(getattr(drafter, "lookups", [None]))
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


def measure_surface(
    target: Any,
    make_drafters: dict[str, Callable[[int], BatchDrafter]],
    batch_sizes: list[int],
    context_len: int,
    max_gamma: int,
    repeats: int = 3,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[BatchCosts], int | None]:
    """The surface at each batch size, and the largest B that is still memory-bound."""
    vocab = vocab_size(target)
    surface = []
    for b in sorted(set(batch_sizes)):
        if progress is not None:
            progress(f"cost surface at batch size {b}")
        curve = verify_surface_ms(target, b, context_len, max_gamma, repeats)
        drafts = {}
        for name, make in make_drafters.items():
            drafts[name] = draft_cost_ms(make(b), vocab, context_len, repeats, gamma=min(4, max_gamma))
        surface.append(BatchCosts(b, curve[0], curve[1:], drafts))
    bound = [s.batch_size for s in surface if s.verify_ms[0] <= MEMORY_BOUND_RATIO * s.t_target_ms]
    return surface, max(bound) if bound else None
