"""The costs that decide gamma, measured inside llama-server: T_target (ms per plain decode token,
from the server's timings), C_ver(gamma) (one forward over gamma + 1 new tokens on a warm context:
prompt processing of gamma + 1 tokens after a cached prefix), T_draft of each draft GGUF (its own
plain decode ms per token) and, from measured trials, each draft's acceptance. The cost model of
`search.costmodel` takes them as it takes our own engine's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...domain import Costs, DraftCosts
from ..timing import median, spread
from .backend import LlamaCppBackend, TextCase
from .server import LlamaServer

NGRAM_DRAFT_MS = 0.0  # an n-gram lookup runs on the host between forwards: no forward of its own
CARRIED_GAMMAS = (1, 2, 4, 8)  # C_ver measured at a carried length, besides max_gamma


def verify_curve_ms(
    server: LlamaServer,
    context_ids: list[int],
    max_gamma: int,
    repeats: int = 3,
    gammas: list[int] | None = None,
) -> tuple[list[float], float]:
    """C_ver(gamma) for gamma = 1..max_gamma: ms to process gamma + 1 tokens after `context_ids`
    (cached), median of `repeats`; and the worst relative spread over the curve. With `gammas`
    (1 and max_gamma among them) only those are measured and the rest interpolated linearly."""
    points: dict[int, float] = {}
    worst = 0.0
    extra = context_ids[-(max_gamma + 1) :]
    for gamma in sorted(set(gammas or range(1, max_gamma + 1)) | {1, max_gamma}):
        samples = []
        for _ in range(repeats + 1):  # the first only warms the cache at the prefix
            server.post("/completion", {"prompt": context_ids, "n_predict": 1, "cache_prompt": True})
            data = server.post(
                "/completion",
                {"prompt": context_ids + extra[: gamma + 1], "n_predict": 1, "cache_prompt": True},
            )
            t = data.get("timings") or {}
            if int(t.get("prompt_n", 0)) >= 1:
                samples.append(float(t["prompt_ms"]) * (gamma + 1) / int(t["prompt_n"]))
        samples = samples[1:] or samples
        points[gamma] = median(samples)
        worst = max(worst, spread(samples))
    return interpolated_curve(points, max_gamma), worst


def interpolated_curve(points: dict[int, float], max_gamma: int) -> list[float]:
    """A curve over gamma = 1..max_gamma through `points` (linear between measured gammas; gamma 1
    among them); vLLM's cost pass draws its curves with it too."""
    known = sorted(points)
    out = []
    for g in range(1, max_gamma + 1):
        lo = max(k for k in known if k <= g)
        hi = min(k for k in known if k >= g)
        w = 0.0 if hi == lo else (g - lo) / (hi - lo)
        out.append(points[lo] + w * (points[hi] - points[lo]))
    return out


def decode_ms(
    server: LlamaServer,
    case: TextCase,
    passes: int = 2,
    restore: Callable[[LlamaServer, str], None] | None = None,
) -> tuple[float, float]:
    """ms per plain decode token of `server` over `case` (every budget generated: EOS ignored),
    median of `passes` after one untimed warm-up, and its spread.

    Prompt by prompt, each sent `passes` + 1 times in a row with the prompt cache on (after
    `restore` puts its state in the slot, when given): the prompt is processed at most once and
    every timed pass decodes only. Decode time does not depend on how the prompt got into the cache,
    and at a long context a prefill costs several passes."""
    ms = [0.0] * passes
    n = [0] * passes
    for prompt, budget in zip(case.prompts, case.max_new_tokens, strict=True):
        if restore is not None:
            restore(server, prompt)
        body = {"prompt": prompt, "n_predict": budget, "temperature": 0.0, "ignore_eos": True}
        for i in range(passes + 1):
            t = server.post("/completion", {**body, "cache_prompt": True}).get("timings") or {}
            if i > 0:
                ms[i - 1] += float(t.get("predicted_ms", 0.0))
                n[i - 1] += int(t.get("predicted_n", 0))
    per = [m / k for m, k in zip(ms, n, strict=True) if k > 0]
    return median(per), spread(per)


def measure_engine_costs(
    backend: LlamaCppBackend,
    case: TextCase,
    drafts: dict[str, str | None],
    max_gamma: int,
    repeats: int = 3,
    carried: bool = False,
) -> Costs:
    """The engine's costs: `drafts` maps each draft name to its GGUF (None for n-gram drafts).
    C_ver is measured after the case's first prompt (its own length, so at a long context it is
    the verification at that length; its state restored, not processed again). Acceptance is
    filled in later from measured trials (`with_acceptance`). `carried`: a longer context length
    of an envelope, whose costs only carry the first length's model there (search.enginepredictor
    reads T_target and C_ver's slope): C_ver at CARRIED_GAMMAS, the rest interpolated, and T_target
    over two passes, not three."""
    plain = backend.plain(1)
    t_target, t_spread = decode_ms(plain, case, passes=2 if carried else 3, restore=backend.restore)
    prompt = case.prompts[0]
    ids = plain.post("/tokenize", {"content": prompt, "add_special": True})["tokens"]
    backend.restore(plain, prompt)
    gammas = [g for g in CARRIED_GAMMAS if g < max_gamma] if carried else None
    pp, v_spread = verify_curve_ms(plain, ids, max_gamma, repeats, gammas)
    # Prompt processing runs another path than a decode step (its own graph and per-request
    # work), so its absolute times are not a step's: its shape over gamma is kept, anchored at
    # C_ver(1) = T_target (verifying two tokens costs one memory-bound decode step).
    verify = [t_target * v / pp[0] for v in pp] if pp and pp[0] > 0 else pp
    costs = Costs(t_target, t_spread, verify, v_spread, len(ids), engine_mode="llamacpp", verify_raw_ms=pp)
    for name, path in drafts.items():
        if path is None:
            t_draft = NGRAM_DRAFT_MS
        else:
            server = LlamaServer(
                backend.binary, ["-m", path, "-c", str(backend.context), "--no-webui"], backend.threads
            )
            try:
                server.start()
                t_draft, _ = decode_ms(server, case, passes=1)
            finally:
                server.stop()
        costs.drafts.append(
            DraftCosts(name, t_draft, t_draft / t_target, 0.0, [], acceptance_source="unknown")
        )
    return costs


def with_acceptance(costs: Costs, measured: dict[str, tuple[float, float, float]], max_gamma: int) -> Costs:
    """Each draft's acceptance from trials measured in the engine: {name: (alpha, tau, tokens/s)}.
    llama.cpp reports totals only, so the acceptance vector is i.i.d. at the measured alpha."""
    for d in costs.drafts:
        if d.name not in measured:
            continue
        alpha = measured[d.name][0]
        alpha = min(max(alpha, 1e-3), 0.999)
        d.acceptance_rate = alpha
        d.acceptance_vector = [alpha] * max_gamma
        d.acceptance_source = "measured"
    return costs


def draft_paths(backend: LlamaCppBackend, specs: list[Any]) -> dict[str, str | None]:
    """Each draft's GGUF for T_draft (a hybrid's model part; None: an n-gram lookup)."""
    out: dict[str, str | None] = {}
    for s in specs:
        if s.kind in ("model", "layer_skip", "hybrid"):
            out[s.name] = backend.draft_paths.get(s.name) or s.path
        else:
            out[s.name] = None
    return out
