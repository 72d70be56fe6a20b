"""The costs that decide gamma, measured inside vLLM's plain server: T_target (ms per decode token,
from the engine's own decode time) and C_ver(gamma) (one forward over gamma + 1 new tokens after a
cached prefix: vLLM's prefix cache holds whole blocks, so the prefix is cut to a block boundary and
the request's prefill time is the forward over exactly gamma + 1 tokens). Acceptance, and a draft
model's cost, come from the measured trials (the engine model, search.enginemodel).

At each batch size B > 1 of the run, the same forward for B rows at once (`batch_costs`): B such
requests sent together, so that the scheduler runs them in one step of B x (gamma + 1) tokens, their
mean prefill time the step's. Kept raw, as the engine measured it (`Costs.batch`: C_ver(B, 0) is one
new token a row): what the engine model reads of it is the slope, the cost of one more drafted token
verified at B against B = 1's (search.enginepredictor.BatchedPredictor, which says what it
explains: on a 2-core CPU, little of what speculation loses at B > 1).
"""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...domain import BatchCosts, Costs, DraftCosts
from ...measure.llamacpp.cases import TextCase
from ...measure.llamacpp.costs import interpolated_curve
from ...measure.timing import median, spread
from .measuring import DECODE_S, VllmBackend
from .server import VllmServer, counters_since

PREFILL_S = "vllm:request_prefill_time_seconds_sum"
GAMMAS = (1, 2, 4)  # C_ver measured at these and at max_gamma; the rest interpolated


def block_size(server: VllmServer) -> int:
    """The KV cache's block size (vLLM's `cache_config_info`), 16 when the server does not say."""
    _, text = server.call("GET", "/metrics", None, timeout_s=30.0)
    m = re.search(r'cache_config_info\{[^}]*block_size="(\d+)"', text if isinstance(text, str) else "")
    return int(m.group(1)) if m else 16


def decode_ms(server: VllmServer, case: TextCase, passes: int = 3) -> tuple[float, float]:
    """ms per plain decode token over `case` (after one untimed pass), median of `passes`, and its
    spread: the engine's decode time over the tokens after each reply's first."""
    per = []
    for i in range(passes + 1):
        ms, n = 0.0, 0
        for prompt, budget in zip(case.prompts, case.max_new_tokens, strict=True):
            c0 = server.counters()
            reply = server.complete(prompt, budget, 0.0)
            d = counters_since(c0, server.counters())
            ms += 1000.0 * d.get(DECODE_S, 0.0)
            n += max(0, reply["n"] - 1)
        if i > 0 and n > 0:
            per.append(ms / n)
    return median(per), spread(per)


def verify_curve_ms(
    server: VllmServer, prompt: list[int], max_gamma: int, repeats: int = 3
) -> tuple[list[float], float]:
    """C_ver(gamma) for gamma = 1..max_gamma: ms of the prefill of gamma + 1 tokens after a cached
    prefix of whole blocks, median of `repeats`, measured at GAMMAS and max_gamma, the rest
    interpolated linearly; and the worst relative spread."""
    points, worst = _prefill_points(server, prompt, _measured_gammas(max_gamma), repeats, 1)
    return interpolated_curve(points, max_gamma), worst


def batch_costs(
    server: VllmServer, prompt: list[int], batch_size: int, max_gamma: int, repeats: int = 3
) -> BatchCosts:
    """C_ver(B, gamma) for gamma = 0..max_gamma with `batch_size` rows sent together (module
    docstring), raw: C_ver(B, 0) as `t_target_ms`, gamma = 1..max_gamma as `verify_ms`."""
    points, _ = _prefill_points(server, prompt, [0, *_measured_gammas(max_gamma)], repeats, batch_size)
    return BatchCosts(
        batch_size, points[0], interpolated_curve({g: v for g, v in points.items() if g > 0}, max_gamma)
    )


def _measured_gammas(max_gamma: int) -> list[int]:
    return sorted({g for g in GAMMAS if g < max_gamma} | {max_gamma})


def _prefill_points(
    server: VllmServer, prompt: list[int], gammas: list[int], repeats: int, batch_size: int
) -> tuple[dict[int, float], float]:
    """{gamma: median ms of the prefill of gamma + 1 new tokens after the cached prefix, mean over
    `batch_size` requests sent together}, and the worst relative spread over the repeats."""
    block = block_size(server)
    whole = (len(prompt) - 1) // block * block
    if whole < block:  # too short to hold a block: pad with its own tokens
        prompt = (prompt * (block // max(1, len(prompt)) + 2))[: block + max(gammas) + 1]
        whole = block
    prefix, extra = prompt[:whole], (prompt[whole:] + prompt)[: max(gammas) + 1]
    server.complete(prefix, 1, 0.0)  # caches the prefix
    points: dict[int, float] = {}
    worst = 0.0
    for gamma in gammas:
        samples = []
        for r in range(repeats):
            # a last token that differs per request, repeat and batch size (B^2 x repeats: past every
            # smaller B's), so the new tokens never fill a block another request cached
            first = batch_size * batch_size * repeats
            tails = [
                [*extra[:gamma], (extra[gamma] + first + r * batch_size + j + 1) % 1000 + 10]
                for j in range(batch_size)
            ]
            samples.append(_mean_prefill_ms(server, [prefix + t for t in tails]))
        points[gamma] = median(samples)
        worst = max(worst, spread(samples))
    return points, worst


def _mean_prefill_ms(server: VllmServer, prompts: list[list[int]]) -> float:
    """The engine's mean prefill ms over `prompts`, one token generated each, sent together (released
    at once from a barrier, one client thread each) where there are several."""
    c0 = server.counters()
    if len(prompts) == 1:
        server.complete(prompts[0], 1, 0.0)
    else:
        start = threading.Barrier(len(prompts))

        def send(prompt: list[int]) -> dict[str, Any]:
            start.wait()
            return server.complete(prompt, 1, 0.0)

        with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            list(pool.map(send, prompts))
    return 1000.0 * counters_since(c0, server.counters()).get(PREFILL_S, 0.0) / len(prompts)


def measure_costs(
    backend: VllmBackend,
    case: TextCase,
    specs: list[Any],
    max_gamma: int,
    repeats: int = 3,
    batch_sizes: list[int] | None = None,
) -> Costs:
    """The engine's costs over `case` (its first prompt's length for C_ver), and C_ver(B, gamma) at
    each of `batch_sizes` above one. A prefill runs another path than a decode step (chunked
    prefill, its own scheduling), so C_ver's shape over gamma is kept, anchored at C_ver(1) =
    T_target, as for llama.cpp; the raw curve is kept beside it."""
    plain = backend.server(None)
    backend.settle(plain)  # a config's server that ran last has let go of the core
    t_target, t_spread = decode_ms(plain, case, passes=3)
    raw, v_spread = verify_curve_ms(plain, list(case.prompts[0]), max_gamma, repeats)
    verify = [t_target * v / raw[0] for v in raw] if raw and raw[0] > 0 else raw
    costs = Costs(
        t_target, t_spread, verify, v_spread, len(case.prompts[0]), engine_mode="engine", verify_raw_ms=raw
    )
    costs.batch = [
        batch_costs(plain, list(case.prompts[0]), b, max_gamma, repeats)
        for b in sorted(set(batch_sizes or []))
        if b > 1
    ]
    for s in specs:
        # an n-gram lookup runs on the host between forwards; a draft model's cost is fitted from trials
        costs.drafts.append(DraftCosts(s.name, 0.0, 0.0, 0.0, [], acceptance_source="unknown"))
    return costs
