"""Hybrid drafting: prompt lookup proposes where the sequence repeats itself, a draft model continues
where the lookup's match runs out or there is none, all within the same gamma.

Exactness: the lookup's tokens are a deterministic function of the committed sequence, so their
proposal distribution is a point mass; the model's tokens have the model's q, conditioned on the
sequence plus the lookup's tokens. Under sampling the verifier gets one q row per position: one-hot
rows for lookup positions, the model's q for the rest (`decode.verify_sampling` then accepts a
lookup token with probability p(x), like plain prompt lookup). Counters per source say who
proposed what and how much of it was accepted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ...domain import DraftSpec
from .drafters import Drafter, ModelDrafter, PromptLookupDrafter
from .rows import BatchDrafter, OneRow, PerRow

LOOKUP = "prompt-lookup"


def hybrid_parts(spec: DraftSpec) -> tuple[DraftSpec, DraftSpec]:
    """The lookup and the model component of a kind-"hybrid" spec (named as in its name)."""
    lookup = DraftSpec(
        LOOKUP,
        "prompt_lookup",
        ngram_min=spec.ngram_min or 1,
        ngram_max=spec.ngram_max or 3,
        lookup_match=spec.lookup_match,
    )
    if spec.layers:
        model = DraftSpec(
            f"layer-skip-{spec.layers}", "layer_skip", layers=spec.layers, threshold_mode=spec.threshold_mode
        )
    else:
        name = spec.name.split("+", 1)[1] if "+" in spec.name else (spec.path or "draft")
        model = DraftSpec(name, "model", path=spec.path or name, threshold_mode=spec.threshold_mode)
    return lookup, model


@dataclass
class SourceCounts:
    """Draft tokens proposed and accepted per source, over committed steps."""

    lookup_proposed: int = 0
    lookup_accepted: int = 0
    model_proposed: int = 0
    model_accepted: int = 0
    steps: int = 0
    lookup_steps: int = 0  # steps where the lookup proposed something

    def record(self, m: int, k_model: int, accepted: int) -> None:
        self.steps += 1
        self.lookup_steps += m > 0
        self.lookup_proposed += m
        self.model_proposed += k_model
        self.lookup_accepted += min(accepted, m)
        self.model_accepted += max(0, min(accepted - m, k_model))

    def as_dict(self, model_name: str) -> dict[str, dict[str, float]]:
        total = self.lookup_proposed + self.model_proposed
        out = {}
        for name, proposed, accepted in (
            (LOOKUP, self.lookup_proposed, self.lookup_accepted),
            (model_name, self.model_proposed, self.model_accepted),
        ):
            out[name] = {
                "proposed": float(proposed),
                "accepted": float(accepted),
                "acceptance_rate": accepted / proposed if proposed else 0.0,
                "share": proposed / total if total else 0.0,
            }
        out[LOOKUP]["steps_with_match"] = self.lookup_steps / self.steps if self.steps else 0.0
        return out


def mixed_q(lookup: torch.Tensor, q: torch.Tensor | None, temperature: float) -> torch.Tensor | None:
    """q for [lookup tokens, model tokens]: one-hot rows (point masses) then the model's rows.
    None when every position is a point mass (greedy, or nothing from the model)."""
    if temperature == 0.0 or q is None:
        return None
    if lookup.numel() == 0:
        return q
    width = max(q.shape[-1], int(lookup.max()) + 1)
    if width > q.shape[-1]:
        q = torch.nn.functional.pad(q, (0, width - q.shape[-1]))
    onehot = torch.zeros(lookup.numel(), width, dtype=q.dtype, device=q.device)
    onehot[torch.arange(lookup.numel(), device=q.device), lookup.to(q.device)] = 1.0
    return torch.cat((onehot, q))


class BatchHybridDrafter(BatchDrafter):
    """The hybrid, keyed by row: per-row lookup, then one batched model draft for the rows whose
    lookup left room (batch 1 is its row 0, `HybridDrafter`)."""

    def __init__(self, lookup: BatchDrafter, drafter: BatchDrafter, name: str) -> None:
        self.lookup, self.drafter, self.name = lookup, drafter, name
        self.rows, self.device = drafter.rows, drafter.device
        # the model part's rows (measure.surface sizes its probe by them)
        self.kv = getattr(drafter, "kv", None)
        self.counts = SourceCounts()
        self._pending: dict[int, tuple[int, int, int]] = {}  # row: (len(seq), lookup k, model k)

    def start(self, row: int, prompt_ids: list[int]) -> None:
        self.lookup.start(row, prompt_ids)
        self.drafter.start(row, prompt_ids)
        self._pending.pop(row, None)

    def propose(self, seqs, gammas, threshold, temperature, generator):
        looks = self.lookup.propose(seqs, gammas, threshold, temperature, generator)
        ext, rest = {}, {}
        for r, seq in seqs.items():
            look = looks[r][0]
            # the model drafts on from the lookup's last token, or from seq without a match
            ext[r] = seq + look.tolist() if look.numel() else seq
            rest[r] = gammas[r] - look.numel()
        conts = self.drafter.propose(ext, rest, threshold, temperature, generator)
        out = {}
        for r in seqs:
            look = looks[r][0].to(self.device)
            cont, q = conts[r]
            self._pending[r] = (len(seqs[r]), look.numel(), cont.numel())
            out[r] = (torch.cat((look, cont)), mixed_q(look, q, temperature))
        return out

    def commit(self, row: int, valid_len: int) -> None:
        self.drafter.commit(row, valid_len)
        pending = self._pending.pop(row, None)
        if pending is not None:
            before, m, k = pending
            self.counts.record(m, k, valid_len - before)

    def source_stats(self) -> dict[str, dict[str, float]]:
        return self.counts.as_dict(self.drafter.name)

    def reset_sources(self) -> None:
        self.counts = SourceCounts()

    def count_into(self, counts: SourceCounts) -> None:
        self.counts = counts


class HybridDrafter(OneRow):
    """Batch-1 hybrid: `lookup` first, `drafter` (a model or layer-skip drafter) fills the rest."""

    def __init__(self, lookup: PromptLookupDrafter, drafter: ModelDrafter, name: str) -> None:
        super().__init__(BatchHybridDrafter(PerRow([lookup]), PerRow([drafter]), name), "hybrid")
        self.lookup, self.drafter = lookup, drafter  # the parts (measure.costs times each alone)


def _inner_with(drafter: object, method: str) -> Callable[..., Any] | None:
    """`drafter`'s own `method`, or that of the first drafter it wraps (policies, row adapters)."""
    while drafter is not None:
        found = getattr(drafter, method, None)
        if found is not None:
            return found
        drafter = getattr(drafter, "inner", None)
    return None


def source_stats(drafter: Drafter | BatchDrafter) -> dict[str, dict[str, float]]:
    """Per-source counters of a drafter (through its wrappers); {} for single-source ones."""
    get = _inner_with(drafter, "source_stats")
    return get() if get is not None else {}


def reset_sources(drafter: Drafter | BatchDrafter) -> None:
    reset = _inner_with(drafter, "reset_sources")
    if reset is not None:
        reset()


def counts_setter(drafter: Drafter | BatchDrafter) -> Callable[[SourceCounts], None] | None:
    """What points `drafter`'s per-source counters (through its wrappers) at a SourceCounts of the
    caller's, so that configs sharing one drafter object count apart; None for single-source ones."""
    return _inner_with(drafter, "count_into")
