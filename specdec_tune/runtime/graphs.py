"""Never time a compile: build every graph a timed pass can need before the timing starts.

A compiled cache (`slots.SlotCache` under `--engine compiled`) builds one graph per input width
on first use. A warm-up pass over one prompt misses widths that other prompts reach: near the
end of a request the draft budget shrinks (`min(gamma, budget - out - 1)`), so a draft's catch-up
runs at every width 2..gamma + 1, and which ones a prompt hits depends on its acceptance. Those
graphs would compile inside the timed region (a 0.18x "speedup" on a GPT-2 pair, issue 21).

`prebuild` builds them all explicitly after the warm-up: the target needs width 1 (a decode step)
and gamma + 1 (verification, always padded); any other compiled cache (a draft, a layer-skip view)
needs every width 1..gamma + 1. `GraphBuild` carries what it cost (graphs, seconds), recorded apart
from the timing, and how many graphs still appeared inside a timed region (`in_timing`, 0 when
the prebuild covered everything; the measuring code re-times a pass that saw one). The session's
`ExecutionContext` adds up every graph its caches build and their seconds (`compile_time`): a
profile and a costs file record them apart from the measurements.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, TypeVar

from ..measurement import GraphBuild
from .caches.modes import ExecutionContext
from .caches.slots import compile_events

if TYPE_CHECKING:
    from transformers import PreTrainedModel

T = TypeVar("T")


def widths_for(is_target: bool, gammas: list[int]) -> list[int]:
    """The input widths a compiled cache can see in a pass at these gammas (0 = plain decoding)."""
    top = max([0, *gammas])
    if is_target:
        return sorted({1} | {g + 1 for g in gammas if g > 0})
    return list(range(1, top + 2))


def prebuild(
    ctx: ExecutionContext | None,
    target: PreTrainedModel,
    gammas: list[int],
    only: Collection[PreTrainedModel] | None = None,
) -> int:
    """Build every graph the compiled caches of `ctx` can need at `gammas` (with `only`, a
    collection of models: only theirs); returns how many were built. Every row of those caches is
    emptied (call it between passes, never inside one)."""
    if ctx is None or not ctx.compiled:
        return 0
    before = compile_events()
    for model, per_rows in list(ctx.caches.items()):
        if only is not None and not any(model is m for m in only):
            continue
        for kv in list(per_rows.values()):
            if getattr(kv, "compiled", False):
                kv.warm(widths_for(model is target, gammas))
    return compile_events() - before


class Untimed:
    """Brackets warm-up and prebuild: `with Untimed(build): ...` adds graphs and seconds."""

    def __init__(self, build: GraphBuild) -> None:
        self.build = build

    def __enter__(self) -> Untimed:
        self._events, self._t0 = compile_events(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.build.graphs += compile_events() - self._events
        self.build.seconds += time.perf_counter() - self._t0


def timed_without_compiles(run: Callable[[], T], build: GraphBuild, attempts: int = 3) -> T | None:
    """`run()` (a whole interleaved timing), repeated while a graph was built inside it (the
    count recorded in `build`), at most `attempts` times; the last attempt's result is kept."""
    result = None
    for _ in range(max(1, attempts)):
        before = compile_events()
        result = run()
        new = compile_events() - before
        if new == 0:
            return result
        build.in_timing += new
        build.retimed += 1
    return result
