"""One config's measurement and the evidence behind it, the same type for every backend.

`Measurement` is what a backend's `measure` returns and everything after it reads (the search, the
final round, the profile, `check`): the metrics, the per-repeat speedups and rates the intervals and
judges are computed from, and the engine's own evidence. An in-process engine fills `stats` (the
loop's counters), `outputs` and `build` (compile work kept out of the timing); an engine in another
process fills `requests` (per-request counters from its own timings, which its cost model is fitted
from), `flags` and `exactness`. Fields a backend does not measure stay empty, and `as_dict` leaves
them out. A shared leaf: plain data, imported by every stage.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from statistics import median
from typing import Any

from .domain import Metrics


@dataclass
class SpecStats:
    """Counters of one or more generations; rates are derived, so stats of runs simply add."""

    proposed: int = 0  # draft tokens offered to the target
    accepted: int = 0  # of those, kept
    target_forwards: int = 0  # decode-time target forwards (prefill excluded)
    emitted: int = 0  # tokens generated
    reached_at: list[int] = field(default_factory=list)  # [i]: times position i+1 was verified
    accepted_at: list[int] = field(default_factory=list)  # [i]: times position i+1 was accepted
    # [i]: times position i+1 was within the step's gamma with positions 1..i accepted, whether or
    # not the drafter proposed it (prompt lookup often has nothing to propose)
    allowed_at: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        """alpha = accepted / proposed draft tokens (0 when nothing was proposed)."""
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def mean_accepted_len(self) -> float:
        """tau = tokens emitted per target forward."""
        return self.emitted / self.target_forwards if self.target_forwards else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        """P(draft token i accepted | tokens 1..i-1 accepted), for each position ever verified."""
        return [a / r for a, r in zip(self.accepted_at, self.reached_at, strict=False) if r]

    @property
    def effective_acceptance(self) -> list[float]:
        """P(token i accepted | tokens 1..i-1 accepted), a position the drafter left empty counting
        as rejected: what the cost model needs, since an empty position emits nothing. Equal to
        `per_position_acceptance` for a drafter that always proposes its full gamma."""
        accepted = self.accepted_at + [0] * (len(self.allowed_at) - len(self.accepted_at))
        return [a / r for a, r in zip(accepted, self.allowed_at, strict=False) if r]

    def add(self, other: SpecStats) -> None:
        self.proposed += other.proposed
        self.accepted += other.accepted
        self.target_forwards += other.target_forwards
        self.emitted += other.emitted
        for mine, theirs in (
            (self.reached_at, other.reached_at),
            (self.accepted_at, other.accepted_at),
            (self.allowed_at, other.allowed_at),
        ):
            mine.extend([0] * (len(theirs) - len(mine)))
            for i, v in enumerate(theirs):
                mine[i] += v

    @classmethod
    def from_steps(cls, steps: list[tuple[int, int, int]], forwards: int, emitted: int) -> SpecStats:
        """Counters of one generation from its steps: (allowed gamma g, proposed k, accepted n)."""
        width = max((k for _, k, _ in steps), default=0)
        allowed_width = max((g for g, _, _ in steps), default=0)
        reached, accepted, allowed = [0] * width, [0] * width, [0] * allowed_width
        for g, k, n in steps:
            for i in range(min(n + 1, k)):
                reached[i] += 1
            for i in range(n):
                accepted[i] += 1
            for i in range(min(n + 1, g)):
                allowed[i] += 1
        return cls(
            proposed=sum(k for _, k, _ in steps),
            accepted=sum(n for _, _, n in steps),
            target_forwards=forwards,
            emitted=emitted,
            reached_at=reached,
            accepted_at=accepted,
            allowed_at=allowed,
        )


@dataclass
class GraphBuild:
    """Compile work done outside the timed region, and any seen inside it."""

    graphs: int = 0  # graphs dynamo built during warm-up and prebuild
    seconds: float = 0.0  # wall time of warm-up and prebuild (compile time, never timed as decode)
    in_timing: int = 0  # graphs built inside timed passes (each such pass was discarded and re-timed)
    retimed: int = 0  # timed rounds discarded because a graph was built inside them

    def as_dict(self) -> dict[str, Any]:
        return {
            "graphs": self.graphs,
            "compile_s": round(self.seconds, 3),
            "graphs_in_timing": self.in_timing,
            "retimed": self.retimed,
        }


@dataclass
class RequestStats:
    """One timed request's counters from the server's `timings` (server-common.cpp, build 11434).

    predicted_n: tokens generated, the first one included (it comes from the prompt's logits);
    predicted_ms: from that first token to the last, so it covers predicted_n - 1 - draft_accepted
    target forwards; draft_n: tokens drafted, summed over the request's drafts; draft_accepted:
    drafted tokens the target accepted. The server does not report how many forwards carried a
    draft (its per-request n_draft_verif_steps reaches only the log and /metrics).
    """

    side: str  # "spec" or "plain"
    predicted_n: int
    predicted_ms: float
    draft_n: int = 0
    draft_accepted: int = 0
    n_predict: int = 0  # the request's token budget
    batch_size: int = 1  # requests in flight on the server while it ran

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Measurement:
    """The metrics of one config plus the evidence behind them."""

    metrics: Metrics
    tokens: int  # tokens generated per pass
    mismatches: int  # greedy only: prompts whose output differs from the plain target's (0 = exact)
    speedups: list[float] = field(default_factory=list)  # per repeat
    # per repeat: the config's tokens/s and the plain target's (`check` judges them)
    rates: list[float] = field(default_factory=list)
    baseline_rates: list[float] = field(default_factory=list)
    processes: int = 0  # > 0: medians of that many fresh processes, one sample each (app.checking)
    # measured with a decode anchor (measure.decode_anchor): per repeat, its steps/s and the plain
    # tokens/s divided by them (timed prompt by prompt between the plain passes)
    anchor_rates: list[float] = field(default_factory=list)
    plain_per_anchor: list[float] = field(default_factory=list)
    # what other processes took from the measurement (measure.preemption): the speedups (and plain
    # per anchor step) of the repeats rebuilt from prompts neither side was preempted in, the share
    # of (repeat, prompt) pairs that were, and the share of the timed seconds our threads waited
    # for a CPU; `clean_share` None: not accounted (no schedstat, or an engine that does not)
    clean_speedups: list[float] = field(default_factory=list)
    clean_plain_per_anchor: list[float] = field(default_factory=list)
    clean_share: float | None = None
    waited_share: float = 0.0
    # an in-process engine: the loop's counters, the outputs, and the compile work done before
    # timing (never inside it); None where the engine compiles nothing in this process
    stats: SpecStats = field(default_factory=SpecStats)
    outputs: list[list[int]] = field(default_factory=list)
    build: GraphBuild | None = None
    # an engine in another process: its per-request counters (both sides, in order), the config's
    # flags as it ran, and the T = 0 comparison with the plain server's text
    requests: list[RequestStats] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    exactness: dict[str, Any] = field(default_factory=dict)

    def joined(self, other: Measurement) -> Measurement:
        """This measurement and `other` (the same config, measured again) as one: every per-repeat
        list of both, the medians over all repeats, the worse exactness; `check` pools its looks so."""
        speedups = [*self.speedups, *other.speedups]
        rates = [*self.rates, *other.rates]
        base = [*self.baseline_rates, *other.baseline_rates]
        metrics = replace(
            self.metrics,
            speedup=median(speedups) if speedups else self.metrics.speedup,
            tokens_per_s=median(rates) if rates else self.metrics.tokens_per_s,
            baseline_tokens_per_s=median(base) if base else self.metrics.baseline_tokens_per_s,
            repeats=self.metrics.repeats + other.metrics.repeats,
        )
        shares = [x for x in (self.clean_share, other.clean_share) if x is not None]
        return replace(
            self,
            metrics=metrics,
            mismatches=max(self.mismatches, other.mismatches),
            speedups=speedups,
            rates=rates,
            baseline_rates=base,
            anchor_rates=[*self.anchor_rates, *other.anchor_rates],
            plain_per_anchor=[*self.plain_per_anchor, *other.plain_per_anchor],
            clean_speedups=[*self.clean_speedups, *other.clean_speedups],
            clean_plain_per_anchor=[*self.clean_plain_per_anchor, *other.clean_plain_per_anchor],
            clean_share=sum(shares) / len(shares) if len(shares) == 2 else None,
            waited_share=max(self.waited_share, other.waited_share),
            requests=[*self.requests, *other.requests],
        )

    def as_dict(self) -> dict[str, Any]:
        out = {
            **self.metrics.as_dict(),
            "tokens": self.tokens,
            "mismatches": self.mismatches,
            "speedups": list(self.speedups),
        }
        if self.build is not None:
            out["compile"] = self.build.as_dict()
        if self.exactness:
            out["exactness"] = dict(self.exactness)
        if self.flags:
            out["flags"] = list(self.flags)
        if self.requests:
            out["requests"] = [r.as_dict() for r in self.requests]
        return out
