"""The engine's batch-size schedule as `show` prints it (BackendInfo.schedule: an engine that runs
its answer over batch sizes as a schedule measured it as a config of its own): its tiers, and at
every measured concurrency its speedup over plain and its paired ratio to each fixed γ it mixes."""

from __future__ import annotations

from typing import Any

from rich.table import Table


def schedule_table(schedule: dict[str, Any]) -> Table | None:
    """The measured schedule's rows (or why none was needed: one γ served every batch size); None
    when the profile holds none."""
    if schedule and schedule.get("one_gamma") is not None and not schedule.get("rows"):
        k = schedule["tiers"][0][2]
        kept = schedule["one_gamma"]
        t = Table(
            title=f"No batch-size schedule: {schedule['draft']} γ {k} at every measured batch size",
            title_justify="left",
            caption="a faster-looking γ, not resolved faster than the γ of the size below, does not switch K" if kept else None,
        )  # fmt: skip
        t.add_column("B")
        t.add_column("the fastest there, and the γ kept")
        for line in kept:
            b, _, rest = line.partition(": ")
            t.add_row(b, rest)
        return t
    if not schedule or not schedule.get("rows"):
        return None
    tiers = ", ".join(f"B {s}-{e}: γ {k}" for s, e, k in schedule["tiers"])
    verdict = (
        "emitted"
        if schedule.get("emitted")
        else "not emitted: lost at " + "; ".join(schedule.get("lost", []))
    )
    spread = schedule.get("server_spread")
    below = schedule.get("below_plain") or []
    caption = "; ".join(
        ([f"a loss is a paired ratio below 1 - {spread:.3f}, the spread this run measured between two servers of one config (B = 1)"] if spread else [])
        + ([f"plain decoding was faster at {'; '.join(below)}: so would be each fixed γ of this draft, see the batch table"] if below else [])
        + (["† its tokens/s over the plain rate that batch size's cell measured (no plain side: no K = 0 tier, so each ratio to a fixed γ is paired without it)"] if any(r.get("speedup_over") == "cell" for r in schedule["rows"]) else [])
    )  # fmt: skip
    t = Table(
        title=f"Batch-size schedule of {schedule['draft']} ({tiers}), measured: {verdict}",
        title_justify="left",
        caption=caption or None,
    )
    t.add_column("B", justify="right")
    t.add_column("speedup over plain", justify="right")
    t.add_column("tok/s", justify="right")
    t.add_column("against each fixed γ (paired ratio, 95% CI)")
    for r in schedule["rows"]:
        ci = r.get("interval") or [None, None]
        if r.get("speedup") is None:
            over_plain = "—"  # a boundary no cell measured, and no plain side: nothing to divide by
        else:
            over_plain = f"{r['speedup']:.2f}×" + (
                f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci[0] is not None else ""
            )
            over_plain += " †" if r.get("speedup_over") == "cell" else ""
        against = ", ".join(
            f"γ {a['gamma']}: {a['ratio']:.3f} [{a['interval'][0]:.3f}, {a['interval'][1]:.3f}]"
            + (" slower" if a["slower"] else "")
            for a in r["against"]
        )
        t.add_row(str(r["batch_size"]), over_plain, f"{r['tokens_per_s']:.1f}", against)
    return t
