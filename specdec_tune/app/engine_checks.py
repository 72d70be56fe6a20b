"""The engine backend's other use cases: `bench` one config, `profile` the engine's costs and
`check` a profile measured in llama.cpp (the search itself is in app/engine.py)."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..checkpolicy import LLAMACPP_CHECK_POLICY, CheckPolicy
from ..domain import Config
from ..errors import OtherHardwareError, SpecDecError
from ..limits import check_count, check_decoding
from ..measure import noise
from ..measure.anchors import measure_twice
from ..measure.hardware import hardware_info, hardware_slug, same_hardware
from ..measure.llamacpp.args import parse_llamacpp_draft
from ..measure.llamacpp.costs import draft_paths, measure_engine_costs, with_acceptance
from ..measure.llamacpp.server import ServerError, build_info, find_server
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
from ..store.yamlio import load_profile
from .common import BenchResult, Models, Progress
from .engine import SMOLLM2, open_engine, start_params
from .engine_plan import load_hint


def bench_engine(
    models: Models, draft: str, gamma: int, threshold: float, batch_size: int, repeats: int
) -> Any:
    """One config inside the engine against its plain server, interleaved."""
    models = replace(models, drafts=[draft])
    check_count(repeats, "repeats")
    s = open_engine(models, batch_size)
    try:
        spec = s.specs[0] if s.specs else parse_llamacpp_draft(draft)
        check_decoding(gamma, threshold, models.temperature, min(s.case.max_new_tokens))
        config = Config(spec, gamma, threshold)
        (m,) = s.backend.measure([config], s.case, batch_size, repeats)
        return BenchResult(
            s.target.name,
            spec.name,
            gamma,
            threshold,
            models.temperature,
            s.workload.name,
            len(s.case.prompts),
            f"llama.cpp ({s.backend.build.get('package') or s.backend.build['binary_sha256']})",
            m,
        )
    finally:
        s.close()


def profile_engine(
    models: Models, max_gamma: int, repeats: int, progress: Progress
) -> tuple[dict[str, Any], Any, dict[str, Any], list[int]]:
    """`profile --backend llamacpp`: T_target, C_ver(γ) and T_draft measured in llama-server, and
    each draft's acceptance (and in-loop step cost) from one pass at a middle γ. Also returns the
    workload's per-request token budgets (the cost model counts their cut)."""
    hw = hardware_info("cpu")
    s = open_engine(models)
    try:
        progress.stage("llama.cpp: T_target, C_ver(γ), T_draft", 0.0)
        costs = measure_engine_costs(
            s.backend, s.case.head(2), draft_paths(s.backend, s.specs), max_gamma, repeats
        )
        measured = {}
        for i, spec in enumerate(s.specs):
            progress.stage(f"acceptance of {spec.name}", (i + 1) / (len(s.specs) + 1))
            params = start_params(spec, max_gamma)
            (m,) = s.backend.measure(
                [Config(spec, params["gamma"], params.get("threshold", 0.0))], s.case, 1, 1
            )
            if m.metrics.acceptance_rate > 0:
                measured[spec.name] = (
                    m.metrics.acceptance_rate,
                    m.metrics.mean_accepted_len,
                    m.metrics.tokens_per_s,
                )
        costs = with_acceptance(costs, measured, max_gamma)
        target = {"name": s.target.name, "dtype": "gguf", "num_params": 0, "weights": "trained"}
        target["backend"] = s.backend.info()
    finally:
        s.close()
    return hw, costs, target, list(s.case.max_new_tokens)


