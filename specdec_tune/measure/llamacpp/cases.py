"""What the llama.cpp backend sends and keeps: a pass's prompts (`TextCase`), one server reply,
and the exactness rule's near-tie margin."""

from __future__ import annotations

from dataclasses import dataclass, field

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
class _Reply:
    tokens: list[int]
    predicted_n: int
    predicted_ms: float
    draft_n: int
    draft_accepted: int
    probs: list[list[float]] = field(default_factory=list)  # top-2 probabilities per token
    n_predict: int = 0
    prompt_n: int = 0  # prompt tokens the server processed for it (1 when its slot held the prompt)
