"""Hardware costs on the local device, gathered into a `profile.Costs` for the cost model: T_target,
C_ver(gamma), the decoding loops' own overheads, T_draft and acceptance per drafter, copy
bandwidth, matmul throughput, roofline share.
It only measures (never searches); every timing goes through `timing`, which synchronises the device.
"""

from __future__ import annotations

import contextlib
import gc
import math
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .drafters import Drafter, cache_kwarg, new_cache
from .engine import MAX_GAMMA, SpecStats, autoregressive_generate, speculative_generate
from .errors import SpecDecError
from .hardware import synchronize
from .measure import Case, run_pass
from .profile import Costs, DraftCosts
from .timing import median, spread, time_repeated, timed

# A timed sample is a block of calls lasting at least this long: single forwards of a small model
# take ~1 ms on a CPU, where scheduler noise alone would make their spread tens of percent.
MIN_BLOCK_MS = 25.0
MAX_CALLS_PER_BLOCK = 1000
CONTEXT_SEED = 1234


# ----------------------------------------------------------------------------- helpers


def _check_max_gamma(value: int, what: str = "max_gamma") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_GAMMA:
        raise SpecDecError(f"{what} must be an integer in 1..{MAX_GAMMA}, got {value!r}")


def _check_at_least_one(value: int, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecDecError(f"{what} must be an integer >= 1, got {value!r}")


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    # A full collection in the middle of a block is a multi-millisecond outlier (timeit does the same).
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _calls_per_block(one_call_ms: float) -> int:
    return max(1, min(MAX_CALLS_PER_BLOCK, math.ceil(MIN_BLOCK_MS / max(one_call_ms, 1e-3))))


def _repeat(fn: Callable[[], Any], calls: int) -> Callable[[], None]:
    def block() -> None:
        for _ in range(calls):
            fn()

    return block


def _model_device(model: Any) -> str:
    return str(next(model.parameters()).device)


def _vocab_size(model: Any) -> int:
    return int(model.get_input_embeddings().weight.shape[0])


def _context_ids(vocab: int, n: int, seed: int = CONTEXT_SEED) -> list[int]:
    """Seeded random token ids: attention cost depends on the context length, not its content."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def _check_context_fits(model: Any, context_len: int, new_tokens: int) -> None:
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit and context_len + new_tokens > limit:
        raise SpecDecError(
            f"context_len {context_len} + {new_tokens} new tokens exceeds the model's "
            f"max_position_embeddings ({limit}): pass a smaller --context-len or max_gamma"
        )


def _warm_cache(model: Any, context_len: int, extra: int) -> tuple[Any, dict[str, Any], list[int]]:
    """A KV cache prefilled with `context_len` seeded random tokens, and `extra` further ids to feed."""
    _check_at_least_one(context_len, "context_len")
    _check_context_fits(model, context_len, extra)
    ids = _context_ids(_vocab_size(model), context_len + extra)
    cache = new_cache(model)
    kw = {cache_kwarg(model): cache, "use_cache": True}
    x = torch.tensor([ids[:context_len]], dtype=torch.long, device=next(model.parameters()).device)
    model(input_ids=x, logits_to_keep=1, **kw)
    return cache, kw, ids[context_len:]


def _forward_samples_ms(
    model: Any, cache: Any, kw: dict[str, Any], new_ids: list[int], sizes: list[int], repeats: int
) -> list[list[float]]:
    """Per-forward ms of one forward over n new tokens on the warm `cache`, `repeats` samples per n.

    Sizes are interleaved within each repeat, so a drift of the machine hits all of them alike. After
    each forward the cache is cropped back, so every forward sees the same context and the cache
    ends at the length it started with.
    """
    device = _model_device(model)
    inputs = {n: torch.tensor([new_ids[:n]], dtype=torch.long, device=device) for n in sizes}

    def forward(n: int) -> Callable[[], None]:
        def run() -> None:
            model(input_ids=inputs[n], **kw)
            cache.crop(-n)

        return run

    calls = {}
    for n in sizes:  # warm-up and calibration of the block length in one
        calls[n] = _calls_per_block(time_repeated(forward(n), device, 1, warmup=1)[0])
    samples: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(repeats):
        for n in sizes:
            ms = time_repeated(_repeat(forward(n), calls[n]), device, 1, warmup=0)[0]
            samples[n].append(ms / calls[n])
    return [samples[n] for n in sizes]


def _forward_curve_ms(model: Any, context_len: int, sizes: list[int], repeats: int) -> list[list[float]]:
    _check_at_least_one(repeats, "repeats")
    with _no_gc():
        cache, kw, new_ids = _warm_cache(model, context_len, max(sizes))
        return _forward_samples_ms(model, cache, kw, new_ids, sizes, repeats)


def _decode_weight_bytes(model: Any) -> int:
    """Bytes of weights one decode step reads: all of them, except the input embedding table (one
    row is gathered) unless it is tied to the LM head, which reads it whole."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    if head is None or head.weight is not embedding:
        total -= embedding.numel() * embedding.element_size()
    return total


# ----------------------------------------------------------------------------- micro-benchmarks


@torch.inference_mode()
def measure_copy_bandwidth_gbps(device: str, mib: int = 256, repeats: int = 5) -> tuple[float, float]:
    """Device memory bandwidth from a large device-to-device copy: (median GB/s, relative spread).

    Bytes read plus bytes written per copy, over the copy's time.
    """
    _check_at_least_one(mib, "mib")
    _check_at_least_one(repeats, "repeats")
    n = mib * 2**20 // 4
    # Filled, not torch.empty: untouched pages all map to one zero page and read from cache.
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.zeros(n, dtype=torch.float32, device=device)
    with _no_gc():
        times_ms = time_repeated(lambda: dst.copy_(src), device, repeats, warmup=1)
    moved = 2 * src.numel() * src.element_size()
    rates = [moved / (ms / 1e3) / 1e9 for ms in times_ms]
    return median(rates), spread(rates)


@torch.inference_mode()
def measure_matmul_tflops(device: str, dtype: Any, n: int | None = None, repeats: int = 5) -> float:
    """Dense matmul throughput 2n³ / time in TFLOP/s (n: 1024 on CPU, 8192 on CUDA by default)."""
    _check_at_least_one(repeats, "repeats")
    if n is None:
        n = 8192 if str(device).startswith("cuda") else 1024
    _check_at_least_one(n, "n")
    # Made on the device: 2 x 8192² random numbers from the host take longer than the benchmark.
    a = torch.rand(n, n, device=device, dtype=dtype)
    b = torch.rand(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    with _no_gc():
        times_ms = time_repeated(lambda: torch.matmul(a, b, out=out), device, repeats, warmup=1)
    return 2 * n**3 / (median(times_ms) / 1e3) / 1e12


# ----------------------------------------------------------------------------- model costs


@torch.inference_mode()
def measure_t_target_ms(model: Any, context_len: int, repeats: int) -> tuple[float, float]:
    """One-token decode latency on a warm KV cache of `context_len` tokens: (median ms, spread)."""
    (samples,) = _forward_curve_ms(model, context_len, [1], repeats)
    return median(samples), spread(samples)


@torch.inference_mode()
def measure_verify_curve_ms(
    model: Any, context_len: int, max_gamma: int, repeats: int
) -> tuple[list[float], float]:
    """C_ver(gamma): one target forward over gamma + 1 tokens on a warm cache, gamma = 1..max_gamma.

    Returns the curve (index 0 is gamma 1) and the worst relative spread over it.
    """
    _check_max_gamma(max_gamma)
    samples = _forward_curve_ms(model, context_len, list(range(2, max_gamma + 2)), repeats)
    return [median(s) for s in samples], max(spread(s) for s in samples)


@torch.inference_mode()
def measure_t_draft_ms(drafter: Drafter, seq: list[int], repeats: int, gamma: int = 4) -> float:
    """Milliseconds per proposed token: `propose(gamma)` + `commit` cycles after `seq` is prefilled.

    Each cycle feeds one new token (as the engine feeds the target's bonus token) and drafts from
    there; `commit(len(seq))` rolls the draft back, so every cycle sees the same context. A drafter
    that proposes nothing (prompt lookup without a match) is charged its overhead per call.
    """
    if not seq:
        raise SpecDecError("measuring a drafter needs a non-empty context")
    _check_at_least_one(repeats, "repeats")
    _check_max_gamma(gamma, "gamma")
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

    with _no_gc():
        calls = _calls_per_block(time_repeated(cycle, device, 1, warmup=1)[0])
        times_ms = time_repeated(_repeat(cycle, calls), device, repeats, warmup=0)
    return median(times_ms) / calls / max(1, proposed)


class OracleDrafter(Drafter):
    """Proposes a known continuation at no cost: with the target's own greedy output every token
    is accepted, so a speculative step costs C_ver(γ) plus the engine's own per-step overhead."""

    name = kind = "oracle"

    def __init__(self, full: list[int], device: Any = "cpu"):
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


class _ForwardClock:
    """Wraps `model.forward` to add up the wall time spent inside it (device synchronised)."""

    def __init__(self, model: Any, device: str):
        self.model, self.device, self.ms, self.calls = model, device, 0.0, 0

    def __enter__(self) -> _ForwardClock:
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
        del self.model.forward  # the class's forward is visible again


@torch.inference_mode()
def measure_loop_overheads_ms(
    target: Any, context_len: int, gamma: int, repeats: int, new_tokens: int = 40
) -> tuple[float, float]:
    """What the decoding loops spend besides the target's forwards: (o_loop, o_step) in ms.

    Runs the plain loop and the speculative loop (with an `OracleDrafter`: every proposal is
    accepted and no draft model runs) for `new_tokens` tokens from a context of about
    `context_len`, timing the whole call and, inside it, every target forward. The wall time
    outside the forwards, per decode step, is the overhead: sampling, host syncs, tensor
    building, cache bookkeeping. Measuring both parts in the same call keeps machine drift out
    of the difference. Medians over `repeats`.
    """
    _check_max_gamma(gamma, "gamma")
    _check_at_least_one(repeats, "repeats")
    _check_at_least_one(new_tokens, "new_tokens")
    prompt_len = max(8, context_len - new_tokens // 2)
    _check_context_fits(target, prompt_len, new_tokens + gamma + 1)
    prompt = _context_ids(_vocab_size(target), prompt_len)
    device = _model_device(target)
    full = prompt + autoregressive_generate(target, prompt, new_tokens).tokens
    oracle = OracleDrafter(full, device)
    runs = {
        "plain": lambda: autoregressive_generate(target, prompt, new_tokens).stats.target_forwards,
        "spec": lambda: (
            speculative_generate(target, oracle, prompt, gamma, 0.0, 0.0, new_tokens).stats.target_forwards
        ),
    }
    out: dict[str, list[float]] = {k: [] for k in runs}
    with _no_gc():
        for fn in runs.values():
            fn()  # warm-up
        for r in range(repeats):
            for k in runs if r % 2 == 0 else list(runs)[::-1]:
                with _ForwardClock(target, device) as clock:
                    sec, steps = timed(runs[k], device)
                out[k].append(max(0.0, sec * 1e3 - clock.ms) / steps)
    return median(out["plain"]), median(out["spec"])


def _pad(values: list[float], length: int) -> list[float]:
    values = list(values[:length])
    return values + [values[-1] if values else 0.0] * (length - len(values))


@torch.inference_mode()
def acceptance_vector(
    target: Any, drafter: Drafter, case: Case, max_gamma: int, max_steps: int | None = None
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
    _check_max_gamma(max_gamma)
    if max_steps is not None:
        _check_at_least_one(max_steps, "max_steps")
    stats = SpecStats()
    for prompt, budget in zip(case.prompts, case.max_new_tokens, strict=True):
        _, s = run_pass(target, drafter, max_gamma, 0.0, Case([prompt], [budget], case.eos, temperature=0.0))
        stats.add(s)
        if max_steps is not None and stats.target_forwards >= max_steps:
            break
    return _pad(stats.effective_acceptance, max_gamma), stats.acceptance_rate, stats


def default_context_len(case: Case) -> int:
    """Median prompt length + half the median max_new_tokens: the typical mid-generation context."""
    prompt = statistics.median(len(p) for p in case.prompts)
    new = statistics.median(case.max_new_tokens)
    return max(16, round(prompt + new / 2))


# ----------------------------------------------------------------------------- all together


@torch.inference_mode()
def profile_costs(
    target: Any,
    drafters: dict[str, Drafter],
    case: Case,
    device: str,
    max_gamma: int = 16,
    repeats: int = 5,
    context_len: int | None = None,
    with_bandwidth: bool = True,
    progress: Callable[[str, float], None] | None = None,
    acceptance_tokens: int = 64,
    acceptance_steps: int | None = 256,
) -> Costs:
    """Measure every field of `Costs` for `target` and each drafter on `device`.

    Acceptance vectors come from one greedy pass over `case` with each prompt's budget capped at
    `acceptance_tokens`, stopping after the prompt that reaches `acceptance_steps` verifications.
    T_target, C_ver and T_draft use a seeded random context of `context_len` tokens.
    `with_bandwidth=False` skips the synthetic micro-benchmarks (copy bandwidth, matmul
    throughput). `progress(label, fraction_done)` is called before each stage and once with 1.0
    at the end.
    """
    _check_max_gamma(max_gamma)
    _check_at_least_one(repeats, "repeats")
    _check_at_least_one(acceptance_tokens, "acceptance_tokens")
    if acceptance_steps is not None:
        _check_at_least_one(acceptance_steps, "acceptance_steps")
    if context_len is None:
        context_len = default_context_len(case)
    _check_at_least_one(context_len, "context_len")
    _check_context_fits(target, context_len, max_gamma + 1)

    stages: list[tuple[str, float]] = []  # (label, rough share of the time)
    if with_bandwidth:
        stages += [("memory bandwidth", 1.0), ("matmul throughput", 1.0)]
    stages.append((f"target forward + verification curve (γ 1..{max_gamma})", 3.0))
    stages.append(("decoding-loop overheads", 2.0))
    for name in drafters:
        stages += [(f"draft cost: {name}", 1.0), (f"acceptance: {name}", 4.0)]
    total = sum(w for _, w in stages)
    done = 0.0
    step = iter(stages)

    def next_stage() -> None:
        nonlocal done
        label, weight = next(step)
        if progress is not None:
            progress(label, done / total)
        done += weight

    copy_gbps = tflops = None
    if with_bandwidth:
        next_stage()
        copy_gbps, _ = measure_copy_bandwidth_gbps(device, repeats=repeats)
        next_stage()
        tflops = measure_matmul_tflops(device, next(target.parameters()).dtype, repeats=repeats)

    next_stage()
    # T_target (1 token) and C_ver (gamma + 1 tokens) in one interleaved loop: same drift for all.
    samples = _forward_curve_ms(target, context_len, list(range(1, max_gamma + 2)), repeats)
    t_target_ms, t_target_spread = median(samples[0]), spread(samples[0])
    verify_ms = [median(s) for s in samples[1:]]
    verify_spread = max(spread(s) for s in samples[1:])
    next_stage()
    loop_overhead_ms, step_overhead_ms = measure_loop_overheads_ms(
        target, context_len, min(4, max_gamma), repeats
    )

    vocab = min(
        [_vocab_size(target)] + [_vocab_size(d.model) for d in drafters.values() if hasattr(d, "model")]
    )
    context = _context_ids(vocab, context_len)
    budgets = [min(m, acceptance_tokens) for m in case.max_new_tokens]
    capped = Case(case.prompts, budgets, case.eos, case.temperature)
    draft_costs = []
    for name, drafter in drafters.items():
        next_stage()
        t_draft_ms = measure_t_draft_ms(drafter, context, repeats, gamma=min(4, max_gamma))
        next_stage()
        vector, alpha, _ = acceptance_vector(target, drafter, capped, max_gamma, acceptance_steps)
        draft_costs.append(DraftCosts(name, t_draft_ms, t_draft_ms / t_target_ms, alpha, vector))

    decode_gbps = _decode_weight_bytes(target) * (1000.0 / t_target_ms) / 1e9
    if progress is not None:
        progress("done", 1.0)
    return Costs(
        t_target_ms=t_target_ms,
        t_target_spread=t_target_spread,
        verify_ms=verify_ms,
        verify_spread=verify_spread,
        context_len=context_len,
        drafts=draft_costs,
        copy_bandwidth_gbps=copy_gbps,
        decode_bandwidth_gbps=decode_gbps,
        roofline_share=decode_gbps / copy_gbps if copy_gbps else None,
        matmul_tflops=tflops,
        loop_overhead_ms=loop_overhead_ms,
        step_overhead_ms=step_overhead_ms,
    )
