"""The measuring use cases: `bench` one config, `profile_costs` of the hardware, `check` a stored
profile here."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..domain import Costs
from ..errors import OtherHardwareError, SpecDecError
from ..limits import MAX_BATCH_SIZE, MAX_CONTEXT_LEN, MAX_REPEATS, check_count, check_gamma
from ..output.check import CheckReport
from .acceptance import GivenAcceptance, acceptance_plan, apply_acceptance
from .common import (
    BenchResult,
    Models,
    Progress,
    acceptance_measured,
    check_writable,
    drafter_pool,
    measure_costs,
)

# ---------------------------------------------------------------------------------------- bench


def bench(
    models: Models,
    draft: str = "draft-1l",
    gamma: int = 4,
    threshold: float = 0.0,
    repeats: int = 3,
    seed: int = 0,
    compare_hf: bool = False,
    save_outputs: Path | None = None,
    batch_size: int | None = None,
    per_category: bool = True,
) -> BenchResult:
    """Measure one config against the plain target, timed in the same run.

    With `batch_size`, both run the batched engine at that concurrency (closed loop: a finished
    request is replaced by the next prompt of the workload); without, one request at a time.
    """
    from ..limits import check_decoding

    check_decoding(gamma, threshold, models.temperature, models.max_new_tokens)
    check_gamma(gamma, allow_zero=False)  # the baseline is always measured
    if models.backend == "llamacpp":
        if compare_hf:
            raise SpecDecError(
                "--compare-hf compares our own engine with transformers: drop --backend llamacpp"
            )
        from ..measure.llamacpp.server import servers_die_with_us
        from .engine_checks import bench_engine

        with servers_die_with_us():
            return bench_engine(models, draft, gamma, threshold, batch_size or 1, repeats)
    if batch_size is not None:
        check_count(batch_size, "--batch-size", high=MAX_BATCH_SIZE)
        if compare_hf:
            raise SpecDecError(
                "--compare-hf times transformers' assisted generation, which is batch size 1 only"
            )
    s = Models(**{**models.__dict__, "drafts": [draft]}).open(lazy_drafts=False)
    spec = s.specs[0]
    if compare_hf and spec.kind == "hybrid":
        raise SpecDecError("--compare-hf: transformers has no hybrid drafter to compare with")
    categories = None
    if batch_size is None:
        from ..measure.bench import measure
        from ..runtime.build import build_drafter

        drafter = build_drafter(spec, s.target.model, s.draft_modules, s.ctx)
        m = measure(s.target.model, drafter, gamma, threshold, s.case, repeats=repeats, seed=seed, ctx=s.ctx)
        if per_category:
            from .categories import bench_categories

            categories = bench_categories(s, drafter, gamma, threshold, repeats, seed)
    else:
        from ..measure.serving import measure_batched
        from ..runtime.build import build_batch_drafter

        def make() -> Any:
            return build_batch_drafter(spec, s.target.model, s.draft_modules, batch_size, s.ctx)

        m = measure_batched(
            s.target.model, make, gamma, threshold, s.case, batch_size, repeats, seed=seed, ctx=s.ctx
        )
    hf = None
    if compare_hf:
        from ..measure.hfcompare import HFConfig, measure_hf

        dm = s.drafts[spec.name].model if spec.kind == "model" else None
        cfg = HFConfig(spec.kind, gamma, threshold, dm, spec.ngram_max or 3, spec.layers)
        hf = measure_hf(s.target.model, s.case, cfg, repeats=repeats, ctx=s.ctx)
    if save_outputs is not None:
        from ..store.atomic import atomic_write_text

        tok = s.target.tokenizer
        lines = [
            json.dumps({"prompt": p.text, "token_ids": ids, "text": tok.decode(ids)})
            for p, ids in zip(s.workload.prompts, m.outputs, strict=True)
        ]
        atomic_write_text(save_outputs, "\n".join(lines) + "\n")
    return BenchResult(
        s.target.name,
        spec.name,
        gamma,
        threshold,
        models.temperature,
        s.workload.name,
        len(s.case.prompts),
        s.device,
        m,
        hf,
        categories,
    )


# ------------------------------------------------------------------------------ costs profile


@dataclass
class CostsResult:
    hardware: dict[str, Any]
    costs: Costs
    best_gamma: dict[str, tuple[int, float]]  # per draft with known acceptance: (gamma, predicted speedup)
    ranked: list[tuple[str, int, float]]  # every (draft, gamma, predicted speedup), best first
    out: Path | None = None
    target: dict[str, Any] = field(default_factory=dict)  # name, dtype, num_params, weights, shape


def profile_costs(
    models: Models,
    max_gamma: int = 16,
    repeats: int = 7,
    out: Path | None = None,
    progress: Progress | None = None,
    context_len: int | None = None,
    acceptance: GivenAcceptance | None = None,
) -> CostsResult:
    """Measure the hardware costs (T_target, C_ver(γ), T_draft, acceptance, bandwidth) and predict
    every config; with `out`, write them as a costs file `tune` can reuse.

    The target or a draft may be a shape (`shape:NAME`, random weights): its costs are measured
    at `context_len` (default: the workload's mid-generation length, SHAPE_CONTEXT_LEN for a
    shape target), its acceptance is taken from `acceptance` or left unknown (no predictions).
    """
    from ..measure.hardware import hardware_info
    from ..runtime.shapes import SHAPE_CONTEXT_LEN
    from ..search.costmodel import CostModel
    from ..store.atomic import atomic_write_text
    from ..store.yamlio import costs_to_yaml

    check_gamma(max_gamma, allow_zero=False, what="--max-gamma")
    check_count(repeats, "--repeats", high=MAX_REPEATS)
    if context_len is not None:
        check_count(context_len, "--context-len", high=MAX_CONTEXT_LEN)
    if out is not None:
        check_writable(out)
    progress = progress or Progress()
    if models.backend == "llamacpp":
        from ..measure.llamacpp.server import servers_die_with_us
        from .engine_checks import profile_engine

        with servers_die_with_us():
            hw, costs, target = profile_engine(models, max_gamma, repeats, progress)
        model = CostModel(costs)
        per_draft = {d.name: model.best_gamma(d.name, max_gamma) for d in costs.drafts if d.acceptance_known}
        if out is not None:
            atomic_write_text(out, costs_to_yaml(costs, hw, target))
        return CostsResult(hw, costs, per_draft, model.rank(max_gamma), out, target)
    s = models.open(allow_random=True)
    measured = {spec.name for spec in s.specs if acceptance_measured(s, spec)}
    plan, notes = acceptance_plan(acceptance or GivenAcceptance(), s.specs, measured)
    if context_len is None and s.case is None:
        context_len = SHAPE_CONTEXT_LEN
    hw = hardware_info(s.device)
    costs = measure_costs(s, drafter_pool(s, s.specs), max_gamma, repeats, progress, context_len=context_len)
    apply_acceptance(costs, plan, max_gamma)
    for note in notes:
        progress.note(note)
    model = CostModel(costs)
    per_draft = {d.name: model.best_gamma(d.name, max_gamma) for d in costs.drafts if d.acceptance_known}
    t = s.target
    target = {"name": t.name, "dtype": t.dtype, "num_params": t.num_params, "weights": t.weights}
    if t.shape:
        target["shape"] = t.shape
    if out is not None:
        atomic_write_text(out, costs_to_yaml(costs, hw, target))
    return CostsResult(hw, costs, per_draft, model.rank(max_gamma), out, target)


# ---------------------------------------------------------------------------------------- check


def check(
    path: Path,
    device: str = "auto",
    tolerance: float = 0.10,
    acceptance_tolerance: float | None = None,
    repeats: int = 3,
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

    Raises OtherHardwareError (CLI exit 3) on other hardware unless allowed: another slug, or
    the machine anchors (copy, matmul; plain decoding in older profiles) far slower or faster than
    the profile's on a quiet machine (output.anchors); when they agree, tokens/s is judged too. A speedup
    not clearly passing is measured again (with the repeats its noise needs) and judged on all
    repeats together; too noisy to tell is `report.inconclusive` (CLI exit 6).
    """
    import time

    from ..measure.anchors import measure_twice
    from ..measure.bench import measure
    from ..measure.hardware import hardware_info, hardware_slug, same_hardware
    from ..measure.noise import busy_window
    from ..output.anchors import anchor_verdict, other_hardware_message, rates_busy
    from ..output.check import confirm_repeats, judge, junit_xml, needs_confirmation, speedup_floor
    from ..runtime.build import build_drafter
    from ..runtime.models import content_hash_like
    from ..search.policymodel import policy_drafter
    from ..store.atomic import atomic_write_text
    from ..store.refs import resolve_ref, target_ref
    from ..store.yamlio import load_profile
    from .confine import confine_model, confine_workload
    from .confine import models_root as models_root_of

    started = time.monotonic()
    p = load_profile(path)
    engine = backend or (p.backend or {}).get("name") or "native"
    if engine != "native":
        from ..measure.llamacpp.server import servers_die_with_us
        from .engine_checks import check_engine

        with servers_die_with_us():
            report = check_engine(
                path,
                tolerance,
                acceptance_tolerance,
                repeats,
                allow_other_hardware,
                allow_other_build,
                batch_size,
                llama_server,
            )
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
    # models are named relative to the profile's folder (store.refs), so any working directory works
    folder = Path(path).parent

    def local(spec: Any) -> Any:
        return dataclasses.replace(spec, path=resolve_ref(spec.path, folder)) if spec.path else spec

    spec = local(p.best.config.draft)
    extra = [local(r.best.config.draft) for r in rows if r.best.config.draft.kind != "none"]
    specs = {d.name: d for d in ([spec] if spec.kind != "none" else []) + extra}
    target = resolve_ref(target_ref(p), folder)
    root = models_root_of(models_root)
    confine_model(target, root, "target")
    for d in specs.values():
        if d.path:
            confine_model(d.path, root, f"draft '{d.name}'")
    confine_workload(p.workload.name, root)
    s = open_models(
        Models(
            target=target,
            drafts=list(specs.values()),
            workload=p.workload.name,
            prompts=p.workload.prompts,
            max_new_tokens=p.workload.max_new_tokens,
            temperature=p.workload.temperature,
            device=device,
            dtype=p.target.dtype,
            engine=p.engine_mode,
        )
    )
    hw = hardware_info(s.device)
    if not same_hardware(p.hardware, hw) and not allow_other_hardware:
        raise OtherHardwareError(
            f"{path} was measured on {p.hardware.get('slug')}, this machine is {hardware_slug(hw)}; "
            "re-run `specdec-tune run` here or pass --allow-other-hardware"
        )
    if s.workload.sha256 != p.workload.sha256:
        raise SpecDecError(
            f"workload '{p.workload.name}' has changed since the profile was made "
            f"(hash {s.workload.sha256} != {p.workload.sha256}); re-run `specdec-tune run`"
        )
    weights = content_hash_like(p.target.content_hash, s.target.path)
    if batch_size is None:
        cfg = p.best.config
        drafter = policy_drafter(build_drafter(spec, s.target.model, s.draft_modules, s.ctx), cfg, p.costs)
        # The machine anchors (copy, matmul) before and after the measurement (output.anchors).
        (machine, m), os_noise, machine_busy = busy_window(
            lambda: measure_twice(
                s.device,
                lambda: measure(
                    s.target.model, drafter, cfg.gamma, cfg.threshold, s.case, repeats=repeats, ctx=s.ctx
                ),
            )
        )
        verdict = anchor_verdict(p, m.metrics.baseline_tokens_per_s, machine, machine_busy)
        if verdict.other_hardware and not allow_other_hardware:
            raise OtherHardwareError(other_hardware_message(path, verdict))
        again = None
        if needs_confirmation(p.best.metrics, m, tolerance, verdict.judge_rates):
            n = confirm_repeats(m, repeats)
            again = measure(
                s.target.model, drafter, cfg.gamma, cfg.threshold, s.case, repeats=n, seed=1, ctx=s.ctx
            )
        busy_rates = rates_busy(os_noise, machine_busy)
        report = judge(
            p, str(path), m, again, weights, tolerance, acceptance_tolerance, machine_busy,
            verdict.judge_rates, busy_rates,
        )  # fmt: skip
        report.noise = {**os_noise, "busy": machine_busy}
        if verdict.slowdown is not None:
            report.anchors = verdict.as_dict()
        # The best config is the batch size 1 answer; the table's other rows follow.
        others = [r for r in rows if r.batch_size != 1]
        report.items += judge_batch_rows(
            p, str(path), s, others, weights, tolerance, acceptance_tolerance, repeats, with_weights=False
        ).items
        if p.batch_table:
            report.config += f" + batch sizes {', '.join(str(r.batch_size) for r in p.batch_table)}"
    else:
        report = judge_batch_rows(p, str(path), s, rows, weights, tolerance, acceptance_tolerance, repeats)
        report.config = f"batch size {batch_size}: {rows[0].best.config.label}"
    report.seconds = time.monotonic() - started
    if junit is not None:
        atomic_write_text(junit, junit_xml(report))
    return report


