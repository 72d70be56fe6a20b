"""vLLM's n-gram drafts replayed at temperature 0, without a server: what each `ngram:MIN-MAX` γ
would draft and have accepted on the plain server's own replies, so the engine model ranks n-gram
configs it never started a server for.

At T = 0 a speculative server emits the plain server's tokens (exactness, backends.vllm.measuring),
so a reply's whole course is fixed by the plain reply and the proposer's rule. The rule, read from
vLLM 0.32.0's `v1/spec_decode/ngram_proposer.py` (`_find_longest_matched_ngram_and_propose_tokens`):
the longest suffix of the context (prompt and reply so far) of at most `prompt_lookup_max` tokens
that also ends earlier in it (at least `prompt_lookup_min` long), at its earliest such occurrence;
the draft is the up to γ tokens after that occurrence (fewer near the context's end). A draft is
proposed after every step, the prefill's included; a step emits the accepted prefix of its draft
and one token of the target's, and the reply stops at its budget (the tokens a last step accepted
beyond it are not the reply's: backends.vllm.server.kept_accepted).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...search.enginemodel import DraftFit


def propose(context: Sequence[int], lo: int, hi: int, k: int) -> list[int]:
    """vLLM's n-gram draft of at most `k` tokens after `context` (module docstring)."""
    n = len(context)
    best, end = 0, -1
    for e in range(n - 1):  # earliest first: a later occurrence must be strictly longer to win
        m = 0
        while m < hi and m <= e and context[e - m] == context[n - 1 - m]:
            m += 1
        if m > best:
            best, end = m, e
            if best == hi:
                break
    if best < lo or end < 0:
        return []
    return list(context[end + 1 : end + 1 + k])


@dataclass
class Replay:
    """One reply replayed at one γ: its decode tokens (after the prefill's), the target forwards,
    the forwards that carried a draft, the tokens drafted and the drafted tokens it kept."""

    tokens: int = 0
    forwards: int = 0
    steps: int = 0
    drafted: int = 0
    kept: int = 0

    def add(self, other: Replay) -> Replay:
        return Replay(*(a + b for a, b in zip(self.astuple(), other.astuple(), strict=True)))

    def astuple(self) -> tuple[int, int, int, int, int]:
        return (self.tokens, self.forwards, self.steps, self.drafted, self.kept)


class Replayer:
    """The n-gram drafts of one (prompt, plain reply) pair, each context's draft found once at the
    longest γ asked (`max_gamma`) and cut for shorter ones."""

    def __init__(self, prompt: Sequence[int], reply: Sequence[int], lo: int, hi: int, max_gamma: int) -> None:
        self.reply = list(reply)
        context = list(prompt)
        self.drafts: list[list[int]] = []  # after the prompt and reply[:m + 1], m = 0 .. len - 2
        for m in range(len(self.reply) - 1):
            context.append(self.reply[m])
            self.drafts.append(propose(context, lo, hi, max_gamma))

    def replay(self, gamma: int) -> Replay:
        g, n = self.reply, len(self.reply)
        out = Replay(tokens=max(0, n - 1))
        m = 1  # the prefill emitted the first token
        while m < n:
            draft = self.drafts[m - 1][:gamma]
            accepted = 0
            while accepted < len(draft) and m + accepted < n and draft[accepted] == g[m + accepted]:
                accepted += 1
            emitted = min(accepted + 1, n - m)
            out.forwards += 1
            out.steps += 1 if draft else 0
            out.drafted += len(draft)
            out.kept += emitted - 1
            m += emitted
        return out


def replay_all(pairs: Sequence[tuple[Sequence[int], Sequence[int]]], lo: int, hi: int, gamma: int) -> Replay:
    """Every (prompt, plain reply) pair replayed at `gamma` and summed."""
    total = Replay()
    for prompt, reply in pairs:
        total = total.add(Replayer(prompt, reply, lo, hi, gamma).replay(gamma))
    return total


def as_fit(r: Replay, draft: str, gamma: int) -> DraftFit | None:
    """A replay as the engine model's fit of `draft` at `gamma` (search.enginemodel.DraftFit): the
    share of tokens from drafting forwards, and per drafting forward the tokens drafted and kept."""
    if r.tokens <= 0:
        return None
    accepted, drafted = (r.kept / r.steps, r.drafted / r.steps) if r.steps else (0.0, 0.0)
    alpha = r.kept / r.drafted if r.drafted else 0.0
    share = (r.kept + r.steps) / r.tokens
    return DraftFit(draft, 0.0, alpha, share, [gamma], fixed_length=False, accepted=accepted, drafted=drafted)
