"""vLLM's batch-size schedule (`num_speculative_tokens_per_batch_size`), written from the measured
rows and then measured itself, since a schedule is a config of its own: it switches K as requests
come and go, and a hand-written one collapsed throughput at its threshold (vllm#49548).

1. `tiers`: each measured batch size's gamma of the tuned draft becomes a tier (`best_gammas`: the
   fastest there, unless it is not resolved faster than the gamma of the size below; 0 only where
   plain decoding was resolved faster: a K = 0 tier costs more than the plain server); a boundary
   lies at the geometric middle of two measured sizes, so every measured size sits inside its own
   tier, and equal neighbours merge. One gamma everywhere is no schedule: the fixed config is the
   answer, and nothing more is measured (`one_gamma`).
2. `measure_schedule`: the schedule's server against each fixed gamma it mixes, interleaved, at
   every measured batch size and at each boundary (where the running batch crosses it as requests
   finish and refill). Paired per repeat (`measure.stats.compare`). Plain decoding is a side of its
   own only where a tier's K is 0; otherwise a plain pass would cancel from every paired ratio, so
   the schedule's speedup over plain is its tokens/s over the plain rate that batch size's cell
   measured in this run (unpaired, and none at a boundary no cell measured).
3. `verdict`: the schedule is emitted only when no fixed gamma it mixes (plain decoding among them
   where a tier's K is 0) is resolved faster than it at any measured concurrency, beyond the
   spread between two servers of one config that this run measured (`server_spread`: its B = 1
   row, where the schedule runs its first tier's K, against the fixed server of that K);
   otherwise the rows say where it lost, and export keeps the best fixed config. Where it mixes no
   K = 0 and plain decoding is faster at some size, it is said (`below_plain`): a fixed gamma of
   that draft would be slower there as well, and the profile's batch table says what to serve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any

from ...domain import Config
from ...measure.stats import compare, speedup_interval
from ...measure.timing import median
from .measuring import SETTLE_S, VllmBackend

SCHEDULE_POLICY = "schedule"  # a Config's gamma policy for a schedule's server (its own key)
LAST_BATCH = 1024  # the last tier's end: vLLM caps it at max_num_seqs anyway


def tiers(points: dict[int, int]) -> list[list[int]]:
    """{batch size: K} -> vLLM's inclusive `[start, end, K]` tiers from 1 upward.

    {1: 5, 4: 3, 16: 0} -> [[1, 2, 5], [3, 8, 3], [9, 1024, 0]] (boundaries at round(sqrt(1 x 4)) + 1
    = 3 and round(sqrt(4 x 16)) + 1 = 9)."""
    sizes = sorted(points)
    if not sizes:
        raise ValueError("a schedule needs at least one measured batch size")
    out: list[list[int]] = []
    start = 1
    for i, b in enumerate(sizes):
        end = LAST_BATCH if i == len(sizes) - 1 else max(b, round(math.sqrt(b * sizes[i + 1])))
        if out and out[-1][2] == points[b]:
            out[-1][1] = end
        else:
            out.append([start, end, points[b]])
        start = end + 1
    return out


def boundaries(schedule: list[list[int]]) -> list[int]:
    """The batch sizes where a schedule switches K (each tier's start but the first)."""
    return [t[0] for t in schedule[1:]]


def schedule_seconds(start_s: float, pass_by_b: dict[int, float], repeats: int) -> float:
    """About how long `measure_schedule` takes: a server start, then at each batch size and at each
    switch between two neighbours (timed as their passes' mean) three sides (the schedule and two
    fixed gammas; a fourth, plain decoding, only where a tier's K is 0, which is not known before
    the cells), each `repeats` timed passes after an untimed one of about half a pass (short
    requests), and a settle before every pass on another server."""
    sizes = sorted(pass_by_b)
    passes = [pass_by_b[b] for b in sizes]
    passes += [(pass_by_b[a] + pass_by_b[b]) / 2 for a, b in pairwise(sizes)]  # switches
    sides = 3
    return start_s + sum(sides * ((repeats + 0.5) * p + repeats * SETTLE_S) for p in passes)


def best_gammas(draft: str, results: dict[int, Any]) -> dict[int, int]:
    """Per batch size, from the smallest up, the gamma of `draft` to serve there: the fastest
    measured, unless the gamma of the size below was raced there too and the fastest is not
    resolved faster than it (`_resolved_faster`): a switch the noise decided would add a threshold
    where K flips step to step (vllm#49548) and buy nothing, so K changes only where the run
    measured a reason. 0 only where plain decoding was resolved faster than the fastest (its
    interval wholly below 1) or `draft` was not measured there. A K = 0 tier is not plain decoding:
    in a speculative server it ran at 0.909 [0.874, 0.945] of the plain server (SmolLM2, B = 9) and
    0.47x (demo, B = 4), so where the draft only ties with plain decoding its own gamma stays on
    (docs/vllm.md)."""
    out: dict[int, int] = {}
    below = 0  # the gamma served at the size below (0: none yet, or plain decoding there)
    for b in sorted(results):
        rows, best = _draft_rows(draft, results[b])
        kept = next((r for r in rows if below and r.config.gamma == below), None)
        if best is not None and kept is not None and kept is not best and not _resolved_slower(kept.metrics):
            best = best if _resolved_faster(best.metrics, kept.metrics) else kept
        out[b] = below = 0 if best is None or _resolved_slower(best.metrics) else best.config.gamma
    return out


def _draft_rows(draft: str, result: Any) -> tuple[list[Any], Any]:
    """A cell's speculative rows of `draft`, and the fastest of them (None without any)."""
    rows = [r for r in result.results if r.config.draft.name == draft and r.config.gamma > 0]
    return rows, max(rows, key=lambda r: r.metrics.speedup, default=None)


def _resolved_faster(a: Any, b: Any) -> bool:
    """Whether metrics `a` are resolved faster than `b`, both from one cell's race: their paired
    interval (per-repeat speedups over the same plain passes, the first repeats both have: a race's
    first round measures every finalist together) wholly above 1; without samples, their own
    intervals apart; without those, the higher speedup."""
    n = min(len(a.speedup_samples or []), len(b.speedup_samples or []))
    if n >= 2:
        return compare(a.speedup_samples[:n], b.speedup_samples[:n]).interval[0] > 1.0
    if a.speedup_interval and b.speedup_interval:
        return a.speedup_interval[0] > b.speedup_interval[1]
    return a.speedup > b.speedup


def _resolved_slower(m: Any) -> bool:
    """Slower than plain decoding beyond the noise: the speedup interval wholly below 1 (the
    speedup alone where no interval was kept)."""
    interval = m.speedup_interval
    return interval[1] < 1.0 if interval else m.speedup < 1.0


def measure_schedule(
    backend: VllmBackend, results: dict[int, Any], case: Any, repeats: int = 3
) -> dict[str, Any] | None:
    """The schedule of the first batch size's best draft, measured against each fixed gamma it
    mixes; None when plain decoding is the answer everywhere, and `one_gamma`'s record, nothing
    measured, when one gamma serves every size (the fixed config is then the whole answer)."""
    first = results[min(results)]
    spec = next((r.config for r in first.results if r.config.gamma > 0), None)
    if spec is None:
        return None
    points = best_gammas(spec.draft.name, results)
    schedule = tiers(points)
    ks = sorted({t[2] for t in schedule if t[2] > 0})
    if not ks:
        return None
    if len(schedule) == 1:
        return one_gamma(spec.draft.name, schedule, results)
    config = Config(spec.draft, max(ks), gamma_policy=SCHEDULE_POLICY)
    backend.schedules[config.key] = schedule
    fixed = [replace(spec, gamma=k) for k in ks]
    sizes = sorted(set(points) | set(boundaries(schedule)))
    paired_plain = any(t[2] == 0 for t in schedule)  # plain decoding is a fixed "gamma" it mixes
    plain_rate = {b: _plain_rate(r) for b, r in results.items()}

    def sample(b: int, against: list[Config]) -> Sample:
        return _sample(backend, config, against, case, b, repeats, paired_plain)

    samples = {b: sample(b, fixed) for b in sizes}
    rows = [_row(b, samples[b], fixed, plain_rate.get(b)) for b in sizes]
    lost, below_plain, spread = verdict(schedule, rows)
    doubtful = [r for r in rows if _doubtful(r)]
    if doubtful:  # measured again in new servers: the schedule's and those of the fixed γs it lost to
        gammas = {a["gamma"] for r in doubtful for a in r["against"] if a["slower"]}
        again_fixed = [f for f in fixed if f.gamma in gammas]
        backend.stop([config, *again_fixed])
        for r in doubtful:
            b = r["batch_size"]
            pooled = samples[b].pooled(sample(b, again_fixed), [fixed.index(f) for f in again_fixed])
            rows[rows.index(r)] = _row(b, pooled, fixed, plain_rate.get(b), first_pair=r)
        lost, below_plain, spread = verdict(schedule, rows)
    return {
        "draft": spec.draft.name,
        "tiers": schedule,
        "rows": rows,
        "server_spread": round(spread, 4),
        "renewed_at": [r["batch_size"] for r in doubtful],
        "emitted": not lost,
        "lost": lost,
        "below_plain": below_plain,
        "flags": backend.flags(config),
    }


def one_gamma(draft: str, schedule: list[list[int]], results: dict[int, Any]) -> dict[str, Any]:
    """The record of a run whose draft serves one gamma at every measured batch size: no schedule
    is measured or emitted (the fixed config is the answer); its `one_gamma` lists the sizes where
    a faster-looking gamma was not resolved faster than it, with both speedups."""
    k = schedule[0][2]
    kept = []
    for b in sorted(results):
        rows, best = _draft_rows(draft, results[b])
        if best is not None and best.config.gamma != k:
            mine = next((r for r in rows if r.config.gamma == k), None)
            if mine is not None:
                kept.append(
                    f"B={b}: γ {best.config.gamma} {best.metrics.speedup:.3f}x, γ {k} {mine.metrics.speedup:.3f}x"
                )
    return {"draft": draft, "tiers": schedule, "rows": [], "emitted": False, "lost": [], "one_gamma": kept}


# A loss this close to 1 is measured again in a new server pair before it counts: two servers of one
# config read up to 2.5 % apart at B = 16 (SmolLM2, docs/vllm.md) where one pair's repeats resolve
# a few tenths of a per cent. A collapse at a threshold (vllm#49548) is larger, and counts at once.
CONFIRM_WITHIN = 0.05


def _doubtful(row: dict[str, Any]) -> bool:
    """A loss of the row's (`verdict` marked it) within CONFIRM_WITHIN of 1."""
    near = [a for a in row["against"] if a["slower"] and a["ratio"] >= 1.0 - CONFIRM_WITHIN]
    return bool(near) and not any(a["slower"] and a["ratio"] < 1.0 - CONFIRM_WITHIN for a in row["against"])


@dataclass(frozen=True)
class Sample:
    """The schedule measured at one batch size beside fixed gammas: per fixed gamma, the schedule's
    per-repeat values and that gamma's from the same interleaved repeats (speedups over the plain
    side where plain decoding was one, else tokens/s: a paired ratio is the same either way), the
    schedule's tokens/s, and its speedups over the plain side (None without one)."""

    pairs: list[tuple[list[float], list[float]]]
    tokens_per_s: float
    over_plain: list[float] | None

    def pooled(self, more: Sample, at: list[int]) -> Sample:
        """These repeats and `more`'s, a second server pair measured beside the fixed gammas at
        indices `at` only: their pairs pool both, the others keep the first pair's."""
        pairs = list(self.pairs)
        for j, i in enumerate(at):
            (a, b), (c, d) = self.pairs[i], more.pairs[j]
            pairs[i] = (a + c, b + d)
        over = self.over_plain + more.over_plain if self.over_plain is not None and more.over_plain else None
        return Sample(pairs, (self.tokens_per_s + more.tokens_per_s) / 2, over)


def _sample(
    backend: VllmBackend, config: Config, fixed: list[Config], case: Any, b: int, repeats: int, plain: bool
) -> Sample:
    """The schedule and `fixed` measured at `b`, interleaved; a plain side only where `plain`."""
    if plain:
        measured = backend.measure([config, *fixed], case, b, repeats)
        mine = list(measured[0].speedups)
        pairs = [(mine, list(m.speedups)) for m in measured[1:]]
        return Sample(pairs, measured[0].metrics.tokens_per_s, mine)
    rates = backend.rates([config, *fixed], case, b, repeats)
    return Sample([(rates[0], r) for r in rates[1:]], median(rates[0]), None)


def _plain_rate(result: Any) -> float | None:
    """The plain tokens/s a batch size's cell measured (its results' shared baseline)."""
    rates = [r.metrics.baseline_tokens_per_s for r in result.results if r.metrics.baseline_tokens_per_s > 0]
    return median(rates) if rates else None


def _row(
    b: int, sample: Sample, fixed: list[Config], plain_rate: float | None, first_pair: dict[str, Any] | None = None
) -> dict[str, Any]:  # fmt: skip
    """One measured batch size: the schedule's speedup over plain decoding and its paired ratio to
    each fixed gamma (`slower` is `verdict`'s); `first_pair`: the row of the first server pair,
    where these repeats pool two. Without a plain side the speedup is the schedule's tokens/s over
    the cell's plain rate (`speedup_over`: "cell"), with no interval; None where no cell measured."""
    if sample.over_plain is not None:
        speedup, interval, over = median(sample.over_plain), speedup_interval(sample.over_plain), "paired"
    elif plain_rate:
        speedup, interval, over = sample.tokens_per_s / plain_rate, None, "cell"
    else:
        speedup, interval, over = None, None, "none"
    row: dict[str, Any] = {
        "batch_size": b,
        "speedup": None if speedup is None else round(speedup, 4),
        "interval": interval,
        "speedup_over": over,
        "tokens_per_s": round(sample.tokens_per_s, 2),
        "against": [],
    }
    for f, (mine, theirs) in zip(fixed, sample.pairs, strict=True):
        c = compare(mine, theirs)
        row["against"].append(
            {
                "gamma": f.gamma,
                "ratio": round(c.ratio, 4),
                "interval": [round(c.interval[0], 4), round(c.interval[1], 4)],
                "slower": False,  # set by `verdict`, against the run's server spread
            }
        )
    row["slower_than_plain"] = bool(interval and interval[1] < 1.0)
    if first_pair is not None:
        row["first_pair"] = {"speedup": first_pair["speedup"], "against": first_pair["against"]}
    return row


def server_spread(schedule: list[list[int]], rows: list[dict[str, Any]]) -> float:
    """How far two servers of one config read apart in this run: at B = 1 (one request at a time,
    no switch) the schedule runs its first tier's K, the same config as the fixed server of that K;
    the bound of their paired interval farther from 1. 0 where no such row was measured.

    One server pair's repeats resolve that pair's ratio to a few tenths of a per cent, while two
    servers of the same config differ by more (SmolLM2, B = 1: 1.025 [1.023, 1.026]), so a ratio
    between the schedule's server and a fixed one is judged against this, not against 1 alone."""
    first_k = schedule[0][2]
    for r in rows:
        if r["batch_size"] != 1:
            continue
        for a in r["against"]:
            if a["gamma"] == first_k:
                lo, hi = a["interval"]
                # at most CONFIRM_WITHIN: a wider reading (1.123 [1.109, 1.137] once) says one of
                # the two servers is off, not that any loss up to it is noise
                return min(CONFIRM_WITHIN, max(abs(1.0 - lo), abs(hi - 1.0)))
    return 0.0


def verdict(schedule: list[list[int]], rows: list[dict[str, Any]]) -> tuple[list[str], list[str], float]:
    """(where it lost, where plain decoding was faster though the schedule mixes no K = 0, the
    server spread): a loss is a paired interval wholly below 1 - spread against a fixed gamma it
    mixes, plain decoding included where a tier's K is 0. Each row's `slower` marks are set here."""
    spread = server_spread(schedule, rows)
    floor = 1.0 - spread
    mixes_plain = any(t[2] == 0 for t in schedule)
    first_k = schedule[0][2]
    lost, below_plain = [], []
    for r in rows:
        b = r["batch_size"]
        if r["speedup"] is None:  # no plain rate at this size (a boundary no cell measured)
            lo = hi = math.inf
        else:
            lo, hi = r["interval"] or (r["speedup"], r["speedup"])
        if hi < floor:
            paired = r["interval"] is not None
            line = f"B={b}: {r['speedup']:.3f}" + (
                f" [{lo:.3f}, {hi:.3f}] of plain decoding"
                if paired
                else " of the cell's plain rate (unpaired)"
            )
            (lost if mixes_plain else below_plain).append(line)
        for a in r["against"]:
            # B = 1 against the first tier's K is one config in two servers (the spread itself, one
            # request at a time, no switch): beyond the 5 % cap it says a server is off, not that
            # the schedule lost (0.928 [0.917, 0.940] once, stop 57)
            spread_row = b == 1 and a["gamma"] == first_k
            a["slower"] = bool(a["interval"][1] < floor and not spread_row)
            if a["slower"]:
                lost.append(
                    f"B={b}: {a['ratio']:.3f} [{a['interval'][0]:.3f}, {a['interval'][1]:.3f}] of fixed γ {a['gamma']}"
                )
    return lost, below_plain, spread
