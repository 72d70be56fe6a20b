"""`check` of a profile whose engine confirms in the same session (an engine backend: each config
in its own server, fresh already), through the measuring session (backends.base): the same
hardware and engine build, the machine anchors around the first row, every stored row re-measured
at its batch size and judged by the policy's rules, a doubtful drop measured again."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..backends.base import Models, Purpose, engine_build, open_session
from ..checkpolicy import CheckPolicy
from ..domain import Config, DraftSpec
from ..errors import OtherHardwareError, SpecDecError
from ..measure import noise
from ..measure.anchors import measure_twice
from ..measure.hardware import hardware_info, hardware_slug, same_hardware
from ..output.anchors import anchor_verdict, other_hardware_message
from ..output.check import (
    CheckItem,
    CheckReport,
    Evidence,
    confirm_repeats,
    judge_config,
    needs_confirmation,
    weights_item,
)
from ..output.environment import classify, other_software
from ..store.refs import resolve_ref
from ..store.schema import Profile


def session_models(
    p: Profile,
    folder: Path,
    drafts: list[DraftSpec],
    *,
    server: str | None = None,
    threads: int | None = None,
    device: str = "auto",
    context_length: int | None = None,
) -> Models:
    """What a measuring session re-opens of profile `p` (in `folder`): its target, `drafts` (their
    files resolved from the folder), workload, decoding settings, engine and context length (the
    profile's best's, unless given)."""
    drafts = [replace(d, path=resolve_ref(d.path, folder)) if d.path else d for d in drafts]
    return Models(
        target=resolve_ref(p.target.path, folder),  # a built-in by its name, a file by its path
        drafts=list({d.name: d for d in drafts}.values()),
        workload=p.workload.name,
        prompts=p.workload.prompts,
        max_new_tokens=p.workload.max_new_tokens,
        temperature=p.workload.temperature,
        device=device,
        dtype=p.target.dtype,
        engine_mode=p.engine_mode,  # type: ignore[arg-type]
        backend=(p.backend or {}).get("name") or "native",
        llama_server=server,
        threads=threads or (p.backend or {}).get("threads"),
        context_length=context_length or p.workload.context_length,
    )


def check_in_session(
    p: Profile,
    path: Path,
    *,
    tolerance: float,
    acceptance_tolerance: float | None,
    repeats: int,
    allow_other_hardware: bool,
    allow_other_build: bool,
    batch_size: int | None,
    policy: CheckPolicy,
    server: str | None = None,
    threads: int | None = None,
) -> CheckReport:
    """Re-measure profile `p`'s rows in its engine (`p.backend`) and judge them.

    The machine anchors (copy, matmul) measured around the first row decide other hardware (exit 3)
    on a quiet machine of the same slug (profiles without anchors skip that); another engine build
    is "other software" (exit 3 unless allowed). On a busy machine (the session's busy rule) a
    speedup drop is inconclusive (exit 6), never a regression; a speedup not clearly passing
    (output.check.needs_confirmation) is measured again with the repeats its spread needs."""
    started = time.monotonic()
    rows = [(1, p.best)] + [(r.batch_size, r.best) for r in p.batch_table if r.batch_size != 1]
    if batch_size is not None:
        rows = [(b, r) for b, r in rows if b == batch_size]
        if not rows:
            raise SpecDecError(f"{path} has no result at batch size {batch_size}")
    folder = Path(path).parent
    drafts = [r.config.draft for _, r in rows if r.config.gamma > 0]
    models = session_models(p, folder, drafts, server=server, threads=threads)
    stored, build = (p.backend or {}).get("build") or {}, engine_build(models)
    if other_software(stored, build) and not allow_other_build:
        raise OtherHardwareError(
            f"{path} was measured with another {models.backend} build ({stored.get('package', '?')}, "
            f"binary {stored.get('binary_sha256', '?')}; here {build.get('package', '?')}, "
            f"{build.get('binary_sha256', '?')}): other software; re-run `specdec-tune run --backend "
            f"{models.backend}` or pass --allow-other-build"
        )
    report = CheckReport(profile=str(path), config=p.best.config.label)
    with open_session(models, Purpose("check", batch_size=rows[0][0])) as s:
        hw = hardware_info(s.device)
        if not same_hardware(p.hardware, hw) and not allow_other_hardware:
            raise OtherHardwareError(
                f"{path} was measured on {p.hardware.get('slug')}, this machine is {hardware_slug(hw)}; "
                f"re-run `{s.run_command}` here or pass --allow-other-hardware"
            )
        if s.workload.sha256 != p.workload.sha256:
            raise SpecDecError(
                f"workload '{p.workload.name}' has changed since the profile was made; re-run `specdec-tune run`"
            )
        report.items.append(weights_item(p.target.content_hash, s.content_hash(), "the target GGUF changed"))
        by_name = {d.name: d for d in s.specs}
        snapshot, current, cpus = noise.os_snapshot(), rows[0], os.cpu_count() or 1
        try:
            for i, (b, r) in enumerate(rows):
                current = (b, r)
                config = replace(r.config, draft=by_name.get(r.config.draft.name, r.config.draft))

                def once(config: Config = config, b: int = b) -> Any:
                    return s.measure([config], s.case, b, repeats)[0]

                if i == 0:  # the machine anchors (copy, matmul) before and after the first row
                    (machine, m), os_noise, _ = noise.busy_window(lambda: measure_twice(s.device, once))
                    plain = m.metrics.baseline_tokens_per_s if b == 1 else 0.0
                    env = classify(os_noise, policy, threads=s.threads, cpus=cpus)
                    verdict = anchor_verdict(p, plain, machine, env.busy, policy)
                    if verdict.other_hardware and not allow_other_hardware:
                        raise OtherHardwareError(other_hardware_message(path, verdict, s.run_command))
                    report.noise = {**os_noise, "busy": env.busy}
                    if verdict.slowdown is not None:
                        report.anchors = verdict.as_dict()
                else:
                    m, os_noise, _ = noise.busy_window(once)
                    env = classify(os_noise, policy, threads=s.threads, cpus=cpus)
                where = "" if b == 1 else f" @ B={b}"
                e = Evidence(r, m, temperature=p.workload.temperature, environment=env, where=where)
                if needs_confirmation(e, tolerance, policy):  # the native rule (output.check)
                    (again,) = s.measure([config], s.case, b, confirm_repeats(m, repeats, policy))
                    e = replace(e, again=again)
                report.items += judge_config(
                    e, tolerance, acceptance_tolerance=acceptance_tolerance, policy=policy
                )
        except Exception as exc:
            # An engine that stops answering on a busy machine (llama.cpp's threads spin-wait for a
            # busy core) cannot be judged: inconclusive, as any speedup drop there. On a quiet one
            # it is an error of the setup.
            info = noise.os_since(snapshot)
            hint = s.failure_hint(exc, info)
            if hint is None:
                raise
            if not hint:
                raise SpecDecError(str(exc)) from None
            b, r = current
            report.noise = {**info, "busy": True}
            where = "" if b == 1 else f" @ B={b}"
            note = f"not measured, the server did not answer: {hint}; inconclusive: the machine was busy"
            report.items.append(CheckItem(f"speedup{where}", r.metrics.speedup, None, True, note, True))
    report.seconds = time.monotonic() - started
    return report
