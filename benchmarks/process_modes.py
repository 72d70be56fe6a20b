"""Does one process's speed stand for the machine's? The same profile's best config against plain
decoding, measured as `check` measures it, in N fresh processes with R interleaved repeats each.

On a quiet 2-core VM the speedup of the demo profile's best config sat near 2.04x in some processes
and near 2.43x in others, a process mostly keeping its level over its repeats and now and then
switching; which level a process gets is not its hash seed. That is why `check` judges against
fresh reference processes and confirms a doubtful result in fresh processes (app.checking).

    python benchmarks/process_modes.py PROFILE [--processes 6] [--repeats 6]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHILD = """
import json, sys
from pathlib import Path
from specdec_tune.app.profile_models import stored_models
from specdec_tune.measure.anchors import machine_speed
from specdec_tune.measure.bench import measure
from specdec_tune.runtime.drafting.build import build_drafter
from specdec_tune.search.policymodel import policy_drafter
from specdec_tune.store.yamlio import load_profile
path, repeats = Path(sys.argv[1]), int(sys.argv[2])
p = load_profile(path)
cfg = p.best.config
s = stored_models(p, path, [cfg.draft]).open(lazy_drafts=False)
spec = next((d for d in s.specs if d.name == cfg.draft.name), cfg.draft)
d = policy_drafter(build_drafter(spec, s.target.model, s.draft_modules, s.ctx), cfg, p.costs)
matmul = machine_speed(s.device).matmul_gflops
m = measure(s.target.model, d, cfg.gamma, cfg.threshold, s.case, repeats=repeats, ctx=s.ctx)
print(json.dumps({"speedups": [round(x, 4) for x in m.speedups], "plain": [round(x, 2) for x in m.baseline_rates],
                  "speculative": [round(x, 2) for x in m.rates], "matmul_gflops": matmul}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", type=Path)
    ap.add_argument("--processes", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/process_modes.json")
    args = ap.parse_args()
    runs = []
    for i in range(args.processes):
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(args.profile), str(args.repeats)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        r = runs[-1]
        print(f"process {i + 1}: speedups {r['speedups']} plain {r['plain']}", flush=True)
    medians = [statistics.median(r["speedups"]) for r in runs]
    within = [statistics.pstdev(r["speedups"]) / statistics.fmean(r["speedups"]) for r in runs]
    result = {
        "profile": str(args.profile),
        "repeats": args.repeats,
        "processes": runs,
        "process_median_speedups": medians,
        "between_processes_cv": statistics.pstdev(medians) / statistics.fmean(medians),
        "within_process_cv_median": statistics.median(within),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"process medians {min(medians):.3f}-{max(medians):.3f}x; CV between processes "
        f"{result['between_processes_cv']:.1%}, within one (median) {result['within_process_cv_median']:.1%}"
    )


if __name__ == "__main__":
    main()
