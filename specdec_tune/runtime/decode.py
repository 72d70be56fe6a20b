"""The speculative decoding loop and the plain autoregressive baseline it is measured against.

One step: the drafter proposes k <= gamma tokens; the target scores [last token, d_1..d_k] in ONE
forward over its KV cache; greedy keeps the longest prefix equal to the target's argmax, sampling
keeps d_i with probability min(1, p/q) and resamples the first rejection from norm(max(0, p - q));
either way the target adds one token of its own, and its cache is cropped back to what was kept.
At temperature 0 the output equals the target's own greedy decoding token for token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..errors import SpecDecError
from ..limits import check_decoding
from ..measurement import SpecStats
from .caches.modes import ExecutionContext, SeqCache
from .drafting.drafters import Drafter

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass
class Generation:
    tokens: list[int]  # new tokens only (the prompt excluded)
    stats: SpecStats


def _eos_set(eos: int | list[int] | None) -> set[int]:
    if eos is None:
        return set()
    return {eos} if isinstance(eos, int) else set(eos)


def _start(
    target: PreTrainedModel, prompt_ids: list[int], capacity: int, ctx: ExecutionContext | None
) -> SeqCache:
    # Everything but the last prompt token goes into the cache; the last one is fed by the first
    # decode step, so baseline and speculation start from the same state.
    if not prompt_ids:
        raise SpecDecError("the prompt is empty: nothing to condition on")
    seq = (ctx or ExecutionContext()).seq_cache(target, capacity)
    seq.prefill(prompt_ids[:-1])
    return seq


def append_tokens(out: list[int], new: list[int], eos: set[int], limit: int) -> bool:
    """Append tokens up to EOS or `limit`; True when generation is finished (both engines use it)."""
    for t in new:
        out.append(t)
        if t in eos or len(out) >= limit:
            return True
    return False


@torch.inference_mode()
def autoregressive_generate(
    target: PreTrainedModel,
    prompt_ids: list[int],
    max_new_tokens: int,
    temperature: float = 0.0,
    eos: int | list[int] | None = None,
    generator: torch.Generator | None = None,
    ctx: ExecutionContext | None = None,
) -> Generation:
    """The baseline: one target forward per token, same cache handling as the speculative loop;
    the target's cache is built under `ctx` (default: eager)."""
    check_decoding(0, 0.0, temperature, max_new_tokens)
    tgt = _start(target, prompt_ids, len(prompt_ids) + max_new_tokens + 1, ctx)
    device = tgt.device
    eos_set = _eos_set(eos)
    x = torch.tensor([prompt_ids[-1:]], dtype=torch.long, device=device)
    out: list[int] = []
    forwards = 0
    while True:
        logits = tgt.forward(x)[-1]
        forwards += 1
        if temperature == 0.0:
            tok = logits.argmax(-1, keepdim=True)
        else:
            tok = torch.multinomial(torch.softmax(logits.float() / temperature, -1), 1, generator=generator)
        t = tok.item()
        out.append(t)
        if t in eos_set or len(out) >= max_new_tokens:
            break
        x = tok.view(1, 1)
    return Generation(out, SpecStats(target_forwards=forwards, emitted=len(out)))


