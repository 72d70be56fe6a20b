"""`check`: re-measure a stored profile on this machine and judge it against what it promised
(speedup, acceptance, the batch table, the engine), with repeats where the noise needs them.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path
from typing import Any

from ..atomic import atomic_write_text
from ..backends.base import checks_in_session
from ..checkpolicy import CHECK_POLICY, CheckPolicy, policy_for
from ..errors import OtherHardwareError, SpecDecError
from ..limits import MAX_BATCH_SIZE, MAX_REPEATS, check_count
from ..measure import anchors as machine_anchors
from ..measure import noise
from ..measure.anchors import faster, measure_twice
from ..output.anchors import anchor_verdict, other_hardware_message, rate_scale_for
from ..output.check import (
    CheckReport,
    Evidence,
    confirm_repeats,
    judge,
    judge_config,
    needs_confirmation,
    reference_of,
    speedup_floor,
    weights_item,
)
from ..output.environment import classify
from ..output.junit import junit_xml
from ..output.rates import per_anchor_of
from ..runtime.models.loading import content_hash_like
from ..search.policymodel import policy_drafter
from ..store.yamlio import load_profile
from .check_envelope import check_cells
from .check_session import check_in_session
from .common import check_writable
from .profile_models import measure_best, open_profile_models
from .reference import decode_anchor_of, record_reference


def check(
    path: Path,
    device: str = "auto",
    tolerance: float = CHECK_POLICY.tolerance,
    acceptance_tolerance: float | None = None,
    repeats: int = 3,
    *,
    allow_other_hardware: bool = False,
    junit: Path | None = None,
    batch_size: int | None = None,
    models_root: Path | None = None,
    backend: str | None = None,
    llama_server: str | None = None,
    allow_other_build: bool = False,
) -> CheckReport:
    """Re-measure a stored profile's best config here and judge it against what it stored; with a
    batch table, every row at its batch size (only `batch_size`'s row when given). With
    `models_root` (or SPECDEC_MODELS_ROOT) the profile may load only what app.confine allows.
    The thresholds are the backend's CheckPolicy (checkpolicy.policy_for).

    Raises OtherHardwareError (CLI exit 3) on other hardware unless allowed: another slug, or
    the machine anchors (copy, matmul; plain decoding in older profiles) far slower or faster than
    the profile's on a quiet machine (output.anchors); when they agree, tokens/s is judged too. A speedup
    not clearly passing is measured again (with the repeats its noise needs) and judged on all
    repeats together; too noisy to tell is `report.inconclusive` (CLI exit 6).
    """
    started = time.monotonic()
    p = load_profile(path)
    engine = (p.backend or {}).get("name") or "native"
    if backend is not None and backend != engine:
        raise SpecDecError(f"{path} was measured with the {engine} backend, not {backend}: drop --backend")
    policy = policy_for(engine)
    if checks_in_session(engine):  # each config in its own server, confirmed in the session
        check_count(repeats, "--repeats")
        report = check_in_session(
            p, path, tolerance=tolerance, acceptance_tolerance=acceptance_tolerance, repeats=repeats,
            allow_other_hardware=allow_other_hardware, allow_other_build=allow_other_build,
            batch_size=batch_size, policy=policy, server=llama_server,
        )  # fmt: skip
        if batch_size is None and p.context_table:
            report.items += check_cells(
                p, path, tolerance=tolerance, acceptance_tolerance=acceptance_tolerance, repeats=repeats,
                policy=policy, server=llama_server,
            )  # fmt: skip
        if junit is not None:
            atomic_write_text(junit, junit_xml(report))
        return report
    speedup_floor(p, tolerance)  # a bad --tolerance fails before any model loads
    check_count(repeats, "--repeats", high=MAX_REPEATS)
    rows = [r for r in p.batch_table if batch_size is None or r.batch_size == batch_size]
    if batch_size is not None:
        check_count(batch_size, "--batch-size", high=MAX_BATCH_SIZE)
        if not rows:
            sizes = ", ".join(str(r.batch_size) for r in p.batch_table) or "none (run --batch-sizes)"
            raise SpecDecError(f"{path} has no batch table row for batch size {batch_size}; it has: {sizes}")
    if junit is not None:
        check_writable(junit)
    s, spec = open_profile_models(p, path, device, models_root, rows, allow_other_hardware)
    weights = content_hash_like(p.target.content_hash, s.target.path)
    settings = dict(
        tolerance=tolerance, acceptance_tolerance=acceptance_tolerance, repeats=repeats, policy=policy
    )
    if batch_size is None:
        report = check_best(
            p, path, s, spec, weights, allow_other_hardware=allow_other_hardware, models_root=models_root,
            **settings,
        )  # fmt: skip
        # The best config is the batch size 1 answer; the table's other rows follow.
        others = [r for r in rows if r.batch_size != 1]
        report.items += judge_batch_rows(
            p, str(path), s, others, weights, with_weights=False, **settings
        ).items
        if p.batch_table:
            report.config += f" + batch sizes {', '.join(str(r.batch_size) for r in p.batch_table)}"
        if p.context_table:
            report.items += check_cells(
                p,
                path,
                device=device,
                **settings,  # type: ignore[arg-type]
            )
            report.config += f" + context lengths {', '.join(sorted({str(r.context_length) for r in p.context_table}, key=int))}"
    else:
        report = judge_batch_rows(p, str(path), s, rows, weights, **settings)
        report.config = f"batch size {batch_size}: {rows[0].best.config.label}"
    report.seconds = time.monotonic() - started
    if junit is not None:
        atomic_write_text(junit, junit_xml(report))
    return report


def check_best(
    p: Any,
    path: Path,
    s: Any,
    spec: Any,
    weights: str,
    *,
    tolerance: float,
    acceptance_tolerance: float | None,
    repeats: int,
    allow_other_hardware: bool,
    models_root: Path | None,
    policy: CheckPolicy,
) -> CheckReport:
    """The evidence for the profile's best config (the measurement with the machine anchors around
    it and the OS watching, the anchors again before "other hardware", a confirmation where the
    first did not clearly pass) and its report (output.check.judge)."""
    from ..runtime.drafting.build import build_drafter

    cfg = p.best.config
    drafter = policy_drafter(build_drafter(spec, s.target.model, s.draft_modules, s.ctx), cfg, p.costs)
    # The plain rate is judged per decode-anchor step where the reference has that ratio.
    anchor = decode_anchor_of(p, s.device) if p.anchors and p.anchors.has_anchor_reference else None
    # The machine anchors (copy, matmul) before and after the measurement (output.anchors).
    (machine, m), os_noise, busy_seen = noise.busy_window(
        lambda: measure_twice(s.device, lambda: measure_best(s, drafter, cfg, repeats, anchor))
    )
    env = classify(os_noise, policy, busy_seen=busy_seen)
    verdict = anchor_verdict(p, m.metrics.baseline_tokens_per_s, machine, env.busy, policy)
    if verdict.other_hardware and not allow_other_hardware:
        # Before calling it other hardware, the anchors again, spaced out (the policy's
        # `anchor_retries`): the faster of each is kept.
        machine, busy_again = anchors_again(s.device, machine, policy)
        env = classify(os_noise, policy, busy_seen=env.busy or busy_again)
        verdict = anchor_verdict(p, m.metrics.baseline_tokens_per_s, machine, env.busy, policy)
    if verdict.other_hardware and not allow_other_hardware:
        raise OtherHardwareError(other_hardware_message(path, verdict))
    moved = getattr(machine, "drift", 0.0)
    scale = (
        rate_scale_for(p, verdict, machine) if env.quiet else 1.0
    )  # the load's rates are not judged anyway
    first = Evidence(
        p.best, m, temperature=p.workload.temperature, environment=env, judge_rates=verdict.judge_rates,
        rate_scale=scale, reference=reference_of(p),
    )  # fmt: skip
    again = None
    if needs_confirmation(first, tolerance, policy):
        # Fresh processes where the reference came from fresh processes (app.reference): a
        # sample of the same kind; an older profile's final round came from one process.
        fresh, fresh_busy = [], False
        if first.reference:
            fresh, fresh_busy = confirm_in_fresh_processes(
                path, s.device, models_root, machine, busy=env.busy, policy=policy
            )
        if fresh:
            # one sample per process: its repeats share one process's speed (`confirm_processes`)
            m, again = per_process(m), merged(m, fresh)
            env = classify(os_noise, policy, busy_seen=env.busy or fresh_busy)
        else:  # no fresh process measured: again in this one
            # Busy: the load, not the noise, moved the result, and more repeats under it only
            # resolve the load's level; one more look at the same length is enough to pass.
            n = repeats if env.busy else confirm_repeats(m, repeats, policy)
            again = measure_best(s, drafter, cfg, n, anchor, seed=1)
    # The machine's own speed moved while this check measured (a shared host's neighbours): a drop
    # of the absolute rates is then inconclusive; the plain rate per decode-anchor step, in which
    # the host's speed cancels, is still judged, and so is the speedup (output.environment).
    env = classify(os_noise, policy, busy_seen=env.busy, drift=moved, drift_cancels=bool(m.plain_per_anchor))
    evidence = dataclasses.replace(first, measured=m, again=again, environment=env)
    report = judge(
        p, str(path), evidence, weights, tolerance, acceptance_tolerance=acceptance_tolerance, policy=policy
    )
    report.noise = {**os_noise, "busy": env.busy, "anchor_drift": round(moved, 4)}
    if verdict.slowdown is not None:
        report.anchors = {**verdict.as_dict(), "rate_scale": round(scale, 4)}
    if anchor is not None and m.plain_per_anchor:  # [the reference's median, this check's]
        ref, now = p.anchors.reference_plain_per_anchor, per_anchor_of(m, again)
        report.anchors["plain_per_anchor"] = [
            round(statistics.median(ref), 5),
            round(statistics.median(now), 5),
        ]
    return report


def anchors_again(device: str, machine: Any, policy: CheckPolicy = CHECK_POLICY) -> tuple[Any, bool]:
    """The machine anchors measured the policy's `anchor_retries` more times, `anchor_gap_s` apart,
    each watched by the OS: the faster of each anchor over all of them (the drift within the check
    kept), and whether any window found other work."""
    busy = False
    for _ in range(policy.anchor_retries):
        time.sleep(policy.anchor_gap_s)
        again, _, window_busy = noise.busy_window(lambda: machine_anchors.machine_speed(device))
        busy = busy or window_busy
        machine = dataclasses.replace(faster(machine, again), drift=getattr(machine, "drift", 0.0))
    return machine, busy


def confirm_in_fresh_processes(
    path: Path,
    device: str,
    models_root: Path | None,
    machine: Any,
    *,
    busy: bool = False,
    policy: CheckPolicy = CHECK_POLICY,
) -> tuple[list[dict[str, Any]], bool]:
    """The profile's best config against plain decoding in the policy's `confirm_processes` fresh
    processes, measured as this check measured (app.reference): their results, with each one's
    rates put at this process's matmul speed (so `rate_scale` applies alike), and whether any found
    the machine busy (a left-out process, or one that saw other work). `busy`: this check's own
    measurement saw other work; then `busy_confirm_processes` confirm and a busy one is not replaced."""
    import functools
    import os
    import subprocess

    import torch

    env = dict(os.environ)
    if models_root is not None:
        env["SPECDEC_MODELS_ROOT"] = str(models_root)
    run = functools.partial(subprocess.run, env=env)
    kept, note = record_reference(
        path, policy.busy_confirm_processes if busy else policy.confirm_processes,
        threads=torch.get_num_threads(), run=run, device=device, what="confirming process",
        extra=0 if busy else policy.extra_processes, policy=policy,
    )  # fmt: skip
    here = getattr(machine, "matmul_gflops", None)
    for k in kept:
        theirs = k.get("matmul_gflops")
        if here and theirs:
            k["tokens_per_s"] *= here / theirs
            k["baseline_tokens_per_s"] *= here / theirs
    return kept, "other work" in note


def per_process(m: Any) -> Any:
    """A measurement as one sample: its medians (its repeats share one process's speed)."""
    x = m.metrics
    per_anchor = [statistics.median(m.plain_per_anchor)] if m.plain_per_anchor else []
    return dataclasses.replace(
        m, speedups=[x.speedup], rates=[x.tokens_per_s], baseline_rates=[x.baseline_tokens_per_s],
        plain_per_anchor=per_anchor,
    )  # fmt: skip


def merged(m: Any, fresh: list[dict[str, Any]]) -> Any:
    """The fresh processes' medians as one measurement beside `m` (`again` of output.check)."""
    speedups = [k["speedup"] for k in fresh]
    rates = [k["tokens_per_s"] for k in fresh]
    base = [k["baseline_tokens_per_s"] for k in fresh]
    metrics = dataclasses.replace(
        m.metrics,
        speedup=statistics.median(speedups),
        tokens_per_s=statistics.median(rates),
        baseline_tokens_per_s=statistics.median(base),
    )
    per_anchor = [k["plain_per_anchor"] for k in fresh if k.get("plain_per_anchor")]
    return dataclasses.replace(
        m, metrics=metrics, speedups=speedups, rates=rates, baseline_rates=base, processes=len(fresh),
        plain_per_anchor=per_anchor if len(per_anchor) == len(fresh) else [],
    )  # fmt: skip


def judge_batch_rows(
    p: Any,
    path: str,
    s: Any,
    rows: list[Any],
    weights: str,
    *,
    tolerance: float,
    acceptance_tolerance: float | None,
    repeats: int,
    with_weights: bool = True,
    policy: CheckPolicy = CHECK_POLICY,
) -> CheckReport:
    """Each batch table row re-measured at its batch size (closed loop) and judged; items are
    named with the batch size (e.g. "speedup @ B=4"). A speedup not clearly passing is measured again."""
    from ..measure.batched import measure_batched
    from ..measure.bench import measure
    from ..runtime.drafting.build import build_drafter

    report = CheckReport(profile=path, config="")
    if with_weights:
        report.items.append(weights_item(p.target.content_hash, weights))
    for row in rows:
        cfg, b = row.best.config, row.batch_size
        spec = next((d for d in s.specs if d.name == cfg.draft.name), cfg.draft)

        def once(seed: int, spec: Any = spec, cfg: Any = cfg, b: int = b, repeats: int = repeats) -> Any:
            if b == 1:
                drafter = policy_drafter(
                    build_drafter(spec, s.target.model, s.draft_modules, s.ctx), cfg, p.costs
                )
                return measure(
                    s.target.model, drafter, cfg.gamma, cfg.threshold, s.case, repeats, seed=seed, ctx=s.ctx
                )
            make = lambda: policy_drafter(  # noqa: E731
                build_drafter(spec, s.target.model, s.draft_modules, s.ctx, rows=b), cfg, p.costs, b
            )
            return measure_batched(
                s.target.model, make, cfg.gamma, cfg.threshold, s.case, b, repeats, seed=seed, ctx=s.ctx
            )

        m, os_noise, busy_seen = noise.busy_window(lambda once=once: once(0))
        # not quiet: a drop is the load's (output.check.speedup_item)
        env = classify(os_noise, policy, busy_seen=busy_seen)
        e = Evidence(row.best, m, temperature=p.workload.temperature, environment=env, where=f" @ B={b}")
        if needs_confirmation(e, tolerance, policy):
            e = dataclasses.replace(e, again=once(1, repeats=confirm_repeats(m, repeats, policy)))
        report.items += judge_config(e, tolerance, acceptance_tolerance=acceptance_tolerance, policy=policy)
    return report
