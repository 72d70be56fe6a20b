"""How `run --backend llamacpp` plans its measuring: the machine's noise and anchors from the plain
server's passes, and the trials and timeouts that fit the time budget (`s`: app.engine.EngineSession)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from ..domain import Anchors, Noise
from ..measure.anchors import measure_twice
from ..measure.noise import measure_noise
from ..measure.timing import median
from ..search.space import DEFAULT_TRIALS, TuneSettings
from .common import MIN_BUDGET_TRIALS, NOISE_PASSES

TRIAL_OVERHEAD_S = 1.5  # a server start-up and its warm-up request


def engine_noise_and_anchors(s: Any) -> tuple[Noise, Anchors]:
    """The plain server's passes (batch size 1) timed while watching the OS: the machine's noise,
    and its anchors (the server's plain decode tokens/s; copy bandwidth and a small matmul rate,
    measure.anchors, as `check --backend llamacpp` measures them). Each pass covers 1/NOISE_PASSES
    of the prompts after an untimed one that fills the server's prompt cache; `plain_pass_s` is
    scaled up to the whole workload. The server is a child of this process, so the OS's "other
    processes" never count it."""
    share = s.case.head(max(1, -(-len(s.case.prompts) // NOISE_PASSES)))
    plain = s.backend.plain(1)
    s.backend._pass(plain, share, 1)
    rates: list[float] = []

    def plain_pass() -> float:
        t0 = time.perf_counter()
        rates.append(s.backend._pass(plain, share, 1)["tok_s"])
        return time.perf_counter() - t0

    machine, noise = measure_twice("cpu", lambda: measure_noise(plain_pass, NOISE_PASSES))
    full_s = noise.plain_pass_s * sum(s.case.max_new_tokens) / max(1, sum(share.max_new_tokens))
    noise = replace(noise, plain_pass_s=round(full_s, 5))
    return noise, Anchors(round(median(rates), 3), machine.copy_bandwidth_gbps, machine.matmul_gflops)


def fit_engine_budget(
    s: Any, settings: TuneSettings, budget_s: float, pass_s: float | None = None
) -> tuple[TuneSettings, str]:
    """Trials that fit the budget. A plain pass takes `pass_s` (else one is timed, after one that
    fills the server's prompt cache, as a config's untimed first pass does); a speculative pass is
    planned as long as a plain one (in llama.cpp on a CPU speculation gains tens of percent, not
    times). A trial costs a server start, a warm-up pass and 2 x repeats passes; the final round
    (at least two finalists and the baseline) and its racing rounds get what the search's minimum
    leaves, up to twice the first round. When even that minimum does not fit, the note says the
    run will go over."""
    if pass_s is None:
        plain = s.backend.plain(settings.batch_size)
        s.backend._pass(plain, s.case, settings.batch_size)  # the first pass fills the prompt cache
        t0 = time.monotonic()
        s.backend._pass(plain, s.case, settings.batch_size)
        pass_s = time.monotonic() - t0
    trial_s = (2 * settings.repeats + 1) * pass_s + TRIAL_OVERHEAD_S
    finalists = max(2, settings.finalists) if settings.finalists else 0
    first_s = (finalists + 1) * settings.final_repeats * pass_s + finalists * TRIAL_OVERHEAD_S
    search_min_s = MIN_BUDGET_TRIALS * trial_s
    final_s = min(2 * first_s, max(first_s, budget_s - search_min_s)) if finalists else 0.0
    fits = int((budget_s - final_s) // trial_s) if trial_s > 0 else DEFAULT_TRIALS
    trials = max(MIN_BUDGET_TRIALS, min(DEFAULT_TRIALS, fits))
    timeout = max(budget_s - final_s, search_min_s)
    note = f"B={settings.batch_size}: one plain pass {pass_s:.3g} s in llama.cpp, so {trials} trials"
    least_s = search_min_s + first_s
    if least_s > budget_s:  # a slow or busy machine: said, not hidden behind a cut final round
        note += (
            f"; the least a search does ({MIN_BUDGET_TRIALS} trials"
            + (" and the final round's first pass" if finalists else "")
            + f", about {least_s:.0f} s) is more than the {max(budget_s, 0.0):.0f} s left, so expect it to run over"
        )
    final_budget = final_s if finalists else None
    return replace(settings, trials=trials, timeout_s=timeout, final_budget_s=final_budget), note


def after_probe(settings: TuneSettings, probe_s: float, probe_trials: int) -> TuneSettings:
    """The search's timeout once the first trials (one per draft, which feed the cost model) took
    `probe_s`: they are part of the search, so their time comes out of it. The rest of the search
    still gets what the least a search does needs (MIN_BUDGET_TRIALS in all), at the pace the
    first trials measured. A quiet SmolLM2 run went 17 s over its 240 s budget before this."""
    if not settings.timeout_s or probe_trials <= 0:
        return settings
    floor = max(0, MIN_BUDGET_TRIALS - probe_trials) * probe_s / probe_trials
    # Never 0: a timeout of 0 means none at all (search.tuner).
    return replace(settings, timeout_s=max(settings.timeout_s - probe_s, floor, 1e-3))
