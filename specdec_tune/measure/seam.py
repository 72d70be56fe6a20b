"""The measuring core every backend offers, as a Protocol with no engine behind it (importing it
loads nothing heavy): measure configs against the engine's own plain decoding, say which engine
measured. `measure.backends` implements it for our engine, `measure.llamacpp.backend` for
llama-server; `backends.base.MeasuringSession` extends it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ..domain import Config, Metrics


class Measured(Protocol):
    metrics: Metrics
    mismatches: int


class MeasuringBackend(Protocol):
    name: str

    def measure(
        self,
        configs: list[Config],
        case: Any,
        batch_size: int = 1,
        repeats: int = 3,
        seed: int = 0,
        on_repeat: Callable[[int, float], None] | None = None,
    ) -> list[Any]:
        """One measurement per config (`.metrics`, `.mismatches`), timed against the plain
        baseline in the same run. `on_repeat(r, speedup)` after each repeat (one config only)."""
        ...

    def info(self) -> dict[str, Any]:
        """What identifies the engine that measured (name, build), for the profile."""
        ...
