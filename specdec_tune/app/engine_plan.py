"""How `run --backend llamacpp` plans its measuring: the machine's noise and anchors from the plain
server's passes, and the trials and timeouts that fit the time budget (`s`: app.engine.EngineSession)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from ..checkpolicy import LLAMACPP_CHECK_POLICY
from ..domain import Anchors, Noise
from ..errors import SpecDecError
from ..measure.anchors import measure_twice
from ..measure.llamacpp.server import ServerError
from ..measure.noise import busy_info, measure_noise, os_since, os_snapshot, os_window
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
    # Each finalist is timed against its own plain passes (backend.measure: ABBA per config), and
    # the baseline alone: a quiet SmolLM2 final round of 3 x 5 repeats took 96 s at 2.44 s a pass,
    # where counting one plain pass per repeat for all of them planned 53 s.
    first_s = (
        finalists * (2 * settings.final_repeats * pass_s + TRIAL_OVERHEAD_S) + settings.final_repeats * pass_s
    )
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
    first trials measured; what that takes beyond the timeout comes out of the final round's
    racing. A quiet SmolLM2 run went 17 s over its 240 s budget before this."""
    if not settings.timeout_s or probe_trials <= 0:
        return settings
    floor = max(0, MIN_BUDGET_TRIALS - probe_trials) * probe_s / probe_trials
    left = settings.timeout_s - probe_s
    timeout = max(left, floor, 1e-3)  # never 0: a timeout of 0 means none at all (search.tuner)
    final = settings.final_budget_s
    if final is not None and timeout > left:  # the search's minimum runs over: racing gives it back
        final = max(0.0, final - (timeout - left))
    return replace(settings, timeout_s=timeout, final_budget_s=final)


def engine_busy(info: dict[str, Any], threads: int | None, cpus: int) -> bool:
    """Busy for llama.cpp with `threads` threads (measure.noise.busy_info by LLAMACPP_CHECK_POLICY):
    with its threads on every core it waits for any other work at every step, so other processes
    beyond the cores its threads leave free plus a tenth of all CPUs already make a busy machine."""
    return busy_info(info, LLAMACPP_CHECK_POLICY, threads=threads, cpus=cpus)


def load_hint(info: dict[str, Any], threads: int | None, cpus: int) -> str:
    """Why llama.cpp may crawl here, from what the OS said (measure.noise.os_since): "" on a quiet
    machine. Its threads wait for each other at every step, spinning: when one of them shares a
    core with other work, every step waits for it. On a 2-core VM with one core kept busy,
    SmolLM2-135M decoded 0.8 tokens/s with 2 threads and 167 with 1 (165 with 2 on the quiet VM)."""
    if not engine_busy(info, threads, cpus):
        return ""
    taken = (info.get("others_cpu_share") or 0.0) * cpus
    free = max(1, int(cpus - taken))
    n = threads or cpus
    words = (
        f"the machine is busy (other processes {info.get('others_cpu_share') or 0.0:.0%} of all {cpus} CPUs"
    )
    words += f", busiest: {info['busiest'][0]})" if info.get("busiest") else ")"
    if n > free:
        words += (
            f": llama.cpp's {n} threads wait for the one that shares a core with that work, at every "
            f"step; pass --threads {free} (the cores left free) or measure on a quiet machine"
        )
    return words


def oversubscribed_line(threads: int | None, watch_s: float = 0.5) -> str:
    """One line before measuring when other processes already take cores llama.cpp's threads need
    (watched for `watch_s` seconds while this process sleeps); "" otherwise."""
    _, info = os_window(lambda: time.sleep(watch_s))
    hint = load_hint(info, threads, os.cpu_count() or 1)
    return hint[:1].upper() + hint[1:] if "pass --threads" in hint else ""


@contextlib.contextmanager
def server_failures(threads: int | None) -> Iterator[None]:
    """A llama-server that dies or stops answering outside a trial (the plain server, the costs,
    the exactness check) ends the command with one line (SpecDecError), saying when the OS saw a
    busy machine meanwhile, not with an internal error."""
    snapshot = os_snapshot()
    try:
        yield
    except ServerError as exc:
        hint = load_hint(os_since(snapshot), threads, os.cpu_count() or 1)
        raise SpecDecError(f"{exc}" + (f"; {hint}" if hint else "")) from None
