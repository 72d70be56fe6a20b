"""The drafter factories: a `DraftSpec` and an execution context -> the drafter that spec describes.

Kept apart from the drafter classes so those stay leaves (drafters, hybrid and batch import no
factory, the factory imports them all), and every drafter is built under the context it is given.
"""

from __future__ import annotations

from typing import Any

from ...domain import DraftSpec
from ...errors import SpecDecError
from ..batch import BatchDrafter, BatchLookupDrafter, BatchModelDrafter
from ..caches.modes import ExecutionContext
from .drafters import Drafter, LayerSkipDrafter, ModelDrafter, PromptLookupDrafter, truncated_view
from .hybrid import LOOKUP, BatchHybridDrafter, HybridDrafter, hybrid_parts


def build_drafter(
    spec: DraftSpec, target: Any, draft_models: dict[str, Any], ctx: ExecutionContext | None = None
) -> Drafter | None:
    """The batch-1 drafter `spec` describes (None for kind "none", the plain target).

    `draft_models` maps a draft's name to its loaded model (transformers module); the drafter's
    caches are built under `ctx` (default: eager).
    """
    if spec.kind == "none":
        return None
    if spec.kind == "model":
        return ModelDrafter(
            _model(spec, draft_models), spec.name, threshold_mode=spec.threshold_mode, ctx=ctx
        )
    if spec.kind == "prompt_lookup":
        device = next(target.parameters()).device
        return PromptLookupDrafter(
            spec.ngram_min or 1, spec.ngram_max or 3, device, spec.name, spec.lookup_match
        )
    if spec.kind == "layer_skip":
        return LayerSkipDrafter(target, int(spec.layers or 1), spec.name, spec.threshold_mode, ctx=ctx)
    if spec.kind == "hybrid":
        return _hybrid(spec, target, draft_models, ctx)
    raise SpecDecError(f"unknown draft kind '{spec.kind}'")


def build_batch_drafter(
    spec: DraftSpec,
    target: Any,
    draft_models: dict[str, Any],
    rows: int,
    ctx: ExecutionContext | None = None,
) -> BatchDrafter | None:
    """The batched drafter `spec` describes for `rows` rows (None for kind "none")."""
    if spec.kind == "none":
        return None
    if spec.kind == "model":
        return BatchModelDrafter(
            _model(spec, draft_models), rows, spec.name, threshold_mode=spec.threshold_mode, ctx=ctx
        )
    if spec.kind == "prompt_lookup":
        device = next(target.parameters()).device
        return BatchLookupDrafter(
            rows, spec.ngram_min or 1, spec.ngram_max or 3, device, spec.name, spec.lookup_match
        )
    if spec.kind == "layer_skip":
        view = truncated_view(target, int(spec.layers or 1))
        return BatchModelDrafter(view, rows, spec.name, threshold_mode=spec.threshold_mode, ctx=ctx)
    if spec.kind == "hybrid":
        return _batch_hybrid(spec, target, draft_models, rows, ctx)
    raise SpecDecError(f"unknown draft kind '{spec.kind}'")


def _model(spec: DraftSpec, draft_models: dict[str, Any], whole: DraftSpec | None = None) -> Any:
    if spec.name not in draft_models:
        if whole is not None:
            raise SpecDecError(f"draft '{spec.name}' of '{whole.name}' is not loaded")
        raise SpecDecError(f"draft '{spec.name}' is not loaded; pass it with --draft")
    return draft_models[spec.name]


def _hybrid(
    spec: DraftSpec, target: Any, draft_models: dict[str, Any], ctx: ExecutionContext | None
) -> HybridDrafter:
    lookup_spec, model_spec = hybrid_parts(spec)
    device = next(target.parameters()).device
    lookup = PromptLookupDrafter(
        lookup_spec.ngram_min, lookup_spec.ngram_max, device, LOOKUP, lookup_spec.lookup_match
    )
    if model_spec.kind == "layer_skip":
        model: ModelDrafter = LayerSkipDrafter(
            target, int(model_spec.layers or 1), model_spec.name, spec.threshold_mode, ctx=ctx
        )
    else:
        module = _model(model_spec, draft_models, spec)
        model = ModelDrafter(module, model_spec.name, threshold_mode=spec.threshold_mode, ctx=ctx)
    return HybridDrafter(lookup, model, spec.name)


def _batch_hybrid(
    spec: DraftSpec, target: Any, draft_models: dict[str, Any], rows: int, ctx: ExecutionContext | None
) -> BatchHybridDrafter:
    lookup_spec, model_spec = hybrid_parts(spec)
    device = next(target.parameters()).device
    lookup = BatchLookupDrafter(
        rows, lookup_spec.ngram_min, lookup_spec.ngram_max, device, LOOKUP, lookup_spec.lookup_match
    )
    if model_spec.kind == "layer_skip":
        module = truncated_view(target, int(model_spec.layers or 1))
    else:
        module = _model(model_spec, draft_models, spec)
    model = BatchModelDrafter(module, rows, model_spec.name, threshold_mode=spec.threshold_mode, ctx=ctx)
    return BatchHybridDrafter(lookup, model, rows, spec.name, model_spec.name)
