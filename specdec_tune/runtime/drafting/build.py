"""The drafter factory: a `DraftSpec`, an execution context and a row count -> the drafter that
spec describes, for the batch-1 engine (`rows` None) or the batched engine (`rows` rows).

Kept apart from the drafter classes so those stay leaves (drafters, hybrid and batch import no
factory, the factory imports them all), and every drafter is built under the context it is given.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...domain import DraftSpec
from ...errors import SpecDecError
from ..batch import BatchModelDrafter
from ..caches.modes import ExecutionContext
from .drafters import LayerSkipDrafter, ModelDrafter, PromptLookupDrafter, truncated_view
from .hybrid import BatchHybridDrafter, HybridDrafter, hybrid_parts
from .rows import PerRow

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def build_drafter(
    spec: DraftSpec,
    target: PreTrainedModel,
    draft_models: dict[str, Any],
    ctx: ExecutionContext | None = None,
    rows: int | None = None,
) -> Any:
    """The drafter `spec` describes (None for kind "none", the plain target): a batch-1 `Drafter`
    when `rows` is None, else a `BatchDrafter` for `rows` rows.

    `draft_models` maps a draft's name to its loaded model (transformers module); the drafter's
    caches are built under `ctx` (default: eager).
    """
    if spec.kind == "none":
        return None
    if spec.kind == "hybrid":
        lookup_spec, model_spec = hybrid_parts(spec)
        lookup = _part(lookup_spec, target, draft_models, ctx, rows, spec)
        model = _part(model_spec, target, draft_models, ctx, rows, spec)
        if rows is None:
            return HybridDrafter(lookup, model, spec.name)
        return BatchHybridDrafter(lookup, model, spec.name)
    if spec.kind in ("model", "prompt_lookup", "layer_skip"):
        return _part(spec, target, draft_models, ctx, rows)
    raise SpecDecError(f"unknown draft kind '{spec.kind}'")


def _part(
    spec: DraftSpec,
    target: PreTrainedModel,
    draft_models: dict[str, Any],
    ctx: ExecutionContext | None,
    rows: int | None,
    whole: DraftSpec | None = None,
) -> Any:
    """A single-source drafter; `whole` is the hybrid it is part of (its threshold mode rules)."""
    threshold_mode = (whole or spec).threshold_mode
    if spec.kind == "prompt_lookup":
        device = next(target.parameters()).device
        args = (spec.ngram_min or 1, spec.ngram_max or 3, device, spec.name, spec.lookup_match)
        if rows is None:
            return PromptLookupDrafter(*args)
        return PerRow([PromptLookupDrafter(*args) for _ in range(rows)])
    layers = int(spec.layers or 1)
    if spec.kind == "layer_skip" and rows is None:
        return LayerSkipDrafter(target, layers, spec.name, threshold_mode, ctx=ctx)
    module = (
        truncated_view(target, layers) if spec.kind == "layer_skip" else _model(spec, draft_models, whole)
    )
    if rows is None:
        return ModelDrafter(module, spec.name, threshold_mode=threshold_mode, ctx=ctx)
    return BatchModelDrafter(module, rows, spec.name, threshold_mode=threshold_mode, ctx=ctx)


def _model(spec: DraftSpec, draft_models: dict[str, Any], whole: DraftSpec | None = None) -> Any:
    if spec.name not in draft_models:
        if whole is not None:
            raise SpecDecError(f"draft '{spec.name}' of '{whole.name}' is not loaded")
        raise SpecDecError(f"draft '{spec.name}' is not loaded; pass it with --draft")
    return draft_models[spec.name]
