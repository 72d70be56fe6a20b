"""An exhaustive grid of vLLM drafts x γ on one workload, each config timed ABBA against the same plain
vLLM server (B = 1), beside vLLM's documented example configs and, when given, the config a
`run --backend vllm` chose (its profile): is the run's choice within a few per cent of the grid's
best, never below the documented examples, and does the engine model predict each draft's best γ?
The grid's top configs and the run's choice are then raced again head to head (--confirm): that
round's best is the reference the run's choice is held to (a grid's best of three repeats is
biased upward).

    SPECDEC_VLLM_PYTHON=.vllm-venv/bin/python python benchmarks/vllm_grid.py [--target demo] \
        [--workload code-edit] [--profile P.yaml] [--drafts ngram:4,ngram:2-4,ngram:1-3] \
        [--gammas 2,4,6,8] [--prompts 3] [-n 64] [--repeats 3] [--confirm 4] [--out FILE]

Every server is started once (a start costs tens of seconds on a CPU) and kept while it is measured.
Writes JSON (benchmarks/results/vllm_grid_<target>_<workload>.json) in llamacpp_grid.py's layout.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from llamacpp_grid import confirm, measure_rows, model_check, write_and_print

from specdec_tune import app
from specdec_tune.backends.base import Purpose
from specdec_tune.backends.vllm.args import parse_vllm_draft
from specdec_tune.backends.vllm.session import VllmSession
from specdec_tune.domain import Config
from specdec_tune.measure.servers import servers_die_with_us
from specdec_tune.store.yamlio import load_profile


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="demo")
    ap.add_argument("--workload", default="code-edit")
    ap.add_argument("--profile", type=Path, help="a profile of `run --backend vllm` on this workload")
    ap.add_argument("--drafts", default="ngram:4,ngram:2-4,ngram:1-3")
    ap.add_argument("--gammas", default="2,4,6,8")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("-n", "--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--confirm", type=int, default=4, help="race the grid's top K and the run's choice again")
    ap.add_argument("--confirm-repeats", type=int, default=5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    gammas = [int(g) for g in args.gammas.split(",")]
    configs = [Config(parse_vllm_draft(d), g) for d in args.drafts.split(",") for g in gammas]
    chosen, prompts, new_tokens = None, args.prompts, args.max_new_tokens
    if args.profile is not None:  # the run's choice, on the workload it was tuned on
        p = load_profile(args.profile)
        chosen, prompts, new_tokens = p.best.config, p.workload.prompts, p.workload.max_new_tokens
    drafts = {c.draft.name: c.draft for c in configs + ([chosen] if chosen and chosen.gamma else [])}
    models = app.Models(
        target=args.target, workload=args.workload, prompts=prompts, max_new_tokens=new_tokens,
        backend="vllm", drafts=list(drafts.values()),
    )  # fmt: skip
    out: dict[str, Any] = {"target": args.target, "workload": args.workload, "prompts": prompts}
    out["max_new_tokens"] = new_tokens
    t0 = time.monotonic()
    with servers_die_with_us():
        s = VllmSession(models, Purpose())
        try:
            out["build"] = s.backend.info()["build"]
            defaults = s.default_configs()
            todo = [("grid", c) for c in configs] + [("default", c) for c in defaults]
            if chosen is not None and chosen.gamma > 0 and all(c.key != chosen.key for _, c in todo):
                todo.append(("chosen", chosen))
            measured: dict[str, list[dict[str, Any]]] = {}
            observed = measure_rows(s, todo, args.repeats, args.seed, measured)
            out["plain_tok_s"] = measured["grid"][0]["plain_tok_s"]
            if args.confirm > 0:
                rows = measured.get("grid", []) + measured.get("default", [])
                labels = {c.label: c for _, c in todo}
                out["confirm"] = confirm(
                    s, rows, labels, chosen, args.confirm, args.confirm_repeats, args.seed
                )
            out["start_s"] = [round(x, 1) for x in s.backend.start_seconds]
        finally:
            s.close()
    intervals = {r["config"]: r["interval"] for r in measured["grid"]}
    try:  # the session's model (a cost per forward of a speculative server), and without that term
        out["cost_model"] = model_check(observed, intervals, forward_overhead=True)
        out["cost_model_without_forward_overhead"] = model_check(observed, intervals)
    except Exception as e:  # the grid's measurements are kept whatever this says
        out["cost_model"] = {"error": repr(e)}
    # every request's counters, so a change of the model can be judged on this grid again offline
    out["observations"] = [
        {
            "config": o.config.label,
            **{
                side: [[r.predicted_n, round(r.predicted_ms, 3), r.draft_n, r.draft_accepted] for r in reqs]
                for side, reqs in (("spec", o.spec), ("plain", o.plain))
            },
        }
        for o in observed
    ]
    everything = measured.get("grid", []) + measured.get("default", [])
    out |= {"grid": measured.get("grid", []), "defaults": measured.get("default", [])}
    out["best"] = max(everything, key=lambda r: r["speedup"])
    out["seconds"] = round(time.monotonic() - t0, 1)
    path = args.out or Path(__file__).parent / "results" / f"vllm_grid_{args.target}_{args.workload}.json"
    write_and_print(out, path)


if __name__ == "__main__":
    main()
