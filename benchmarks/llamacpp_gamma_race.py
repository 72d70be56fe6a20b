"""Each draft's γ raced head to head, to judge the engine cost model's predicted best γ against a
best γ the measurements can tell apart (issue 35: within ±1 of the grid's best γ in 80 % of
(kind, workload) cells).

A 3-repeat grid rarely separates one draft's γ: on code-edit 4 of 7 drafts had every γ within each
other's interval. Here each draft's γ are measured together (interleaved, against shared plain
passes) for `--repeats` repeats, and a γ counts as tied with the best when the paired comparison
does not resolve it slower (sign test and bootstrap, as the final round decides). The γ predicted
best is read from the grid's JSON (`llamacpp_grid.py`'s `cost_model.best_gamma`: the model fitted
on the whole grid), on the grid's own workload, prompts and reply length.

    python benchmarks/llamacpp_gamma_race.py benchmarks/results/llamacpp_grid_general_confirmed.json \
        [--repeats 6] [--out FILE]

Writes JSON (default: beside the grid, `_gamma_race` added) and prints one line per draft.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from specdec_tune import app
from specdec_tune.atomic import atomic_write_text
from specdec_tune.backends.llamacpp import open_engine
from specdec_tune.domain import Config
from specdec_tune.measure.llamacpp.args import parse_llamacpp_draft
from specdec_tune.measure.llamacpp.server import servers_die_with_us
from specdec_tune.measure.stats import compare

sys.path.insert(0, str(Path(__file__).parent))
from llamacpp_grid import row  # a sibling script, not a package


def gammas_of(grid: dict[str, Any], draft: str) -> list[int]:
    """The γ the grid measured for `draft` (its rows are labelled "draft γ=G")."""
    prefix = f"{draft} γ="
    return sorted(int(r["config"][len(prefix) :]) for r in grid["grid"] if r["config"].startswith(prefix))


def verdict(measured: list[Any], gammas: list[int], seed: int) -> tuple[int, list[int]]:
    """The best γ (highest speedup) and every γ not resolved slower than it, paired."""
    best = max(range(len(gammas)), key=lambda i: measured[i].metrics.speedup)
    tied = [
        g
        for i, g in enumerate(gammas)
        if i == best or not compare(list(measured[best].speedups), list(measured[i].speedups), seed).a_wins
    ]
    return gammas[best], tied


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("grid", type=Path, help="a llamacpp_grid.py JSON with its cost_model")
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    grid = json.loads(args.grid.read_text())
    predicted = grid["cost_model"]["best_gamma"]
    drafts = {name: gammas_of(grid, name) for name in predicted}
    models = app.Models(
        target=args.target,
        workload=grid["workload"],
        prompts=grid["prompts"],
        max_new_tokens=grid["max_new_tokens"],
        backend="llamacpp",
        drafts=[parse_llamacpp_draft(name) for name in drafts],
        context_length=grid.get("context_length"),
    )
    out: dict[str, Any] = {"grid": str(args.grid), "workload": grid["workload"], "repeats": args.repeats}
    rows: dict[str, Any] = {}
    t0 = time.monotonic()
    with servers_die_with_us():
        s = open_engine(models)
        try:
            for name, gammas in drafts.items():
                spec = parse_llamacpp_draft(name)
                configs = [Config(spec, g) for g in gammas]
                measured = s.backend.measure(configs, s.case, 1, args.repeats, seed=args.seed)
                best, tied = verdict(measured, gammas, args.seed)
                guess = predicted[name]["predicted"]
                rows[name] = {
                    "raced": [row(c, m, args.seed) for c, m in zip(configs, measured, strict=True)],
                    "best": best,
                    "tied": tied,
                    "predicted": guess,
                    "grid_best": predicted[name]["measured"],
                    "agrees": any(abs(guess - g) <= 1 for g in tied),
                    "agrees_strict": abs(guess - best) <= 1,
                }
                speeds = " ".join(
                    f"γ{g} {m.metrics.speedup:.3f}" for g, m in zip(gammas, measured, strict=True)
                )
                print(f"{name:18s} {speeds}  best γ{best} tied {tied} predicted γ{guess}", flush=True)
        finally:
            s.close()
    out["drafts"] = rows
    out["agrees"] = sum(r["agrees"] for r in rows.values())
    out["agrees_strict"] = sum(r["agrees_strict"] for r in rows.values())
    out["seconds"] = round(time.monotonic() - t0, 1)
    path = args.out or args.grid.with_name(args.grid.stem + "_gamma_race.json")
    atomic_write_text(path, json.dumps(out, indent=1) + "\n")
    print(
        f"predicted γ within ±1 of a γ tied with the raced best: {out['agrees']} of {len(rows)} "
        f"(of the raced best itself: {out['agrees_strict']}); wrote {path} ({out['seconds']} s)"
    )


if __name__ == "__main__":
    main()
