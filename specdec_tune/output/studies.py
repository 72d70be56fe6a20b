"""Tables for `studies list` and `studies show`."""

from __future__ import annotations

from typing import Any


def _states(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items())) or "none"


def studies_table(rows: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    table = Table(title="studies")
    for col in ("name", "trials", "best speedup", "started"):
        table.add_column(col)
    for r in rows:
        best = f"{r['best']:.3f}×" if r["best"] is not None else "-"
        table.add_row(r["name"], _states(r["trials"]), best, r["started"] or "-")
    return table


def study_tables(info: dict[str, Any]) -> list[Any]:
    from rich.table import Table

    head = Table(title=f"study {info['name']}", show_header=False)
    head.add_row("trials", _states(info["trials"]))
    for k, v in info["key"].items():
        head.add_row(k, str(v))
    final = info["final_round"]
    head.add_row(
        "final round",
        f"by {final.get('worker')}" + (f": {final['error']}" if "error" in final else "")
        if final
        else "not run",
    )
    for lost in info["lost"]:
        head.add_row("lost trial", f"{lost.get('params')} on {lost.get('worker')}")
    trials = Table(title="trials")
    cols = ("number", "state", "draft", "gamma", "threshold", "speedup", "worker", "error")
    for col in cols:
        trials.add_column(col)
    for r in info["rows"]:
        trials.add_row(
            *("" if r.get(c) is None else f"{r[c]:.3f}" if c == "speedup" else str(r[c]) for c in cols)
        )
    return [head, trials]
