"""`check --format benchmark-action`: a re-measurement as the `customBiggerIsBetter` JSON that
github-action-benchmark consumes (a list of {name, unit, value, extra}), so CI keeps a trend
history with alert thresholds instead of comparing with one frozen number.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .check import CheckReport

# metric -> unit; every one of them is better when bigger
_METRICS = {
    "speedup": "x",
    "acceptance_rate": "accepted/proposed",
    "tokens_per_s": "tokens/s",
    "baseline_tokens_per_s": "tokens/s",
}


def benchmark_action_entries(report: CheckReport) -> list[dict[str, Any]]:
    """One entry per measured metric; names stay the same between runs of the same profile and
    config, so the action can chart them and alert on a drop."""
    p = Path(report.profile)
    where = f"{p.parent.name}/{p.stem}" if p.parent.name else p.stem
    out = []
    for item in report.items:
        unit = _METRICS.get(item.metric)
        if unit is None or not isinstance(item.measured, int | float):
            continue
        extra = f"stored {item.stored}; {'ok' if item.ok else 'FAILED'}" + (
            f"; {item.note}" if item.note else ""
        )
        out.append(
            {
                "name": f"{where} {report.config}: {item.metric}",
                "unit": unit,
                "value": float(item.measured),
                "extra": extra,
            }
        )
    return out