@torch.inference_mode()
def speculative_generate(
    target: PreTrainedModel,
    drafter: Drafter,
    prompt_ids: list[int],
    gamma: int,
    threshold: float = 0.0,
    temperature: float = 0.0,
    max_new_tokens: int = 128,
    eos: int | list[int] | None = None,
    generator: torch.Generator | None = None,
    ctx: ExecutionContext | None = None,
) -> Generation:
    """Speculative decoding of `prompt_ids` with `drafter` proposing up to `gamma` tokens per step;
    the target's cache is built under `ctx` (default: eager; the drafter holds its own)."""
    check_decoding(gamma, threshold, temperature, max_new_tokens)
    if gamma == 0:
        return autoregressive_generate(target, prompt_ids, max_new_tokens, temperature, eos, generator, ctx)
    tgt = _start(target, prompt_ids, len(prompt_ids) + max_new_tokens + gamma + 2, ctx)
    device = tgt.device
    drafter.start(prompt_ids)
    eos_set = _eos_set(eos)
    seq = list(prompt_ids)  # committed tokens; the last one is not in the target's cache yet
    out: list[int] = []
    steps: list[tuple[int, int, int]] = []  # (allowed g, proposed k, accepted n) per verification
    forwards = 0
    last = torch.tensor([seq[-1]], dtype=torch.long, device=device)
    while True:
        # Never draft past max_new_tokens: k drafts emit at most k + 1 tokens.
        g = min(gamma, max_new_tokens - len(out) - 1)
        draft, q = drafter.propose(seq, g, threshold, temperature, generator) if g > 0 else (last[:0], None)
        k = draft.numel()
        # A compiled engine verifies gamma + 1 slots every step (one graph); eager feeds k + 1.
        logits = tgt.forward(torch.cat((last, draft)).view(1, k + 1), gamma + 1)
        forwards += 1
        if temperature == 0.0:
            n, new = accept_greedy(logits[None], [draft.tolist()])[0]
        else:
            n, new = verify_sampling(logits, draft, q, temperature, generator)
        if k > n:
            tgt.crop(k - n)  # keep [last, d_1..d_n] in the target's cache
        steps.append((g, k, n))
        before = len(seq)
        done = append_tokens(out, new, eos_set, max_new_tokens)
        seq.extend(new)
        if done:
            break
        drafter.commit(before + n)
        last = torch.tensor([seq[-1]], dtype=torch.long, device=device)
    return Generation(out, SpecStats.from_steps(steps, forwards, len(out)))


def accept_greedy(logits: torch.Tensor, proposed: list[list[int]]) -> list[tuple[int, list[int]]]:
    """Greedy verification, one row per proposal (both engines use it): `logits` (rows, T, vocab)
    score each row's [last, d_1..d_k] (k < T; columns past k + 1 are padding). A row keeps the
    longest prefix of its drafts equal to the target's argmax, then adds the target's own token
    after it: (n, [d_1..d_n, t]) per row."""
    best = logits.argmax(-1).tolist()
    out = []
    for top, drafts in zip(best, proposed, strict=True):
        n = 0
        while n < len(drafts) and drafts[n] == top[n]:
            n += 1
        out.append((n, [*drafts[:n], top[n]]))
    return out


def verify_sampling(
    logits: torch.Tensor,
    draft: torch.Tensor,
    q: torch.Tensor | None,
    temperature: float,
    generator: torch.Generator | None,
) -> tuple[int, list[int]]:
    """Rejection sampling (Leviathan et al. 2023; Chen et al. 2023): exact for the target's p."""
    k = draft.numel()
    p = torch.softmax(logits.float() / temperature, -1)  # (k + 1, V)
    idx = torch.arange(k, device=p.device)
    if q is not None and q.shape[-1] != p.shape[-1]:  # draft and target LM heads padded differently
        width = max(q.shape[-1], p.shape[-1])
        q = torch.nn.functional.pad(q, (0, width - q.shape[-1]))
        p = torch.nn.functional.pad(p, (0, width - p.shape[-1]))
    p_tok = p[idx, draft]
    q_tok = q[idx, draft] if q is not None else torch.ones_like(p_tok)  # point mass: q(d) = 1
    u = torch.rand(k, generator=generator, device=p.device)
    n = int((u * q_tok < p_tok).cumprod(0).sum()) if k else 0  # u < p/q, no division by 0
    if n < k:
        if q is not None:
            residual = (p[n] - q[n]).clamp_min(0.0)
        else:
            residual = p[n].clone()
            residual[draft[n]] = 0.0
        total = residual.sum()
        # p == q up to rounding leaves no residual mass; then p itself is the right distribution.
        dist = residual / total if total > 0 else p[n]
    else:
        dist = p[k]
    bonus = int(torch.multinomial(dist, 1, generator=generator))
    new = draft[:n].tolist()
    new.append(bonus)
    return n, new
