"""A grid of llama.cpp `ngram-simple` configs (lookup length N x drafted tokens γ) on SmolLM2, each
timed interleaved with the plain server in one backend (B = 1). It is how the llama.cpp backend's
default γ range (16) and default lookup lengths were chosen; rerun it to see them on your machine.

    python benchmarks/llamacpp_sweep.py [--workload code-edit] [-n 128] [--ns 3,4,5,6] \
        [--gammas 6,8,12,16] [--prompts 6] [--repeats 2]

Writes benchmarks/results/llamacpp_sweep_<workload>.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from specdec_tune import app
from specdec_tune.backends.llamacpp import open_engine
from specdec_tune.domain import Config
from specdec_tune.measure.llamacpp.server import servers_die_with_us


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--workload", default="code-edit")
    ap.add_argument("-n", "--max-new-tokens", type=int, default=128)
    ap.add_argument("--ns", default="3,4,5,6")
    ap.add_argument("--gammas", default="6,8,12,16")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    ns = [int(x) for x in args.ns.split(",")]
    gammas = [int(x) for x in args.gammas.split(",")]
    models = app.Models(
        target=args.target,
        workload=args.workload,
        prompts=args.prompts,
        max_new_tokens=args.max_new_tokens,
        backend="llamacpp",
        drafts=[f"ngram-simple:{n}" for n in ns],
    )
    rows: dict[str, dict] = {}
    with servers_die_with_us():
        s = open_engine(models)
        try:
            for spec in s.specs:  # one interleaved measurement per lookup length, all its gammas
                configs = [Config(spec, g) for g in gammas]
                t0 = time.monotonic()
                for c, m in zip(configs, s.backend.measure(configs, s.case, 1, args.repeats), strict=True):
                    rows[c.label] = {
                        "speedup": round(m.metrics.speedup, 3),
                        "speedups": [round(x, 3) for x in m.speedups],
                        "acceptance": round(m.metrics.acceptance_rate, 3),
                        "tau": round(m.metrics.mean_accepted_len, 2),
                        "plain_tok_s": round(m.metrics.baseline_tokens_per_s, 1),
                    }
                    print(f"{c.label:24s} {rows[c.label]}", flush=True)
                print(f"  ({time.monotonic() - t0:.0f} s)", flush=True)
            build = s.backend.info()
        finally:
            s.close()
    out = Path(__file__).parent / "results" / f"llamacpp_sweep_{args.workload}.json"
    out.write_text(json.dumps({"args": vars(args), "build": build, "rows": rows}, indent=1, default=str))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