def open_models(models: Models) -> Any:
    """Load what a stored profile names. Whatever the loaders raise for a folder the profile points
    at (a broken config.json, a tokenizer that will not build) is the profile's problem: exit 2."""
    try:
        return models.open(lazy_drafts=False)
    except (SpecDecError, MemoryError):
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise SpecDecError(
            f"could not load the models or workload the profile names ({type(exc).__name__}: {first})"
        ) from None


def judge_batch_rows(
    p: Any,
    path: str,
    s: Any,
    rows: list[Any],
    weights: str,
    tolerance: float,
    acceptance_tolerance: float | None,
    repeats: int,
    with_weights: bool = True,
) -> CheckReport:
    """Each batch table row re-measured at its batch size (closed loop) and judged; items are
    named with the batch size (e.g. "speedup @ B=4"). A speedup not clearly passing is measured again."""
    from ..measure.bench import measure
    from ..measure.noise import busy_window
    from ..measure.serving import measure_batched
    from ..measure.stats import PASS
    from ..output.check import CheckItem, confirm_repeats, judge_config, judge_measured
    from ..runtime.build import build_batch_drafter, build_drafter
    from ..search.policymodel import policy_drafter

    report = CheckReport(profile=path, config="")
    if with_weights:
        same = weights == p.target.content_hash
        note = "" if same else "the target model files changed"
        report.items.append(CheckItem("target weights", p.target.content_hash, weights, same, note))
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
                build_batch_drafter(spec, s.target.model, s.draft_modules, b, s.ctx), cfg, p.costs, b
            )
            return measure_batched(
                s.target.model, make, cfg.gamma, cfg.threshold, s.case, b, repeats, seed=seed, ctx=s.ctx
            )

        m, _, machine_busy = busy_window(lambda once=once: once(0))
        again = None
        if judge_measured(row.best.metrics, m, None, tolerance).verdict != PASS:
            again = once(1, repeats=confirm_repeats(m, repeats))
        report.items += judge_config(
            row.best,
            p.workload.temperature,
            m,
            again,
            tolerance,
            acceptance_tolerance,
            f" @ B={b}",
            machine_busy,
        )
    return report
