"""Tuned inside llama.cpp vs what a user tries first, on SmolLM2-135M-Instruct (B = 1).

1. `run --backend llamacpp` on the workload (default code-edit) within its default budget: the tuned
   config (timed: the whole run, the build excluded);
2. one interleaved comparison in ONE backend (so one plain server and the same build for all): the
   tuned config, llama.cpp's own defaults per spec type (ngram-simple: n 12, m 48; ngram-mod:
   n_match 24, n_min 48, n_max 64; draft-simple: n_max 3 with the target's first K blocks as the
   draft), the issue's hand-picked ngram-simple n 4 m 6, and plain decoding;
3. exactness at T = 0 of every config (prompts whose tokens differ from plain, near-ties).

    python benchmarks/llamacpp.py [--workload code-edit] [--prompts 8] [-n 128] [--repeats 5]

Writes benchmarks/results/llamacpp_<workload>.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from specdec_tune import app
from specdec_tune.backends.llamacpp import open_engine
from specdec_tune.domain import Config
from specdec_tune.measure.llamacpp.args import ENGINE_MAX_GAMMA, parse_llamacpp_draft
from specdec_tune.measure.llamacpp.server import servers_die_with_us

DEFAULTS = {  # llama.cpp's defaults per spec type (common/common.h of build 11434)
    "ngram-simple default (n 12, m 48)": ("ngram-simple:12", 48, 0.0),
    "ngram-mod default (match 24, min 48, max 64)": ("ngram-mod:24:48", 64, 0.0),
    "draft-simple default (n_max 3, p_min 0) with layer-skip:{k}": ("layer-skip:{k}", 3, 0.0),
    "hand-picked ngram-simple n 4 m 6 (the issue's)": ("ngram-simple:4", 6, 0.0),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--workload", default="code-edit")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("-n", "--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--layer-skip", type=int, default=10, help="K of the draft-simple default's draft")
    ap.add_argument("--budget", type=float, default=240.0)
    ap.add_argument("--batch-sizes", default="1")
    ap.add_argument("--profile", type=Path, help="skip the run: compare the best config of this profile")
    ap.add_argument("--threads", type=int, default=None, help="engine threads (default: every core)")
    args = ap.parse_args()

    models = app.Models(
        target=args.target,
        workload=args.workload,
        prompts=args.prompts,
        max_new_tokens=args.max_new_tokens,
        backend="llamacpp",
        threads=args.threads,
    )
    report: dict = {"args": vars(args) | {"profile": str(args.profile) if args.profile else None}}
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    if args.profile is None:
        tmp = Path(tempfile.mkdtemp())
        t0 = time.monotonic()
        outcome = app.tune(
            models,
            app.TuneSettings(storage=f"sqlite:///{tmp / 's.db'}", max_gamma=ENGINE_MAX_GAMMA),
            out=tmp / "p.yaml",
            envelope=app.Envelope(sizes),
            budget_s=args.budget,
        )
        report["run_s"] = round(time.monotonic() - t0, 1)
        profile = outcome.profile
        report["profile"] = str(outcome.path)
    else:
        from specdec_tune.store.yamlio import load_profile

        profile = load_profile(args.profile)
    report["search"] = {
        "trials": profile.search.trials,
        "budget_note": profile.search.budget_note,
        "best": profile.best.config.label,
        "best_final_speedup": profile.best.metrics.speedup,
        "best_search_speedup": profile.best.metrics.search_speedup,
        "alternatives": [(r.config.label, r.metrics.speedup) for r in profile.alternatives],
        "batch_table": [
            (row.batch_size, row.best.config.label, row.best.metrics.speedup) for row in profile.batch_table
        ],
        "b_star": profile.b_star,
    }
    print(json.dumps(report["search"], indent=1), flush=True)

    tuned = profile.best.config
    drafts = {
        label.format(k=args.layer_skip): (d.format(k=args.layer_skip), g, t)
        for label, (d, g, t) in DEFAULTS.items()
    }
    names = sorted({d for d, _, _ in drafts.values()} | ({tuned.draft.name} if tuned.gamma else set()))
    draft_args = [n if not n.startswith("layer-skip-") else "layer-skip:" + n.split("-")[-1] for n in names]
    with servers_die_with_us():
        s = open_engine(replace(models, drafts=draft_args))
        try:
            by_name = {sp.name: sp for sp in s.specs}
            configs = {
                "tuned: " + tuned.label: replace(tuned, draft=by_name.get(tuned.draft.name, tuned.draft))
            }
            for label, (d, g, t) in drafts.items():
                configs[label] = Config(parse_llamacpp_draft(d) if d not in by_name else by_name[d], g, t)
            configs["plain"] = Config(parse_llamacpp_draft("ngram-simple"), 0)
            rows = {}
            for label, config in configs.items():
                (m,) = s.backend.measure([config], s.case, 1, args.repeats)
                rows[label] = {
                    "speedup": round(m.metrics.speedup, 4),
                    "speedups": [round(x, 4) for x in m.speedups],
                    "tok_s": round(m.metrics.tokens_per_s, 1),
                    "plain_tok_s": round(m.metrics.baseline_tokens_per_s, 1),
                    "acceptance": round(m.metrics.acceptance_rate, 3),
                    "tau": round(m.metrics.mean_accepted_len, 3),
                    "exactness": m.exactness,
                    "flags": m.flags[m.flags.index("--spec-type") :] if "--spec-type" in m.flags else [],
                }
                print(f"{label:55s} {rows[label]['speedup']:.3f}x  {rows[label]['speedups']}", flush=True)
            report["compare"] = rows
            report["build"] = s.backend.info()
        finally:
            s.close()
    out = Path(__file__).parent / "results" / f"llamacpp_{args.workload}.json"
    out.write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
