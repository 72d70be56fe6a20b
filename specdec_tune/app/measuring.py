"""The measuring use cases: `bench` one config against the plain target, `profile_costs` of the
hardware (`check` of a stored profile is in `checking`). Both through the backend's measuring
session (backends.base)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..atomic import atomic_write_text
from ..backends.acceptance import GivenAcceptance
from ..backends.base import Purpose, open_session
from ..domain import Config, Costs
from ..errors import SpecDecError
from ..limits import MAX_BATCH_SIZE, MAX_CONTEXT_LEN, MAX_REPEATS, check_count, check_decoding, check_gamma
from ..measure.hardware import hardware_info
from ..search.costmodel import CostModel
from ..store.yamlio import costs_to_yaml
from .categories import bench_categories
from .common import BenchResult, Models, Progress, check_writable

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

    With `batch_size`, both run at that concurrency (closed loop: a finished request is replaced by
    the next prompt of the workload); without, one request at a time.
    """
    check_decoding(gamma, threshold, models.temperature, models.max_new_tokens)
    check_gamma(gamma, allow_zero=False)  # the baseline is always measured
    check_count(repeats, "repeats")
    if batch_size is not None:
        check_count(batch_size, "--batch-size", high=MAX_BATCH_SIZE)
        if compare_hf:
            raise SpecDecError(
                "--compare-hf times transformers' assisted generation, which is batch size 1 only"
            )
    with open_session(replace(models, drafts=[draft]), Purpose("bench", batch_size=batch_size or 1)) as s:
        spec = s.specs[0]
        s.check_bench(spec, compare_hf=compare_hf, save_outputs=save_outputs is not None)
        check_decoding(gamma, threshold, models.temperature, min(s.case.max_new_tokens))
        config = Config(spec, gamma, threshold)
        (m,) = s.measure([config], s.case, batch_size or 1, repeats, seed)
        categories = None
        if batch_size is None and per_category:
            categories = bench_categories(s, config, repeats, seed)
        hf = s.compare_hf(config, repeats) if compare_hf else None
        if save_outputs is not None:
            atomic_write_text(save_outputs, s.outputs_jsonl(m))
        name = s.target_name()
        device = s.describe()
    return BenchResult(
        name, spec.name, gamma, threshold, models.temperature, s.workload.name, len(s.case.prompts), device, m,
        hf, categories,
    )  # fmt: skip


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
    with open_session(models, Purpose("costs", allow_random=True)) as s:
        hw = hardware_info(s.device)
        costs, budgets, target = s.profile_costs(
            max_gamma, repeats, progress, context_len=context_len, acceptance=acceptance or GivenAcceptance()
        )
    model = CostModel(costs, budgets)
    per_draft = {d.name: model.best_gamma(d.name, max_gamma) for d in costs.drafts if d.acceptance_known}
    if out is not None:
        atomic_write_text(out, costs_to_yaml(costs, hw, target))
    return CostsResult(hw, costs, per_draft, model.rank(max_gamma), out, target)
