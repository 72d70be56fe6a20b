"""One interleaved run's pairing of each config with the plain side of the same repeat, for bench
(`bench.measure_many`, B = 1) and batched bench (`batched.measure_batched_many`): a config's ratio
per repeat, its metrics, and how many of its outputs differ from plain decoding's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from ..domain import Metrics
from ..measurement import SpecStats
from .timing import median, spread

T = TypeVar("T")  # what a timed pass returns beside its seconds


class RepeatRatios(Generic[T]):
    """Each config's rate over the plain rate of the same repeat, as the repeats come in (key -1 is
    the plain side; config i is key i, a plain config's ratio 1). Call it after each repeat;
    `on_repeat(r, medians_so_far)` follows."""

    def __init__(
        self,
        speculative: list[bool],
        rate: Callable[[tuple[float, T]], float],
        on_repeat: Callable[[int, list[float]], None] | None,
    ) -> None:
        self.speculative, self.rate, self.on_repeat = speculative, rate, on_repeat
        self.ratios: list[list[float]] = [[] for _ in speculative]

    def clear(self) -> None:
        for x in self.ratios:
            x.clear()  # a round re-timed after a compile starts over

    def __call__(self, r: int, last: dict[int, tuple[float, T]]) -> None:
        base = self.rate(last[-1])
        for i, spec in enumerate(self.speculative):
            self.ratios[i].append(self.rate(last[i]) / base if spec else 1.0)
        if self.on_repeat is not None:
            self.on_repeat(r, [median(x) for x in self.ratios])


def paired_metrics(
    rates: list[float],
    base_rates: list[float],
    ratios: list[float],
    stats: SpecStats,
    speculative: bool,
    repeats: int,
    per_source: dict[str, dict[str, float]],
) -> Metrics:
    """A config's metrics: its median rate, plain's, the median of its per-repeat ratios and their
    spread, and its acceptance over every timed pass."""
    return Metrics(
        tokens_per_s=median(rates),
        baseline_tokens_per_s=median(base_rates),
        speedup=median(ratios),
        speedup_spread=spread(ratios),
        acceptance_rate=stats.acceptance_rate,
        mean_accepted_len=stats.mean_accepted_len if speculative else 1.0,
        per_position_acceptance=stats.per_position_acceptance,
        repeats=repeats,
        per_source=per_source,
    )


def mismatches(plain: list[list[int]], outputs: list[list[int]], temperature: float) -> int:
    """Outputs that differ from plain decoding's, counted at temperature 0 (sampling: 0)."""
    if temperature != 0:
        return 0
    return sum(a != b for a, b in zip(plain, outputs, strict=True))
