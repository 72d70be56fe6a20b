"""The measuring use cases: `bench` one config against the plain target, `profile_costs` of the
hardware (`check` of a stored profile is in `checking`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..domain import Costs
from ..errors import SpecDecError
from ..limits import MAX_BATCH_SIZE, MAX_CONTEXT_LEN, MAX_REPEATS, check_count, check_decoding, check_gamma
from ..measure.hardware import hardware_info
from ..measure.llamacpp.server import servers_die_with_us
from ..runtime.models.shapes import SHAPE_CONTEXT_LEN
from ..search.costmodel import CostModel
from ..store.atomic import atomic_write_text
from ..store.yamlio import costs_to_yaml
from .acceptance import GivenAcceptance, acceptance_plan, apply_acceptance
from .categories import bench_categories
from .common import (
    BenchResult,
    Models,
    Progress,
    acceptance_measured,
    check_writable,
    drafter_pool,
    measure_costs,
)
from .engine_checks import bench_engine, profile_engine
from .engine_plan import server_failures

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
    check_decoding(gamma, threshold, models.temperature, models.max_new_tokens)
    check_gamma(gamma, allow_zero=False)  # the baseline is always measured
    if models.backend == "llamacpp":
        if compare_hf:
            raise SpecDecError(
                "--compare-hf compares our own engine with transformers: drop --backend llamacpp"
            )

        with servers_die_with_us(), server_failures(models.threads):
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
        from ..runtime.drafting.build import build_drafter

        drafter = build_drafter(spec, s.target.model, s.draft_modules, s.ctx)
        m = measure(s.target.model, drafter, gamma, threshold, s.case, repeats=repeats, seed=seed, ctx=s.ctx)
        if per_category:
            categories = bench_categories(s, drafter, gamma, threshold, repeats, seed)
    else:
        from ..measure.batched import measure_batched
        from ..runtime.drafting.build import build_drafter

        def make() -> Any:
            return build_drafter(spec, s.target.model, s.draft_modules, s.ctx, rows=batch_size)

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
    check_gamma(max_gamma, allow_zero=False, what="--max-gamma")
    check_count(repeats, "--repeats", high=MAX_REPEATS)
    if context_len is not None:
        check_count(context_len, "--context-len", high=MAX_CONTEXT_LEN)
    if out is not None:
        check_writable(out)
    progress = progress or Progress()
    if models.backend == "llamacpp":
        with servers_die_with_us(), server_failures(models.threads):
            hw, costs, target, budgets = profile_engine(models, max_gamma, repeats, progress)
        model = CostModel(costs, budgets)
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
    model = CostModel(costs, s.case.max_new_tokens if s.case is not None else None)
    per_draft = {d.name: model.best_gamma(d.name, max_gamma) for d in costs.drafts if d.acceptance_known}
    t = s.target
    target = {"name": t.name, "dtype": t.dtype, "num_params": t.num_params, "weights": t.weights}
    if t.shape:
        target["shape"] = t.shape
    if out is not None:
        atomic_write_text(out, costs_to_yaml(costs, hw, target))
    return CostsResult(hw, costs, per_draft, model.rank(max_gamma), out, target)
