"""A batch-size schedule that is safe to ship, from the profile's batch table (γ*(B), B*).

Three rules, applied before any engine sees a schedule:
- Tiers: row i's K holds from its batch size up to the next row's minus 1 (the first from 1, the
  last to LAST_BATCH); adjacent tiers with the same K are one tier.
- Noise: a switch from K_a to K_b at batch size B_b stays only when the measurement resolves it:
  |s_b - s_a| > max(range_a, range_b), where s_b is K_b's speedup at B_b, s_a is K_a's speedup at
  B_b when that was measured there (else at its own row), and a range is the width of the
  measurement's interval when the profile stores one (`speedup_interval`), else the spread of its
  repeats (`speedup_spread` x speedup). K = 0 means plain decoding: speedup 1, range 0.
- K = 0: a tier that drafts nothing is kept only when the engine's K = 0 is not known to cost more
  than no speculation, or when the profile measured that draft at K = 0 at that batch size and it
  paid (speedup >= 1); the caller says in its output what the engine does with a K = 0 tier.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..domain import Metrics, Result
from ..store.schema import BatchRow, Profile

__all__ = [
    "LAST_BATCH",
    "Tier",
    "default_load",
    "largest_measured_batch",
    "measured_range",
    "row_for_load",
    "tiers",
]

# The last tier ends here: beyond any concurrency a server is configured for.
LAST_BATCH = 65536


@dataclass(frozen=True)
class Tier:
    start: int  # first batch size, inclusive
    end: int  # last batch size, inclusive
    k: int  # draft tokens per step; 0: no speculation
    batch_size: int  # the measured batch size the tier comes from


def measured_range(m: Metrics) -> float:
    """How far apart repeats of this measurement landed, in speedup units."""
    interval = getattr(m, "speedup_interval", None)
    if interval:
        lo, hi = interval
        return float(hi) - float(lo)
    return abs(m.speedup_spread * m.speedup)


def _results(row: BatchRow) -> list[Result]:
    return [row.best, *row.per_draft]


def _own(row: BatchRow, name: str, k: int, threshold: float) -> Result | None:
    """The measured result of draft `name` at γ=k (and the exported threshold) in `row`."""
    for r in _results(row):
        c = r.config
        if c.draft.name == name and c.gamma == k and round(c.threshold, 4) == round(threshold, 4):
            return r
    return None


def _row_k(row: BatchRow, name: str, default: int) -> tuple[int, Metrics | None, str]:
    """(K, its metrics at this row, a note) for the exported draft `name` at this row."""
    best = row.best.config
    if best.draft.kind == "none":
        return 0, None, ""
    if best.draft.name == name:
        return best.gamma, row.best.metrics, ""
    own = next((r for r in row.per_draft if r.config.draft.name == name), None)
    k = own.config.gamma if own else default
    note = f"at batch size {row.batch_size} the best was {row.best.config.label}; the engine runs one draft, so {name} γ={k} is scheduled there"
    return k, own.metrics if own else None, note + ("" if own else " (not measured at that batch size)")


def tiers(
    profile: Profile, name: str, gamma: int, threshold: float, k0_costs_more: bool
) -> tuple[list[Tier], list[str]]:
    """The safe schedule for draft `name` (γ = `gamma` where its row says nothing), and notes on every
    switch that was dropped and why."""
    rows = sorted(profile.batch_table, key=lambda r: r.batch_size)
    notes: list[str] = []
    out: list[Tier] = []
    prev: tuple[int, Metrics | None, BatchRow] | None = None
    for i, row in enumerate(rows):
        start = 1 if i == 0 else row.batch_size
        end = rows[i + 1].batch_size - 1 if i + 1 < len(rows) else LAST_BATCH
        k, m, note = _row_k(row, name, gamma)
        if note:
            notes.append(note)
        if k == 0 and k0_costs_more:
            paid = _own(row, name, 0, threshold)
            if paid is None or paid.metrics.speedup < 1.0:
                notes.append(
                    f"no K = 0 tier from batch size {row.batch_size}: the engine's K = 0 costs more than no "
                    "speculation, and this profile did not measure that it pays"
                )
                k, m = (prev[0], prev[1]) if prev else (gamma, None)
        if prev is not None and k != prev[0] and (k == 0 or m is not None):
            s_b, r_b = (m.speedup, measured_range(m)) if m else (1.0, 0.0)
            at_b = _own(row, name, prev[0], threshold) if prev[0] else None
            ma = at_b.metrics if at_b else prev[1]
            s_a, r_a = (ma.speedup, measured_range(ma)) if ma else (1.0, 0.0)
            noise = max(r_a, r_b)
            if abs(s_b - s_a) <= noise:
                notes.append(
                    f"no switch from K = {prev[0]} to K = {k} at batch size {row.batch_size}: measured "
                    f"{s_a:.3f}x vs {s_b:.3f}x, a difference within the noise ({noise:.3f}x)"
                )
                k, m = prev[0], prev[1]
        if out and out[-1].k == k:
            out[-1] = Tier(out[-1].start, end, k, out[-1].batch_size)
        else:
            out.append(Tier(start, end, k, row.batch_size))
        prev = (k, m, row)
    return out, notes


def default_load(profile: Profile) -> int | None:
    """The largest measured batch size at which speculation won (the load to size a server for);
    None without a batch table or when it won nowhere."""
    wins = [r.batch_size for r in profile.batch_table if r.best.config.draft.kind != "none"]
    return max(wins) if wins else None


def largest_measured_batch(profile: Profile) -> int:
    """The largest batch size the profile measured; 1 without a batch table, as `run` without
    --batch-sizes measures one request at a time."""
    return max((r.batch_size for r in profile.batch_table), default=1)


def row_for_load(profile: Profile, load: int) -> BatchRow:
    """The batch table row whose tier holds `load` (the largest measured batch size <= load)."""
    rows = sorted(profile.batch_table, key=lambda r: r.batch_size)
    below = [r for r in rows if r.batch_size <= load]
    return below[-1] if below else rows[0]
