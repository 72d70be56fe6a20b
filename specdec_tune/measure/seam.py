"""The measuring core every backend offers, as a Protocol with no engine behind it (importing it
loads nothing heavy): measure configs against the engine's own plain decoding, say which engine
measured. `measure.backends` implements it for our engine, `measure.llamacpp.backend` for
llama-server; `backends.protocols.Measures` extends it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..domain import Config
from ..measurement import Measurement


@dataclass(frozen=True)
class Screen:
    """A cheap first look at a config: its first `prompts` prompts are measured first (every
    repeat, interleaved as the rest), then `report(prompts_done, speedup_so_far)` is called; it may
    raise (the tuner's pruner stops a config that is clearly losing there). The rest of the
    workload follows and the measurement covers all of it, so a config that passes the screen
    costs no more than one measured without it."""

    prompts: int
    report: Callable[[int, float], None]


class Case(Protocol):
    """What one pass sends, as every backend's own type has it (`runtime.workloads.Case`: token
    ids; `measure.llamacpp.cases.TextCase`: text): prompts with their budgets and a temperature."""

    @property
    def prompts(self) -> Sequence[object]: ...
    @property
    def max_new_tokens(self) -> list[int]: ...
    @property
    def temperature(self) -> float: ...

    def head(self, n: int) -> Case:
        """The first n prompts."""
        ...

    def pick(self, indices: list[int], max_new_tokens: int | None = None) -> Case:
        """The prompts at `indices`, in that order; their budgets at most `max_new_tokens`."""
        ...


class MeasuringBackend(Protocol):
    """What the tuner and the final round measure through (backends.protocols.Measures is one)."""

    name: str
    # Declared, never probed: whether `measure` splits a config's measurement on a `Screen` (its
    # first prompts first, reported); False: it measures every prompt and ignores the screen.
    screens: bool

    def measure(
        self,
        configs: list[Config],
        case: Case,
        batch_size: int = 1,
        repeats: int = 3,
        seed: int = 0,
        on_repeat: Callable[[int, float], None] | None = None,
        screen: Screen | None = None,
    ) -> list[Measurement]:
        """One measurement per config (`.metrics`, `.mismatches`), timed against the plain
        baseline in the same run. `on_repeat(r, speedup)` after each repeat (one config only);
        `screen` (one config only): the first prompts first, reported (a backend that cannot
        split a measurement ignores it and measures the whole workload)."""
        ...

    def info(self) -> dict[str, Any]:
        """What identifies the engine that measured (name, build), for the profile."""
        ...
