"""A test-only hook: a planted regression of the speculative side, for benchmarks and tests.

With `SPECDEC_TEST_SLOWER_SPEC=1.15` in the environment every timed speculative part takes 1.15x
its own time (our engine sleeps 0.15x of each speculative prompt's seconds after it; llama.cpp's
and vLLM's speculative passes report 1.15x their decode milliseconds), as a slower draft kernel or a new
dependency would. Plain decoding is untouched, so the speedup drops by that factor. The fresh
processes `check` confirms in inherit the environment, so they carry it too. Never set it outside
a benchmark or a test: benchmarks/check_under_load.py plants 15 % with it.
"""

from __future__ import annotations

import os
import time

SLOWER_SPEC_ENV = "SPECDEC_TEST_SLOWER_SPEC"


def slower_spec_factor() -> float:
    """The planted factor (1.0: none, or an unreadable value)."""
    try:
        factor = float(os.environ.get(SLOWER_SPEC_ENV, "") or 1.0)
    except ValueError:
        return 1.0
    return factor if factor > 1.0 else 1.0


def sleep_for(elapsed_s: float, factor: float) -> None:
    """Sleep what makes `elapsed_s` of work take `factor` times as long (nothing at 1.0). A sleep,
    not a spin: it takes no CPU from the other side or from other processes."""
    if factor > 1.0:
        time.sleep((factor - 1.0) * elapsed_s)


def planted_pass(p: dict) -> dict:
    """An engine server's speculative pass (`{"ms", "tokens", "tok_s", ...}`) at the planted factor:
    its decode milliseconds times the factor (the server's own timings are what is measured)."""
    factor = slower_spec_factor()
    if factor > 1.0:
        p = {**p, "ms": p["ms"] * factor, "tok_s": p["tok_s"] / factor}
    return p
