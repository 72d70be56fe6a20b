"""What the engine cost model (search.enginemodel) is fitted from: each measured config's
per-request counters, its speculative side's and the interleaved plain side's (B = 1)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..domain import Config
from ..measurement import Measurement


class RequestCounters(Protocol):
    """One request's counters (measure.llamacpp.backend.RequestStats is one)."""

    predicted_n: int
    predicted_ms: float
    draft_n: int
    draft_accepted: int


@dataclass
class Totals:
    """One side's requests summed: decode tokens (predicted_n - 1 each), ms, drafted, accepted."""

    requests: int = 0
    tokens: int = 0
    ms: float = 0.0
    drafted: int = 0
    accepted: int = 0

    @classmethod
    def of(cls, requests: Iterable[RequestCounters]) -> Totals:
        t = cls()
        for r in requests:
            t.requests += 1
            t.tokens += max(0, r.predicted_n - 1)
            t.ms += r.predicted_ms
            t.drafted += r.draft_n
            t.accepted += r.draft_accepted
        return t

    @property
    def forwards(self) -> int:
        return self.tokens - self.accepted

    @property
    def ms_per_token(self) -> float | None:
        return self.ms / self.tokens if self.tokens > 0 else None


@dataclass
class Observation:
    """One measured config: its timed spec requests and the interleaved plain ones (B = 1)."""

    config: Config
    spec: list[RequestCounters] = field(default_factory=list)
    plain: list[RequestCounters] = field(default_factory=list)

    @classmethod
    def from_measurement(cls, config: Config, measurement: Measurement) -> Observation:
        """From a `Measurement` (its `requests`, each with a `side`); requests that ran
        with other requests in flight (batch_size > 1) are left out: their ms are not one row's."""
        obs = cls(config)
        for r in measurement.requests:
            if getattr(r, "batch_size", 1) == 1:
                (obs.plain if r.side == "plain" else obs.spec).append(r)
        return obs

    @property
    def measured_speedup(self) -> float | None:
        """Decode tokens/s of the spec side over the plain side's, pooled over requests."""
        s, p = Totals.of(self.spec).ms_per_token, Totals.of(self.plain).ms_per_token
        return p / s if s and p else None


def observations(pairs: Sequence[tuple[Config, Any]]) -> list[Observation]:
    """Observations from (config, Measurement) pairs, as a backend's `measure` returns them."""
    return [Observation.from_measurement(c, m) for c, m in pairs]
