"""The measuring core of a session: "measure these configs against the plain baseline on this
workload at batch size B, interleaved, and return one measurement each". The tuner and the final
round call only this (a measuring session, backends.base, is one). Two implementations:
`NativeBackend` (our own engine, in process) and `llamacpp.backend.LlamaCppBackend` (llama-server
processes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..domain import Config
from ..measurement import Measurement
from ..runtime.workloads import Case
from . import batched, bench
from .batched import BatchEntry
from .bench import Entry
from .decode_anchor import DecodeAnchor
from .seam import MeasuringBackend, Screen

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from ..backends.native_pool import DrafterPool
    from ..runtime.drafting.rows import BatchDrafter

__all__ = ["MeasuringBackend", "NativeBackend"]


class NativeBackend:
    """Our own engine in this process: `pool` builds each config's drafter
    (backends.native_pool.DrafterPool); `anchor`: a decode anchor timed between the passes of a
    measurement at batch size 1 (`Measurement.plain_per_anchor`, what `check` judges the plain rate by)."""

    name = "native"
    # Our engine measures a trial's prompts interleaved prompt by prompt inside each repeat: a
    # screen would need its parts merged (not built); its trials stop after their first repeat.
    screens = False

    def __init__(self, pool: DrafterPool, anchor: DecodeAnchor | None = None) -> None:
        self.pool = pool
        self.anchor = anchor

    @property
    def target(self) -> PreTrainedModel:
        return self.pool.target

    def info(self) -> dict[str, Any]:
        return {"name": self.name}

    def measure(
        self,
        configs: list[Config],
        case: Case,
        batch_size: int = 1,
        repeats: int = 3,
        seed: int = 0,
        on_repeat: Callable[[int, float], None] | None = None,
        screen: Screen | None = None,  # not split here (`screens`): the whole workload is measured
    ) -> list[Measurement]:
        if on_repeat is not None and len(configs) != 1:
            raise ValueError("on_repeat watches a single config")
        try:
            if len(configs) == 1:
                return [self._one(configs[0], case, batch_size, repeats, seed, on_repeat)]
            return self._many(configs, case, batch_size, repeats, seed)
        except Exception:
            self.pool.free_device_memory()
            raise

    def _one(
        self,
        c: Config,
        case: Case,
        batch_size: int,
        repeats: int,
        seed: int,
        on_repeat: Callable[[int, float], None] | None,
    ) -> Measurement:
        """One config against plain decoding (`bench.measure`, `batched.measure_batched`)."""
        pool = self.pool
        if batch_size == 1:
            drafter = None if c.gamma == 0 else pool.for_config(c)
            return bench.measure(
                pool.target, drafter, c.gamma, c.threshold, case, repeats=repeats, seed=seed,
                on_repeat=on_repeat, ctx=pool.ctx, anchor=self.anchor,
            )  # fmt: skip
        return batched.measure_batched(
            pool.target, _maker(pool, c, batch_size), c.gamma, c.threshold, case, batch_size,
            repeats=repeats, seed=seed, on_repeat=on_repeat, ctx=pool.ctx,
        )  # fmt: skip

    def _many(
        self, configs: list[Config], case: Case, batch_size: int, repeats: int, seed: int
    ) -> list[Measurement]:
        """Several configs and plain decoding in one interleaved run (a final round's finalists)."""
        pool = self.pool
        if batch_size == 1:
            entries = [
                Entry(None if c.gamma == 0 else pool.for_config(c), c.gamma, c.threshold) for c in configs
            ]
            return bench.measure_many(
                pool.target, entries, case, repeats, seed=seed, ctx=pool.ctx, anchor=self.anchor
            )
        rows = [BatchEntry(_maker(pool, c, batch_size), c.gamma, c.threshold) for c in configs]
        return batched.measure_batched_many(
            pool.target, rows, case, batch_size, repeats, seed=seed, ctx=pool.ctx
        )


def _maker(pool: DrafterPool, config: Config, batch_size: int) -> Callable[[], BatchDrafter]:
    return lambda: pool.for_config(config, batch_size)
