"""What the llama.cpp backend sends and keeps: a pass's prompts (`TextCase`), one server reply,
and one config's measurement with its evidence (`EngineMeasurement`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...domain import Metrics
from .counters import RequestStats

NEAR_TIE = 0.05  # plain top-1 minus top-2 probability below this: a near-tie, not a bug
# Drafts whose state outlives a request (ngram-mod's n-gram pool is shared by every request of a
# server; the n-gram maps and the n-gram cache keep a slot's keys from one request to the next):
# timed on a fresh server per pass, else repeating the workload would teach them the answers.
STATEFUL_KINDS = ("ngram_mod", "ngram_map_k", "ngram_map_k4v", "ngram_cache")
WARMUP_PROMPT = "Once upon a time"


@dataclass
class TextCase:
    """What one pass sends: prompts as the model sees them (chat template applied) and budgets."""

    prompts: list[str]
    max_new_tokens: list[int]
    temperature: float = 0.0

    def head(self, n: int) -> TextCase:
        return TextCase(self.prompts[:n], self.max_new_tokens[:n], self.temperature)

    def pick(self, indices: list[int], max_new_tokens: int | None = None) -> TextCase:
        """The prompts at `indices`, in that order; their budgets at most `max_new_tokens`."""
        cap = max_new_tokens or max(self.max_new_tokens, default=0)
        return TextCase(
            [self.prompts[i] for i in indices],
            [min(self.max_new_tokens[i], cap) for i in indices],
            self.temperature,
        )

    def part(self, start: int, stop: int) -> TextCase:
        """Prompts `start` to `stop` (exclusive)."""
        return TextCase(self.prompts[start:stop], self.max_new_tokens[start:stop], self.temperature)


@dataclass
class EngineMeasurement:
    """One config measured in an engine: metrics and the evidence (per-repeat speedups, exactness)."""

    metrics: Metrics
    tokens: int
    mismatches: int  # prompts whose T = 0 tokens differ from the plain server's
    speedups: list[float] = field(default_factory=list)
    exactness: dict[str, Any] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)
    requests: list[RequestStats] = field(default_factory=list)  # every timed one, both sides, in order

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.metrics.as_dict(),
            "tokens": self.tokens,
            "mismatches": self.mismatches,
            "speedups": list(self.speedups),
            "exactness": dict(self.exactness),
            "flags": list(self.flags),
            "requests": [r.as_dict() for r in self.requests],
        }


@dataclass
class _Reply:
    tokens: list[int]
    predicted_n: int
    predicted_ms: float
    draft_n: int
    draft_accepted: int
    probs: list[list[float]] = field(default_factory=list)  # top-2 probabilities per token
    n_predict: int = 0
