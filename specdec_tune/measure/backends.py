"""The measuring core of a session: "measure these configs against the plain baseline on this
workload at batch size B, interleaved, and return one measurement each". The tuner and the final
round call only this (a measuring session, backends.base, is one). Two implementations:
`NativeBackend` (our own engine, in process) and `llamacpp.backend.LlamaCppBackend` (llama-server
processes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..domain import Config
from ..measurement import Measurement
from .batched import BatchEntry, measure_batched_many
from .bench import Entry, measure_many
from .seam import MeasuringBackend, Screen

__all__ = ["MeasuringBackend", "NativeBackend"]


class NativeBackend:
    """Our own engine in this process: `pool` builds each config's drafter (search.tuner.DrafterPool)."""

    name = "native"
    # Our engine measures a trial's prompts interleaved prompt by prompt inside each repeat: a
    # screen would need its parts merged (not built); its trials stop after their first repeat.
    screens = False

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    @property
    def target(self) -> Any:
        return self.pool.target

    def info(self) -> dict[str, Any]:
        return {"name": self.name}

    def measure(
        self,
        configs: list[Config],
        case: Any,
        batch_size: int = 1,
        repeats: int = 3,
        seed: int = 0,
        on_repeat: Callable[[int, float], None] | None = None,
        screen: Screen | None = None,  # not split here (`screens`): the whole workload is measured
    ) -> list[Measurement]:
        pool = self.pool
        hook = None
        if on_repeat is not None:
            if len(configs) != 1:
                raise ValueError("on_repeat watches a single config")
            hook = lambda r, speedups: on_repeat(r, speedups[0])  # noqa: E731
        try:
            if batch_size == 1:
                entries = [
                    Entry(None if c.gamma == 0 else pool.for_config(c), c.gamma, c.threshold) for c in configs
                ]
                return measure_many(
                    pool.target, entries, case, repeats, seed=seed, on_repeat=hook, ctx=pool.ctx
                )
            batched = [BatchEntry(_maker(pool, c, batch_size), c.gamma, c.threshold) for c in configs]
            return measure_batched_many(
                pool.target, batched, case, batch_size, repeats, seed=seed, on_repeat=hook, ctx=pool.ctx
            )
        except Exception:
            pool.free_device_memory()
            raise


def _maker(pool: Any, config: Config, batch_size: int) -> Callable[[], Any]:
    return lambda: pool.for_config(config, batch_size)
