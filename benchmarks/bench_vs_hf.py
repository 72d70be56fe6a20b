"""Our speculative loop vs transformers' assisted generation on the demo pair, same configs.

Both run the same draft, γ (constant schedule) and threshold on the same prompts, interleaved ABBA
after a warm-up; the ratio is the median of per-repeat tokens/s ratios. Greedy tokens must be
identical. Not a test: run it by hand and put the numbers in notes.

    python benchmarks/bench_vs_hf.py [--prompts 8] [--max-new-tokens 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from specdec_tune.measure.hfcompare import HFConfig, measure_hf
from specdec_tune.runtime.session import load_models

CONFIGS = [
    ("none", None, 0, 0.0),
    ("model", "draft-1l", 4, 0.0),
    ("model", "draft-1l", 4, 0.4),
    ("model", "draft-1l", 8, 0.0),
    ("model", "draft-2l", 4, 0.0),
    ("prompt_lookup", None, 4, 0.0),
    ("layer_skip", None, 4, 0.0),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/vs_hf.json"))
    args = ap.parse_args()

    s = load_models(
        None,
        ["draft-1l", "draft-2l"],
        "demo-code",
        args.max_new_tokens,
        0.0,
        "cpu",
        "auto",
        args.prompts,
        lazy_drafts=False,
    )
    rows = []
    for kind, draft, gamma, threshold in CONFIGS:
        t0 = time.monotonic()
        dm = s.drafts[draft].model if draft else None
        cfg = HFConfig(kind, gamma, threshold, dm, layers=2 if kind == "layer_skip" else None)
        r = measure_hf(s.target.model, s.case, cfg, repeats=args.repeats)
        rows.append(
            {
                "kind": kind,
                "draft": draft,
                "gamma": gamma,
                "threshold": threshold,
                **r,
                "seconds": round(time.monotonic() - t0, 1),
            }
        )
        print(json.dumps(rows[-1]), flush=True)

    t = Table(
        title=f"ours vs HF assisted generation — demo pair, {args.prompts} prompts × {args.max_new_tokens} tokens"
    )
    for col in ("config", "ours tok/s", "HF tok/s", "ours/HF", "spread", "identical"):
        t.add_column(col)
    for r in rows:
        label = f"{r['draft'] or r['kind']} γ={r['gamma']} t={r['threshold']}"
        t.add_row(
            label,
            f"{r['ours_tokens_per_s']:.1f}",
            f"{r['hf_tokens_per_s']:.1f}",
            f"{r['ratio']:.2f}×",
            f"{r['ratio_spread'] * 100:.0f}%",
            str(r["identical_tokens"]),
        )
    Console().print(t)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"machine": platform.processor() or platform.machine(), "rows": rows}, indent=2)
    )


if __name__ == "__main__":
    main()
