"""The allowed range of every knob a user can set, defined once.

The engine, the CLI, the search settings and the profile schema all check against these, so a
value one of them accepts is never refused by another. Pure Python: no torch.
"""

from __future__ import annotations

import math
import numbers

from .errors import ContextTooLong, SpecDecError

MAX_GAMMA = 64  # draft tokens per step; gamma 0 means plain decoding (no speculation)
THRESHOLD_RANGE = "[0, 1)"  # draft confidence early stop; 0 = off, 1 would never propose twice

# Upper bounds on every number that sizes work, so a profile (from a pull request, say) cannot make
# `check` run for days or allocate without end. Far above any real run.
MAX_NEW_TOKENS = 32_768
MAX_PROMPTS = 100_000
MAX_BATCH_SIZE = 4_096
MAX_REPEATS = 1_000
MAX_TRIALS = 1_000_000
MAX_CONTEXT_LEN = 1 << 21
MAX_LAYERS = 4_096
MAX_PARAMS = 10**14
MAX_INT = 2**53  # any other integer in a profile (JSON and YAML readers agree up to here)


def _is_int(value: object) -> bool:
    # numbers.Integral so numpy / optuna integers pass too; bool is not a count.
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_gamma(gamma: object, *, allow_zero: bool = True, what: str = "gamma") -> int:
    """gamma in 0..MAX_GAMMA (1..MAX_GAMMA with `allow_zero=False`)."""
    low = 0 if allow_zero else 1
    if not _is_int(gamma) or not low <= gamma <= MAX_GAMMA:  # type: ignore[operator]
        zero = " (0 = no speculation)" if allow_zero else ""
        raise SpecDecError(f"{what} must be an integer in {max(low, 1)}..{MAX_GAMMA}{zero}, got {gamma!r}")
    return int(gamma)  # type: ignore[call-overload]


def threshold_ok(threshold: float) -> bool:
    return isinstance(threshold, numbers.Real) and 0.0 <= threshold < 1.0


def check_threshold(threshold: float, what: str = "threshold") -> float:
    if not threshold_ok(threshold):
        raise SpecDecError(f"{what} must be in {THRESHOLD_RANGE}, got {threshold!r}")
    return float(threshold)


def check_temperature(temperature: float) -> float:
    if not isinstance(temperature, numbers.Real) or not math.isfinite(temperature) or temperature < 0.0:
        raise SpecDecError(f"temperature must be >= 0, got {temperature!r}")
    return float(temperature)


def check_count(value: object, what: str, low: int = 1, high: int | None = None) -> int:
    """An integer count >= `low` (and <= `high` when given): max_new_tokens, repeats, prompts ..."""
    if not _is_int(value) or value < low:  # type: ignore[operator]
        raise SpecDecError(f"{what} must be an integer >= {low}, got {_short(value)}")
    if high is not None and value > high:  # type: ignore[operator]
        raise SpecDecError(f"{what} must be an integer in {low}..{high}, got {_short(value)}")
    return int(value)  # type: ignore[call-overload]


def _short(value: object) -> str:
    text = (
        repr(value)
        if not _is_int(value) or abs(value) < 10**30
        else f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    )  # type: ignore[arg-type]
    return text if len(text) <= 60 else text[:57] + "..."


def check_decoding(gamma: int, threshold: float, temperature: float, max_new_tokens: int) -> None:
    """The ranges of one decoding call, as SpecDecError (exit code 2 in the CLI)."""
    check_gamma(gamma)
    check_threshold(threshold)
    check_temperature(temperature)
    check_count(max_new_tokens, "max_new_tokens", high=MAX_NEW_TOKENS)


def parse_batch_sizes(text: str) -> list[int]:
    """`--batch-sizes 1,4,16` -> [1, 4, 16] (sorted, without repeats); anything else is a SpecDecError."""
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or any(not p.isdigit() or int(p) < 1 for p in parts):
        raise SpecDecError(
            f"--batch-sizes must be a comma-separated list of integers >= 1, e.g. 1,4,16; got {text!r}"
        )
    return sorted({int(p) for p in parts})


MIN_CONTEXT_LEN = 16  # a prompt shorter than this holds no context to speak of


def parse_context_lengths(text: str) -> list[int]:
    """`--context-lengths 256,2048,6144` -> [256, 2048, 6144] (sorted, without repeats)."""
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or any(not p.isdigit() or not MIN_CONTEXT_LEN <= int(p) <= MAX_CONTEXT_LEN for p in parts):
        raise SpecDecError(
            f"--context-lengths must be a comma-separated list of prompt lengths in tokens, each in "
            f"{MIN_CONTEXT_LEN}..{MAX_CONTEXT_LEN}, e.g. 256,2048,6144; got {text!r}"
        )
    return sorted({int(p) for p in parts})


def check_context(length: int, max_new_tokens: int, positions: int | None, target: str) -> None:
    """A prompt of `length` tokens and its budget (plus room for a draft of up to 16 tokens) must
    fit the positions `target` was trained for (None: its config does not say; not checked)."""
    needed = length + max_new_tokens + 16
    if positions is not None and needed > positions:
        raise ContextTooLong(
            f"context length {length} is past {target}'s {positions} positions "
            f"({length} prompt + {max_new_tokens} new tokens + 16 for a draft): left out"
        )
