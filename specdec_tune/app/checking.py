"""`check`: re-measure a stored profile on this machine and judge it against what it promised
(speedup, acceptance, exactness, the rates, the batch table, the envelope, the engine build).

One pipeline for every backend: open the profile's engine (`open_stored`, a measuring session),
gather the evidence through the session (`measure`, the machine anchors around the first row, the
OS watching), and let the session's `CheckPolicy` give the verdict (output.check). What differs
between engines is a value of the session: its `policy`, its `busy_rule` and `threads`, and how a
doubtful drop is confirmed (`fresh_reference`: in fresh processes, app.reference, where the profile
has a reference measured there; else in the session).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from pathlib import Path
from typing import Any

from ..atomic import atomic_write_text
from ..backends.base import CheckSession, Purpose
from ..checkpolicy import CHECK_POLICY, CheckPolicy, on_slice
from ..errors import OtherHardwareError, SpecDecError
from ..limits import MAX_REPEATS, check_count
from ..measure import anchors as machine_anchors
from ..measure import narrow, noise
from ..measure.anchors import faster, measure_twice
from ..measure.hardware import machine_id
from ..output.anchors import anchor_verdict, other_hardware_message, rate_scale_for
from ..output.check import (
    CheckItem,
    CheckReport,
    Evidence,
    confirm_repeats,
    judge_config,
    needs_confirmation,
    speedup_floor,
    weights_item,
)
from ..output.environment import classify
from ..output.junit import junit_xml
from ..output.rates import per_anchor_of
from ..output.references import reference_of
from ..store.yamlio import load_profile
from .check_envelope import check_cells
from .check_rows import (
    Judging,
    check_slice,
    in_session,
    looked_again,
    row_items,
    row_reference,
    stored_divergence,
    stored_rows,
    where_of,
)
from .common import check_writable
from .profile_models import open_stored, refuse_other_build, stored_models
from .reference import record_reference


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
    server: str | None = None,
    allow_other_build: bool = False,
) -> CheckReport:
    """Re-measure a stored profile's best config here, in the engine that measured it, and judge it
    against what it stored; with a batch table, every row at its batch size (only `batch_size`'s row
    when given); with an envelope, every cell those do not cover. With `models_root` (or
    SPECDEC_MODELS_ROOT) the profile may load only what app.confine allows. The thresholds are the
    session's CheckPolicy.

    Raises OtherHardwareError (CLI exit 3) on other hardware unless allowed: another slug, or the
    machine anchors (copy, matmul; plain decoding in older profiles) far slower or faster than the
    profile's on a quiet machine (output.anchors); and on another engine build unless
    `allow_other_build`. `server`: an engine backend's server binary (default: its extra's). A speedup not clearly passing is measured again (with the repeats its noise
    needs) and judged on all repeats together; too noisy to tell is `report.inconclusive` (exit 6).
    """
    started = time.monotonic()
    p = load_profile(path)
    if backend is not None and backend != p.backend.name:
        raise SpecDecError(
            f"{path} was measured with the {p.backend.name} backend, not {backend}: drop --backend"
        )
    speedup_floor(p, tolerance)  # a bad --tolerance fails before any engine starts
    check_count(repeats, "--repeats", high=MAX_REPEATS)
    rows = stored_rows(p, path, batch_size)
    if junit is not None:
        check_writable(junit)
    drafts = [r.config.draft for _, r in rows if r.config.gamma > 0]
    where = check_slice(p, device)
    try:
        models = stored_models(
            p, path, drafts, device=device, server=server, models_root=models_root,
            threads=where.threads if where is not None else None,
        )  # fmt: skip
        refuse_other_build(p, path, models, allow_other_build)
        anchored = p.anchors is not None and p.anchors.has_anchor_reference
        purpose = Purpose(
            "check",
            batch_size=rows[0][0],
            costs=p.costs,
            decode_anchor=p.anchors.decode_anchor if anchored else None,
        )
        # A reference measured on this very machine (`specdec-tune reference`) is judged here,
        # whatever hardware the search ran on.
        with open_stored(
            p, path, models, purpose, allow_other_hardware=allow_other_hardware or same_machine(p),
            slug_threads=where.threads_before if where is not None else None,
        ) as s:  # fmt: skip
            policy = on_slice(s.policy) if where is not None else s.policy
            j = Judging(tolerance, acceptance_tolerance, repeats, policy, same_machine(p), where is not None)
            report = CheckReport(profile=str(path), config=p.best.config.label)
            report.items.append(weights_item(p.target.content_hash, s.content_hash(p.target.content_hash)))
            judge_rows(
                p,
                path,
                s,
                rows,
                j,
                report,
                allow_other_hardware=allow_other_hardware,
                models_root=models_root,
            )
        if batch_size is not None:
            report.config = f"batch size {batch_size}: {rows[0][1].config.label}"
        else:
            if p.batch_table:
                report.config += f" + batch sizes {', '.join(str(r.batch_size) for r in p.batch_table)}"
            if p.context_table:
                if where is not None:  # the envelope's cells have no reference on the slice: as stored
                    narrow.release(where)
                cells_j = dataclasses.replace(j, sliced=False, policy=s.policy)
                report.items += check_cells(p, path, cells_j, device=device, server=server)
                lengths = sorted({r.context_length for r in p.context_table})
                report.config += f" + context lengths {', '.join(map(str, lengths))}"
        report.seconds = time.monotonic() - started
        if junit is not None:
            atomic_write_text(junit, junit_xml(report))
        return report
    finally:  # the Python API's caller gets its cores back
        if where is not None:
            narrow.release(where)


def judge_rows(
    p: Any,
    path: Path,
    s: CheckSession,
    rows: list[tuple[int, Any]],
    j: Judging,
    report: CheckReport,
    *,
    allow_other_hardware: bool,
    models_root: Path | None,
) -> None:
    """Each stored row re-measured in session `s` and judged into `report`: the first with the
    machine anchors around it (`first_row`), the others as they are (app.check_rows). An engine that
    stops answering on a busy machine (llama.cpp's threads spin-wait for a busy core) cannot be
    judged: inconclusive, as any speedup drop there; on a quiet one it is an error of the setup."""
    by_name = {d.name: d for d in s.specs}
    snapshot, current = noise.os_snapshot(), rows[0]
    try:
        for i, (b, r) in enumerate(rows):
            current = (b, r)
            config = dataclasses.replace(r.config, draft=by_name.get(r.config.draft.name, r.config.draft))
            if i == 0:
                items, ratio = first_row(
                    p, path, s, b, r, config, j, report, allow_other_hardware=allow_other_hardware,
                    models_root=models_root,
                )  # fmt: skip
                report.items += items
                j = dataclasses.replace(j, machine_ratio=ratio)  # the other rows are judged alike
            else:
                report.items += row_items(
                    s, r, config, b, j, p.workload.temperature, where_of(b), row_reference(p, b, j)
                )
    except SpecDecError:  # the user's input or other hardware: said as it is
        raise
    except Exception as exc:
        info = noise.os_since(snapshot)
        hint = s.failure_hint(exc, info)
        if hint is None:
            raise
        if not hint:
            raise SpecDecError(str(exc)) from None
        b, r = current
        report.noise = {**info, "busy": True}
        note = f"not measured, the server did not answer: {hint}; inconclusive: the machine was busy"
        report.items.append(CheckItem(f"speedup{where_of(b)}", r.metrics.speedup, None, True, note, True))


def first_row(
    p: Any,
    path: Path,
    s: CheckSession,
    b: int,
    stored: Any,
    config: Any,
    j: Judging,
    report: CheckReport,
    *,
    allow_other_hardware: bool,
    models_root: Path | None,
) -> tuple[list[CheckItem], float | None]:
    """The items of the first row (the best, at batch size 1 unless `--batch-size`): the measurement
    with the machine anchors before and after it and the OS watching, the anchors again before
    "other hardware", and a confirmation where the first did not clearly pass (in fresh processes
    where the session's `fresh_reference` and the profile has such a reference, else in the
    session). Fills `report.noise` and `report.anchors`. Also returns this machine's matmul anchor
    over the reference's (`machine_ratio`), by which the other rows are judged too."""
    policy, cpus = j.policy, os.cpu_count() or 1

    def once(n: int = j.repeats, seed: int = 0) -> Any:
        return in_session(s, config, b, n, seed)

    (machine, m), os_noise, busy_seen = noise.busy_window(
        lambda: measure_twice(s.device, once, settle_s=s.settle_s)
    )
    env = classify(os_noise, policy, busy_seen=busy_seen, threads=s.threads, cpus=cpus)
    plain = m.metrics.baseline_tokens_per_s if b == 1 else 0.0
    verdict = anchor_verdict(p, plain, machine, env.busy, policy)
    if verdict.other_hardware and not allow_other_hardware:
        # Before calling it other hardware, the anchors again, spaced out (the policy's
        # `anchor_retries`): the faster of each is kept.
        machine, busy_again = anchors_again(s.device, machine, policy)
        env = classify(os_noise, policy, busy_seen=env.busy or busy_again, threads=s.threads, cpus=cpus)
        verdict = anchor_verdict(p, plain, machine, env.busy, policy)
    if verdict.other_hardware and not allow_other_hardware:
        raise OtherHardwareError(other_hardware_message(path, verdict, s.run_command))
    moved = getattr(machine, "drift", 0.0)
    ratio = machine_ratio(p, machine, j.sliced)
    scale = rate_scale_for(p, verdict, machine) if env.quiet else 1.0  # a load's rates are not judged
    first = Evidence(
        stored, m, temperature=p.workload.temperature, environment=env,
        judge_rates=verdict.judge_rates and b == 1 and bool(policy.judged_rates), rate_scale=scale,
        reference=reference_of(p) if b == 1 else {}, where=where_of(b), same_machine=j.same_machine,
        stored_divergence=stored_divergence(p, stored) if b == 1 else (0, 0), machine_ratio=ratio,
    )  # fmt: skip
    again = None
    # Beside other work, with what it took from each prompt accounted (measure.preemption): more
    # repeats here give more unpreempted prompts; a fresh process keeps only its medians.
    accounted = not env.quiet and m.clean_share is not None
    if needs_confirmation(first, j.tolerance, policy):
        fresh, fresh_busy = [], False
        # A sample of the reference's kind: one median per fresh process. Not on the slice, where
        # the process level is within the repeats' spread and the reference keeps every repeat:
        # more repeats here are cheaper than the fresh processes' start-up, and weigh as much.
        if s.fresh_reference and first.reference and not accounted and not j.sliced:
            fresh, fresh_busy = confirm_in_fresh_processes(
                path, s.device, models_root, machine, busy=env.busy, policy=policy, threads=s.threads
            )
        if fresh:
            # one sample per process: its repeats share one process's speed (`confirm_processes`)
            m, again = per_process(m), merged(m, fresh)
            env = classify(os_noise, policy, busy_seen=env.busy or fresh_busy, threads=s.threads, cpus=cpus)
        else:  # in this session
            # Busy: the load, not the noise, moved the result, and more repeats under it only
            # resolve the load's level; one more look at the same length is enough to pass. In a
            # renewed engine (new processes: `renew`) as many repeats as the first, so both weigh alike.
            renewed = s.renew()
            n = (
                j.repeats
                if (env.busy and not accounted) or renewed
                else confirm_repeats(m, j.repeats, policy, shared=accounted)
            )
            again = once(n, seed=1)
    # The machine's own speed moved while this check measured (a shared host's neighbours): a drop
    # of the absolute rates is then inconclusive; the plain rate per decode-anchor step, in which
    # the host's speed cancels, is still judged, and so is the speedup (output.environment).
    env = classify(
        os_noise, policy, busy_seen=env.busy, drift=moved, drift_cancels=bool(m.plain_per_anchor),
        threads=s.threads, cpus=cpus,
    )  # fmt: skip
    evidence = dataclasses.replace(first, measured=m, again=again, environment=env)
    evidence = looked_again(evidence, s, config, b, j)
    env = evidence.environment
    report.noise = {**os_noise, "busy": env.busy, "anchor_drift": round(moved, 4)}
    if verdict.slowdown is not None:
        report.anchors = {**verdict.as_dict(), "rate_scale": round(scale, 4)}
    if p.anchors is not None and p.anchors.has_anchor_reference and m.plain_per_anchor:
        ref, now = p.anchors.reference_plain_per_anchor, per_anchor_of(m, again)
        report.anchors["plain_per_anchor"] = [
            round(statistics.median(ref), 5),
            round(statistics.median(now), 5),
        ]
    if ratio is not None:
        report.anchors["matmul_ratio"] = round(ratio, 4)
    items = judge_config(evidence, j.tolerance, acceptance_tolerance=j.acceptance_tolerance, policy=policy)
    return items, ratio


def machine_ratio(p: Any, machine: Any, sliced: bool) -> float | None:
    """This machine's matmul anchor over the one measured where the reference was, as this check
    measures it: the reference processes', else (off the check slice, with the engine's threads)
    the run's; None where either is missing. Another machine's reference is judged with it
    (output.elsewhere.machine_floor)."""
    a = p.anchors
    now = getattr(machine, "matmul_gflops", None)
    ref = None if a is None else a.reference_matmul_gflops or (None if sliced else a.matmul_gflops)
    return now / ref if now and ref else None


def same_machine(p: Any) -> bool:
    """Whether this is the machine the profile was made on, not only one of its kind: the machine
    id `run` stored (measure.hardware.machine_id; with the reference, or with the run's own rates in
    vLLM, app.tuning). Older profiles have none, and
    their absolute rates are then reported as another machine's (output.rates.unjudged)."""
    stored = p.anchors.machine if p.anchors is not None else None
    return stored is not None and stored == machine_id()


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
    threads: int | None = None,
) -> tuple[list[dict[str, Any]], bool]:
    """The profile's best config against plain decoding in the policy's `confirm_processes` fresh
    processes (with the engine's `threads`), measured as this check measured (app.reference): their
    results, with each one's rates put at this process's matmul speed (so `rate_scale` applies
    alike), and whether any found the machine busy (a left-out process, or one that saw other work).
    `busy`: this check's own measurement saw other work; then `busy_confirm_processes` confirm and a
    busy one is not replaced."""
    import functools
    import subprocess

    env = dict(os.environ)
    if models_root is not None:
        env["SPECDEC_MODELS_ROOT"] = str(models_root)
    run = functools.partial(subprocess.run, env=env)
    kept, note = record_reference(
        path, policy.busy_confirm_processes if busy else policy.confirm_processes,
        threads=threads, run=run, device=device, what="confirming process",
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
