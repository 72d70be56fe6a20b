"""How far apart fresh processes measure plain decoding, alone and per decode-anchor step.

Each of N fresh processes loads a profile's target and workload as `check` does (default: the
committed demo profile of this machine kind), builds the decode anchor from its shape
(measure.decode_anchor) and times plain decoding of the workload with the anchor between its
prompts (`bench.measure(anchor=...)`, as `check` does), R repeats, and the small-matmul anchor
after it. Printed and written: per process the medians of plain tokens/s, of plain tokens/s per
anchor step/s, and of plain tokens/s read at the first process's matmul speed (what `check` did
before the decode anchor); then each one's coefficient of variation across the processes.

    python benchmarks/decode_anchor.py [PROFILE] [--processes 8] [--repeats 5] [--lock /tmp/cpu.lock]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, statistics, sys
import torch
from specdec_tune.measure.anchors import measure_matmul_gflops
from specdec_tune.measure.bench import measure
from specdec_tune.measure.decode_anchor import DecodeAnchor, spec_of
from specdec_tune.app.profile_models import stored_models
from specdec_tune.store.yamlio import load_profile

torch.set_num_threads(int(sys.argv[2]))
from pathlib import Path
path = Path(sys.argv[3])
p = load_profile(path)
s = stored_models(p, path, [p.best.config.draft], device="cpu").open(lazy_drafts=False)
anchor = DecodeAnchor(spec_of(s.target.model), s.device)
m = measure(s.target.model, None, 0, 0.0, s.case, repeats=int(sys.argv[1]), ctx=s.ctx, anchor=anchor)
print(json.dumps({
    "plain": m.baseline_rates, "per_anchor": m.plain_per_anchor, "anchor": m.anchor_rates,
    "matmul": measure_matmul_gflops(s.device)[0],
}))
"""


def cv(xs: list[float]) -> float:
    return statistics.pstdev(xs) / statistics.fmean(xs) if len(xs) > 1 else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", nargs="?", type=Path, default=ROOT / "profiles/cpu-amd-epyc-2t/demo.yaml")
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lock", type=Path, default=None, help="flock this file around each process")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/decode_anchor.json")
    args = ap.parse_args()
    rows = []
    for i in range(args.processes):
        with open(args.lock, "a") if args.lock else contextlib.nullcontext() as fh:
            if fh is not None:
                import fcntl

                fcntl.flock(fh, fcntl.LOCK_EX)
            done = subprocess.run(
                [sys.executable, "-c", CHILD, str(args.repeats), str(args.threads), str(args.profile)],
                cwd=ROOT, capture_output=True, text=True, timeout=900,
            )  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"process {i + 1} failed: {done.stderr.strip()[-800:]}")
        got = json.loads(done.stdout.strip().splitlines()[-1])
        row = {
            "plain": statistics.median(got["plain"]),
            "per_anchor": statistics.median(got["per_anchor"]),
            "matmul": got["matmul"],
            "within_plain_cv": cv(got["plain"]),
            "within_per_anchor_cv": cv(got["per_anchor"]),
            "repeats": got,
        }
        rows.append(row)
        print(
            f"process {i + 1}: plain {row['plain']:.1f} tokens/s (cv {row['within_plain_cv']:.3f} over "
            f"repeats), per anchor step {row['per_anchor']:.4f} (cv {row['within_per_anchor_cv']:.3f}), "
            f"matmul {row['matmul']:.1f} GFLOP/s",
            flush=True,
        )
    first = rows[0]["matmul"]
    summary = {
        "plain_cv": cv([r["plain"] for r in rows]),
        "plain_at_matmul_speed_cv": cv([r["plain"] * first / r["matmul"] for r in rows]),
        "per_anchor_cv": cv([r["per_anchor"] for r in rows]),
        "plain_range": [min(r["plain"] for r in rows), max(r["plain"] for r in rows)],
        "per_anchor_range": [min(r["per_anchor"] for r in rows), max(r["per_anchor"] for r in rows)],
    }
    print(
        f"across {len(rows)} processes: plain tokens/s cv {summary['plain_cv']:.4f}, read at the matmul's "
        f"speed {summary['plain_at_matmul_speed_cv']:.4f}, per decode-anchor step {summary['per_anchor_cv']:.4f}"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    doc |= {"out": str(args.out), "summary": summary, "processes": rows}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
