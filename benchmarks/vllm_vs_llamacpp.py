"""The same prompts through both engines, in one run: plain vLLM, the tuned vLLM config, plain
llama.cpp and the tuned llama.cpp config on one target, each engine's config against its own plain
server (ABBA, B = 1), tokens/s from each engine's own decode clock. The tuned configs are read from
the two profiles a `run` wrote (`--backend vllm` and `--backend llamacpp` on the same workload); both
engines measure the same prompts and reply lengths (the vLLM profile's, or --prompts and -n).

    SPECDEC_VLLM_PYTHON=.vllm-venv/bin/python python benchmarks/vllm_vs_llamacpp.py \
        --vllm-profile profiles/<hw>/smollm2-135m.vllm.yaml \
        --llamacpp-profile profiles/<hw>/smollm2-135m.llamacpp.yaml [--repeats 5]

Prints a Markdown table (docs/vllm.md keeps it) and writes JSON to benchmarks/results/.
The engines run different weights of one model (vLLM: the GGUF dequantised to float32; llama.cpp:
the Q4_1 GGUF itself), as each would be deployed here.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from specdec_tune import app
from specdec_tune.atomic import atomic_write_text
from specdec_tune.backends.base import Purpose, open_session
from specdec_tune.measure.servers import servers_die_with_us
from specdec_tune.measure.stats import speedup_interval
from specdec_tune.store.yamlio import load_profile


def measure(backend: str, profile: Path, repeats: int, prompts: int, new_tokens: int) -> dict[str, Any]:
    """The profile's best config against its engine's plain server, on the profile's workload's
    first `prompts` prompts, `new_tokens` each."""
    p = load_profile(profile)
    best = p.best.config
    models = app.Models(
        target=p.target.path, workload=p.workload.name, prompts=prompts, max_new_tokens=new_tokens,
        backend=backend, drafts=[best.draft] if best.gamma else [],
        **({"dtype": p.target.dtype} if backend == "vllm" and p.target.dtype else {}),  # the dtype that ran
    )  # fmt: skip
    with open_session(models, Purpose("bench")) as s:
        (m,) = s.measure([best], s.case, 1, repeats)
        return {
            "engine": backend,
            "build": s.info()["build"],
            "config": best.label,
            "plain_tok_s": round(m.metrics.baseline_tokens_per_s, 1),
            "tuned_tok_s": round(m.metrics.tokens_per_s, 1),
            "speedup": round(m.metrics.speedup, 3),
            "interval": speedup_interval(m.speedups),
            "prompts": len(s.case.prompts),
            "max_new_tokens": max(s.case.max_new_tokens),
        }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vllm-profile", type=Path, required=True)
    ap.add_argument("--llamacpp-profile", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prompts", type=int, help="default: the vLLM profile's")
    ap.add_argument("-n", "--max-new-tokens", type=int, help="default: the vLLM profile's")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "vllm_vs_llamacpp.json")
    args = ap.parse_args()
    workload = load_profile(args.vllm_profile).workload
    if load_profile(args.llamacpp_profile).workload.name != workload.name:
        raise SystemExit("the two profiles were tuned on different workloads")
    prompts, new_tokens = args.prompts or workload.prompts, args.max_new_tokens or workload.max_new_tokens
    t0 = time.monotonic()
    with servers_die_with_us():
        rows = [
            measure("vllm", args.vllm_profile, args.repeats, prompts, new_tokens),
            measure("llamacpp", args.llamacpp_profile, args.repeats, prompts, new_tokens),
        ]
    out = {"rows": rows, "seconds": round(time.monotonic() - t0, 1)}
    atomic_write_text(args.out, json.dumps(out, indent=1) + "\n")
    print("| engine | plain tokens/s | tuned config | tuned tokens/s | speedup [95 % CI] |")
    print("|---|---|---|---|---|")
    for r in rows:
        ci = "[{:.2f}, {:.2f}]".format(*r["interval"]) if r["interval"] else ""
        print(
            f"| {r['engine']} ({r['build'].get('package')}) | {r['plain_tok_s']} | {r['config']} | {r['tuned_tok_s']} | {r['speedup']}× {ci} |"
        )
    print(f"({out['seconds']} s; {args.out})")


if __name__ == "__main__":
    main()
