"""Micro-benchmarks of the device and of single forwards: copy bandwidth, matmul throughput, and
the cost of one forward over n new tokens on a warm KV cache (T_target, C_ver(gamma)).

A timed sample is a block of calls lasting at least MIN_BLOCK_MS: single forwards of a small
model take ~1 ms on a CPU, where scheduler noise alone would make their spread tens of percent.
"""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from ..errors import SpecDecError
from ..limits import check_count
from ..runtime.caches.modes import ExecutionContext, SeqCache
from .timing import interleaved, median, spread, time_repeated

if TYPE_CHECKING:
    from transformers import PreTrainedModel

MIN_BLOCK_MS = 25.0
MAX_CALLS_PER_BLOCK = 1000
CONTEXT_SEED = 1234


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    # A full collection in the middle of a block is a multi-millisecond outlier (timeit does the same).
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def calls_per_block(one_call_ms: float) -> int:
    return max(1, min(MAX_CALLS_PER_BLOCK, math.ceil(MIN_BLOCK_MS / max(one_call_ms, 1e-3))))


def repeat_block(fn: Callable[[], Any], calls: int) -> Callable[[], None]:
    def block() -> None:
        for _ in range(calls):
            fn()

    return block


def model_device(model: PreTrainedModel) -> str:
    return str(next(model.parameters()).device)


def vocab_size(model: PreTrainedModel) -> int:
    return int(model.get_input_embeddings().weight.shape[0])


def context_ids(vocab: int, n: int, seed: int = CONTEXT_SEED) -> list[int]:
    """Seeded random token ids: attention cost depends on the context length, not its content."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def check_context_fits(model: PreTrainedModel, context_len: int, new_tokens: int) -> None:
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit and context_len + new_tokens > limit:
        raise SpecDecError(
            f"context_len {context_len} + {new_tokens} new tokens exceeds the model's "
            f"max_position_embeddings ({limit}): use shorter prompts or --max-new-tokens, or a smaller --max-gamma"
        )


def warm_cache(
    model: PreTrainedModel, context_len: int, extra: int, ctx: ExecutionContext | None = None
) -> tuple[SeqCache, list[int]]:
    """A KV cache (under `ctx`'s engine mode, default eager) prefilled with `context_len` seeded random tokens,
    and `extra` further ids to feed."""
    check_count(context_len, "context_len")
    check_context_fits(model, context_len, extra)
    ids = context_ids(vocab_size(model), context_len + extra)
    cache = (ctx or ExecutionContext()).seq_cache(model, context_len + extra + 1)
    cache.prefill(ids[:context_len])
    return cache, ids[context_len:]


def forward_samples_ms(
    model: PreTrainedModel, cache: SeqCache, new_ids: list[int], sizes: list[int], repeats: int
) -> list[list[float]]:
    """Per-forward ms of one forward over n new tokens on the warm `cache`, `repeats` samples per n.

    Sizes are interleaved (`timing.interleaved`), so a drift of the machine hits all of them alike. After
    each forward the cache is cropped back, so every forward sees the same context and the cache
    ends at the length it started with.
    """
    device = model_device(model)
    inputs = {n: torch.tensor([new_ids[:n]], dtype=torch.long, device=device) for n in sizes}

    def forward(n: int) -> Callable[[], None]:
        def run() -> None:
            cache.forward(inputs[n])
            cache.crop(n)

        return run

    calls = {}
    for n in sizes:  # warm-up and calibration of the block length in one
        calls[n] = calls_per_block(time_repeated(forward(n), device, 1, warmup=1)[0])
    blocks = {n: (lambda r, b=repeat_block(forward(n), calls[n]): b()) for n in sizes}
    samples = interleaved(blocks, repeats, device)
    return [[sec * 1e3 / calls[n] for sec, _ in samples[n]] for n in sizes]


@torch.inference_mode()
def forward_curve_ms(
    model: PreTrainedModel,
    context_len: int,
    sizes: list[int],
    repeats: int,
    ctx: ExecutionContext | None = None,
) -> list[list[float]]:
    """Per-forward ms of one forward over n new tokens after `context_len` cached tokens, for each
    n in `sizes` (interleaved), `repeats` samples each: T_target is n = 1, C_ver(gamma) is n = gamma + 1."""
    check_count(repeats, "repeats")
    with no_gc():
        cache, new_ids = warm_cache(model, context_len, max(sizes), ctx)
        return forward_samples_ms(model, cache, new_ids, sizes, repeats)


def decode_weight_bytes(model: PreTrainedModel) -> int:
    """Bytes of weights one decode step reads: all of them, except the input embedding table (one
    row is gathered) unless it is tied to the LM head, which reads it whole."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    if head is None or head.weight is not embedding:
        total -= embedding.numel() * embedding.element_size()
    return total


@torch.inference_mode()
def measure_copy_bandwidth_gbps(device: str, mib: int = 256, repeats: int = 5) -> tuple[float, float]:
    """Device memory bandwidth from a large device-to-device copy: (median GB/s, relative spread).

    Bytes read plus bytes written per copy, over the copy's time.
    """
    check_count(mib, "mib")
    check_count(repeats, "repeats")
    n = mib * 2**20 // 4
    # Filled, not torch.empty: untouched pages all map to one zero page and read from cache.
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.zeros(n, dtype=torch.float32, device=device)
    with no_gc():
        times_ms = time_repeated(lambda: dst.copy_(src), device, repeats, warmup=1)
    moved = 2 * src.numel() * src.element_size()
    rates = [moved / (ms / 1e3) / 1e9 for ms in times_ms]
    return median(rates), spread(rates)


@torch.inference_mode()
def measure_matmul_tflops(device: str, dtype: torch.dtype, n: int | None = None, repeats: int = 5) -> float:
    """Dense matmul throughput 2n³ / time in TFLOP/s (n: 1024 on CPU, 8192 on CUDA by default)."""
    check_count(repeats, "repeats")
    if n is None:
        n = 8192 if str(device).startswith("cuda") else 1024
    check_count(n, "n")
    # Made on the device: 2 x 8192² random numbers from the host take longer than the benchmark.
    a = torch.rand(n, n, device=device, dtype=dtype)
    b = torch.rand(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    with no_gc():
        times_ms = time_repeated(lambda: torch.matmul(a, b, out=out), device, repeats, warmup=1)
    return 2 * n**3 / (median(times_ms) / 1e3) / 1e12
