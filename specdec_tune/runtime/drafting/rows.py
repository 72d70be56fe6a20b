"""The row-keyed drafter interface of the batched engine, and the adapters that make batch 1 one row.

`drafters.Drafter` drafts one sequence (the batch-1 engine); `BatchDrafter` drafts for rows keyed
by index (the batched engine). What learns from its steps (gamma policies, the hybrid) is written
once against `BatchDrafter`: `PerRow` lifts batch-1 drafters to rows, `OneRow` drives a row-keyed
drafter as a batch-1 one (the sequence is its row 0). Free of torch at import, so the gamma
policies (and the cost model that reads them) load without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from .drafters import Drafter


class BatchDrafter:
    """Interface: `start` a row on a new prompt, `propose` for several rows, `commit` a row.

    Implementations also carry `name`, `rows` (how many rows) and `device` (where drafts live).
    """

    name = "drafter"
    rows = 1

    def start(self, row: int, prompt_ids: list[int]) -> None:
        """Row `row` now decodes `prompt_ids` (its previous sequence is forgotten)."""

    def propose(
        self,
        seqs: dict[int, list[int]],
        gammas: dict[int, int],
        threshold: float,
        temperature: float,
        generator: torch.Generator | None,
    ) -> dict[int, tuple[torch.Tensor, torch.Tensor | None]]:
        """Per row: up to gammas[row] draft ids after seqs[row], and their distributions q (or None
        for a point mass)."""
        raise NotImplementedError

    def commit(self, row: int, valid_len: int) -> None:
        """The row's first `valid_len` tokens of seq + proposal are committed."""


class PerRow(BatchDrafter):
    """One batch-1 drafter per row, side by side (prompt lookup has nothing to batch)."""

    def __init__(self, drafters: list[Any]) -> None:
        import torch

        self.drafters = drafters
        self.name, self.rows = drafters[0].name, len(drafters)
        self.device = getattr(drafters[0], "device", "cpu")
        self._empty = torch.empty(0, dtype=torch.long, device=self.device)

    def start(self, row: int, prompt_ids: list[int]) -> None:
        self.drafters[row].start(prompt_ids)

    def propose(self, seqs, gammas, threshold, temperature, generator):
        # A row without room drafts nothing (a batch-1 drafter is never asked for 0 tokens).
        return {
            r: self.drafters[r].propose(seq, gammas[r], threshold, temperature, generator)
            if gammas[r] > 0
            else (self._empty, None)
            for r, seq in seqs.items()
        }

    def commit(self, row: int, valid_len: int) -> None:
        self.drafters[row].commit(valid_len)


class OneRow:
    """A row-keyed drafter driven as a batch-1 drafter: the sequence is its row 0."""

    def __init__(self, inner: BatchDrafter, kind: str = "none") -> None:
        self.inner, self.kind = inner, kind
        self.name, self.device = inner.name, inner.device

    def start(self, prompt_ids: list[int]) -> None:
        self.inner.start(0, prompt_ids)

    def propose(self, seq, gamma, threshold, temperature, generator):
        return self.inner.propose({0: seq}, {0: gamma}, threshold, temperature, generator)[0]

    def commit(self, valid_len: int) -> None:
        self.inner.commit(0, valid_len)


def as_rows(drafter: Drafter | OneRow) -> BatchDrafter:
    """A batch-1 drafter as one row of a row-keyed drafter (a `OneRow` gives back what it drives)."""
    return drafter.inner if isinstance(drafter, OneRow) else PerRow([drafter])