def check_engine(
    path: Path,
    tolerance: float = LLAMACPP_CHECK_POLICY.tolerance,
    acceptance_tolerance: float | None = None,
    repeats: int = 3,
    *,
    allow_other_hardware: bool = False,
    allow_other_build: bool = False,
    batch_size: int | None = None,
    llama_server: str | None = None,
    threads: int | None = None,
    policy: CheckPolicy = LLAMACPP_CHECK_POLICY,
) -> Any:
    """`check` of a profile measured in llama.cpp: the same build (else "other software", exit 3
    unless allowed), the same hardware, then every stored config re-measured in the engine.

    As the native check: the machine anchors (copy, matmul) measured around the first row decide
    other hardware (exit 3) on a quiet machine of the same slug (profiles without anchors skip
    that); on a busy machine (`policy`'s busy rule, stricter than the native one, as llama.cpp's
    threads wait for any other work: checkpolicy.LLAMACPP_CHECK_POLICY) a speedup drop is
    inconclusive (exit 6), never a regression; a speedup not clearly passing (the native rule,
    output.check.needs_confirmation) is measured again with the repeats its spread needs."""
    started = time.monotonic()
    p = load_profile(path)
    check_count(repeats, "--repeats")
    if (p.backend or {}).get("name") != "llamacpp":
        raise SpecDecError(f"{path} was not measured in llama.cpp: check it without --backend llamacpp")
    hw = hardware_info("cpu")
    if not same_hardware(p.hardware, hw) and not allow_other_hardware:
        raise OtherHardwareError(
            f"{path} was measured on {p.hardware.get('slug')}, this machine is {hardware_slug(hw)}; "
            "re-run `specdec-tune run --backend llamacpp` here or pass --allow-other-hardware"
        )
    build = build_info(find_server(llama_server))
    stored = (p.backend or {}).get("build") or {}
    if other_software(stored, build) and not allow_other_build:
        raise OtherHardwareError(
            f"{path} was measured with another llama.cpp build ({stored.get('package', '?')}, binary "
            f"{stored.get('binary_sha256', '?')}; here {build.get('package', '?')}, {build['binary_sha256']}): "
            "other software; re-run `specdec-tune run --backend llamacpp` or pass --allow-other-build"
        )
    rows = [(1, p.best)] + [(r.batch_size, r.best) for r in p.batch_table if r.batch_size != 1]
    if batch_size is not None:
        rows = [(b, r) for b, r in rows if b == batch_size]
        if not rows:
            raise SpecDecError(f"{path} has no result at batch size {batch_size}")
    folder = Path(path).parent
    drafts = [r.config.draft for _, r in rows if r.config.gamma > 0]
    drafts = [replace(d, path=resolve_ref(d.path, folder)) if d.path else d for d in drafts]
    models = Models(
        # a built-in GGUF by its name (its file lives in a package); a file by its path
        target=p.target.name if p.target.name in (SMOLLM2, "demo") else resolve_ref(p.target.path, folder),
        drafts=list({d.name: d for d in drafts}.values()),
        workload=p.workload.name,
        prompts=p.workload.prompts,
        max_new_tokens=p.workload.max_new_tokens,
        temperature=p.workload.temperature,
        backend="llamacpp",
        llama_server=llama_server,
        threads=threads or (p.backend or {}).get("threads"),
    )
    s = open_engine(models, rows[0][0])
    report = CheckReport(profile=str(path), config=p.best.config.label)
    try:
        if s.workload.sha256 != p.workload.sha256:
            raise SpecDecError(
                f"workload '{p.workload.name}' has changed since the profile was made; re-run `specdec-tune run`"
            )
        report.items.append(
            weights_item(p.target.content_hash, s.target.content_hash, "the target GGUF changed")
        )
        by_name = {d.name: d for d in s.specs}
        snapshot, current, cpus = noise.os_snapshot(), rows[0], os.cpu_count() or 1
        try:
            for i, (b, r) in enumerate(rows):
                current = (b, r)
                config = replace(r.config, draft=by_name.get(r.config.draft.name, r.config.draft))

                def once(config: Config = config, b: int = b) -> Any:
                    return s.backend.measure([config], s.case, b, repeats)[0]

                if i == 0:  # the machine anchors (copy, matmul) before and after the first row
                    (machine, m), os_noise, _ = noise.busy_window(lambda: measure_twice("cpu", once))
                    plain = m.metrics.baseline_tokens_per_s if b == 1 else 0.0
                    env = classify(os_noise, policy, threads=s.backend.threads, cpus=cpus)
                    verdict = anchor_verdict(p, plain, machine, env.busy, policy)
                    if verdict.other_hardware and not allow_other_hardware:
                        raise OtherHardwareError(
                            other_hardware_message(path, verdict, "specdec-tune run --backend llamacpp")
                        )
                    report.noise = {**os_noise, "busy": env.busy}
                    if verdict.slowdown is not None:
                        report.anchors = verdict.as_dict()
                else:
                    m, os_noise, _ = noise.busy_window(once)
                    env = classify(os_noise, policy, threads=s.backend.threads, cpus=cpus)
                where = "" if b == 1 else f" @ B={b}"
                e = Evidence(r, m, temperature=p.workload.temperature, environment=env, where=where)
                if needs_confirmation(e, tolerance, policy):  # the native rule (output.check)
                    (again,) = s.backend.measure([config], s.case, b, confirm_repeats(m, repeats, policy))
                    e = replace(e, again=again)
                report.items += judge_config(
                    e, tolerance, acceptance_tolerance=acceptance_tolerance, policy=policy
                )
        except ServerError as exc:
            # A server that stops answering on a busy machine (llama.cpp's threads spin-wait for a
            # busy core) cannot be judged: inconclusive, as any speedup drop there. On a quiet one
            # it is an error of the setup.
            info = noise.os_since(snapshot)
            hint = load_hint(info, s.backend.threads, cpus)
            if not hint:
                raise SpecDecError(str(exc)) from None
            b, r = current
            report.noise = {**info, "busy": True}
            where = "" if b == 1 else f" @ B={b}"
            note = f"not measured, the server did not answer: {hint}; inconclusive: the machine was busy"
            report.items.append(CheckItem(f"speedup{where}", r.metrics.speedup, None, True, note, True))
    finally:
        s.close()
    report.seconds = time.monotonic() - started
    return report
