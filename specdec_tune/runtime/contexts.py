"""Context length as a workload axis: `fit_prompt` puts real text before a request until the prompt is
about L tokens by the target's own tokenizer, `fit_workload` fits every prompt of a workload, and
`prompt_lengths` reports the token counts a fitted workload really has.

What goes before the request, nearest first: a chat's earlier turns (whole turns, the latest kept),
then the prompt's own `context` taken from its end (the text right before the request), then
`padding` (other real text) when that is too short. The request itself is never cut.

Example, with whitespace-separated words as tokens (`count = lambda s: len(s.split())`): a module
of six two-line functions (36 words) before a 5-word request::

    ctx = "def f1(x):\n    return x + 1\n\n" ... "def f6(x):\n    return x + 6\n"
    p = Prompt("Add a docstring to f6.", context=ctx)
    fit_prompt(p, 20, count).text
    # "def f5(x):\n    return x + 5\n\ndef f6(x):\n    return x + 6\n\nAdd a docstring to f6."
    # 17 words: the context's end, cut at a line start; 17 is within tolerance(20) = 8 of 20.
    fit_prompt(p, 60, count, padding="A note on style: keep functions short.").text
    # "A note on style: keep functions short.\n\ndef f1(x):\n ... return x + 6\n\nAdd a docstring to f6."
    # 48 words: all the text there is, padding first; a prompt ends short of L only when text runs out.
"""

from __future__ import annotations

import bisect
import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..errors import SpecDecError
from .workloads import Prompt, Workload, _join_messages, contexts_root

SEPARATOR = "\n\n"
# Tokenizer calls per prompt: llama.cpp's /tokenize is an HTTP round trip of a whole long prompt.
MAX_CALLS = 15

CountTokens = Callable[[str], int]


def tolerance(length: int) -> int:
    """How far below `length` a fitted prompt may end: max(2 %, 8 tokens). It never ends above."""
    return max(8, length // 50)


@dataclass
class _Parts:
    """A prompt split around its request. For a plain prompt only `request` (its text) is set."""

    lead: list[dict[str, str]]  # leading system messages: instructions, never cut
    turns: list[list[dict[str, str]]]  # earlier turns, each starting at a user message
    request: list[dict[str, str]]  # the last user message and anything after it


def _split(prompt: Prompt) -> _Parts:
    messages = prompt.messages or []
    n_lead = 0
    while n_lead < len(messages) - 1 and messages[n_lead]["role"] == "system":
        n_lead += 1
    rest = messages[n_lead:]
    users = [i for i, m in enumerate(rest) if m["role"] == "user"]
    start = users[-1] if users else max(len(rest) - 1, 0)
    turns: list[list[dict[str, str]]] = []
    for m in rest[:start]:
        if m["role"] == "user" or not turns:
            turns.append([])
        turns[-1].append(m)
    return _Parts(messages[:n_lead], turns, rest[start:])


def _build(prompt: Prompt, parts: _Parts, kept: int, prefix: str) -> Prompt:
    """The prompt with its last `kept` earlier turns and `prefix` (context text) before the rest."""
    prefix = prefix.lstrip("\n").rstrip()
    if prompt.messages is None:
        text = prefix + SEPARATOR + prompt.text if prefix else prompt.text
        return Prompt(text, prompt.category, prompt.max_new_tokens, None)
    body = [dict(m) for turn in parts.turns[len(parts.turns) - kept :] for m in turn] + [
        dict(m) for m in parts.request
    ]
    if prefix:
        # Into the first user message, as a user pastes a file or document into a chat.
        first = next((m for m in body if m["role"] == "user"), body[0])
        first["content"] = prefix + SEPARATOR + first["content"]
    messages = [dict(m) for m in parts.lead] + body
    return Prompt(_join_messages(messages), prompt.category, prompt.max_new_tokens, messages)


def inline_context(prompt: Prompt) -> Prompt:
    """The prompt with all its own `context` placed before the request, as `fit_prompt` places it."""
    parts = _split(prompt)
    return _build(prompt, parts, len(parts.turns), prompt.context or "")


class _Counter:
    """count_tokens with a cache and a call budget, over the text of candidate prompts."""

    def __init__(self, count_tokens: CountTokens, budget: int) -> None:
        self.count_tokens, self.budget, self.calls = count_tokens, budget, 0
        self.cache: dict[str, int] = {}

    def __call__(self, prompt: Prompt) -> int | None:
        """The prompt's token count, or None once the budget is spent."""
        if prompt.text not in self.cache:
            if self.calls >= self.budget:
                return None
            self.calls += 1
            self.cache[prompt.text] = int(self.count_tokens(prompt.text))
        return self.cache[prompt.text]


def _search(
    xs: list[int], lo: tuple[int, int], hi: tuple[int, int], f: Callable[[int], int | None], length: int
) -> tuple[tuple[int, int], tuple[int, int]]:
    """Narrow the bracket (x, tokens) lo <= length < hi over the sorted candidates xs, stopping once
    lo is within the tolerance. Interpolation steps (token counts are close to linear in characters),
    with a bisection whenever one did not halve the bracket, so the worst case stays logarithmic."""
    aim = length - tolerance(length) / 2
    i_lo, i_hi = xs.index(lo[0]), xs.index(hi[0])
    bisect_next = False
    while i_hi - i_lo > 1 and lo[1] < length - tolerance(length):
        if bisect_next or hi[1] == lo[1]:
            j = (i_lo + i_hi) // 2
        else:
            x = lo[0] + (aim - lo[1]) * (hi[0] - lo[0]) / (hi[1] - lo[1])
            j = min(max(bisect.bisect_left(xs, x), i_lo + 1), i_hi - 1)
        tokens = f(xs[j])
        if tokens is None:
            break  # out of tokenizer calls: the best fit so far
        width = i_hi - i_lo
        if tokens <= length:
            i_lo, lo = j, (xs[j], tokens)
        else:
            i_hi, hi = j, (xs[j], tokens)
        bisect_next = (i_hi - i_lo) * 2 > width
    return lo, hi


def _line_starts(text: str) -> list[int]:
    """Characters kept from the end of `text` when it is cut at each line start, ascending."""
    return sorted({0, *(len(text) - i for i in [0, *(k + 1 for k, c in enumerate(text) if c == "\n")])})


def _word_starts(text: str, lo: int, hi: int) -> list[int]:
    """Characters kept when `text` is cut at a word start strictly between kept lengths lo and hi."""
    n = len(text)
    return [n - i for i in range(n - lo - 1, n - hi, -1) if text[i - 1] in " \t" and not text[i].isspace()]


def fit_prompt(prompt: Prompt, length: int, count_tokens: CountTokens, padding: str | None = None) -> Prompt:
    """A new prompt of about `length` tokens (by `count_tokens`, the target's own tokenizer) that ends
    with the whole request.

    Before the request goes, nearest first: a chat's earlier turns, whole and latest first (dropping
    the earliest keeps the roles alternating); then the prompt's own `context` (and, in a chat, the
    dropped turns as `role: content` lines) taken from its end, cut at a line start; then `padding`
    (real text, e.g. another module) when all that is too short. When a line boundary misses the
    tolerance (a long line), the cut moves to a word start inside that line.

    In a chat the context text goes at the start of the first kept user message, followed by a blank
    line: that is how a user pastes a file or a document into a chat, so a model sees it as it would
    in use. Earlier turns made up around it would put replies in the assistant's mouth that it never
    wrote, and a separate leading user turn breaks templates that require alternating roles.

    The count is of `text` (for a chat the template-free rendering, which `messages` stay consistent
    with; a chat template adds a few tokens per turn). The result is at most `length` tokens and at
    least `length - tolerance(length)` when the text allows, in at most MAX_CALLS tokenizer calls.
    When the request alone is longer than `length`, it is returned whole without context, with a
    warning: `prompt_lengths` gives the real length. `category` and `max_new_tokens` are kept;
    the result has no `context` of its own (it is in `text`/`messages` now).
    """
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise SpecDecError(f"a context length must be an integer >= 1, got {length!r}")
    count, tol = _Counter(count_tokens, MAX_CALLS), tolerance(length)
    parts = _split(prompt)
    bare = _build(prompt, parts, 0, "")
    n_bare = count(bare)
    assert n_bare is not None  # the first call is always within the budget
    if n_bare >= length - tol:
        if n_bare > length:
            warnings.warn(
                f"a request alone is {n_bare} tokens, over the context length {length}: it is kept "
                "whole, without context",
                stacklevel=2,
            )
        return bare

    # 1. Whole earlier turns, the latest first.
    n_turns = len(parts.turns)
    best = (0, n_bare)
    if n_turns:
        n_all = count(_build(prompt, parts, n_turns, ""))
        if n_all is not None and n_all <= length:
            best = (n_turns, n_all)
        elif n_all is not None:
            best, _ = _search(
                list(range(n_turns + 1)),
                best,
                (n_turns, n_all),
                lambda k: count(_build(prompt, parts, k, "")),
                length,
            )
    kept, n_kept = best
    if n_kept >= length - tol:
        return _build(prompt, parts, kept, "")

    # 2. Context text before those turns, cut from its start.
    dropped = [m for turn in parts.turns[: n_turns - kept] for m in turn]
    transcript = "\n".join(f"{m['role']}: {m['content']}" for m in dropped)
    pieces = [p.strip("\n") for p in (padding, prompt.context, transcript) if p and p.strip()]
    text = SEPARATOR.join(pieces)
    if not text:
        return _build(prompt, parts, kept, "")

    def f(x: int) -> int | None:
        return count(_build(prompt, parts, kept, text[len(text) - x :]))

    n_full = f(len(text))
    if n_full is None or n_full <= length:
        return _build(prompt, parts, kept, text if n_full is not None else "")
    lo, hi = _search(_line_starts(text), (0, n_kept), (len(text), n_full), f, length)
    words = _word_starts(text, lo[0], hi[0])
    if lo[1] < length - tol and words:
        lo, _ = _search([lo[0], *words, hi[0]], lo, hi, f, length)
    return _build(prompt, parts, kept, text[len(text) - lo[0] :])


@functools.lru_cache(maxsize=1)
def _shipped_texts() -> tuple[str, ...]:
    entries = sorted(contexts_root().iterdir(), key=lambda e: e.name)
    # Prose last: the pool is cut from its end, and a document pasted before a request reads
    # naturally before any prompt; code modules follow only when L needs more than the documents.
    entries.sort(key=lambda e: e.name.startswith("reference-"))
    return tuple(e.read_text(encoding="utf-8") for e in entries if e.name.endswith(".txt"))


def padding_pool(exclude: str | None = None) -> str:
    """The shipped long texts (data/contexts) joined, without `exclude` (a prompt's own context)."""
    return SEPARATOR.join(t.strip("\n") for t in _shipped_texts() if t != exclude)


def fit_workload(
    workload: Workload, length: int, count_tokens: CountTokens, padding: str | None = None
) -> Workload:
    """Every prompt fitted to `length` tokens. Padding, when a prompt's own context runs short, is
    `padding` or else the shipped texts (`padding_pool`) other than the prompt's own. The workload is
    named `<name>@L<length>` and its source says the length."""
    prompts = [
        fit_prompt(p, length, count_tokens, padding if padding is not None else padding_pool(p.context))
        for p in workload.prompts
    ]
    return replace(
        workload, name=f"{workload.name}@L{length}", prompts=prompts, source=f"{workload.source}@L{length}"
    )


def prompt_lengths(workload: Workload, count_tokens: CountTokens) -> list[int]:
    """Each prompt's token count as the model gets it (own context placed, if not fitted yet)."""
    return [int(count_tokens(inline_context(p).text if p.context else p.text)) for p in workload.prompts]


def workload_as_sent(workload: Workload, length: int | None, count_tokens: CountTokens) -> Workload:
    """What a session sends: every prompt fitted to `length` tokens, or with its own context placed
    before its request when no length is asked for (a prompt's `context` is never left out)."""
    if length is not None:
        return fit_workload(workload, length, count_tokens)
    if all(p.context is None for p in workload.prompts):
        return workload
    return replace(workload, prompts=[inline_context(p) for p in workload.prompts])
