"""What vLLM's dtype costs the speculative step on this CPU: for each dtype, one plain vLLM server of
the target (started from the environment's compile caches as they are), its start time, T_target
(ms per plain decode token, median of 3 passes over one prompt) and the raw C_ver(γ) curve (the
prefill of γ + 1 tokens after a cached prefix, `backends.vllm.costs.verify_curve_ms`), one server at
a time.

On a CPU without AVX-512, vLLM's `auto` takes bfloat16 and oneDNN cannot build its matmul, so the
server falls back to torch's (backends.vllm.server.run_dtype): this is the measurement behind it.

    SPECDEC_VLLM_PYTHON=.vllm-venv/bin/python python benchmarks/vllm_dtype.py \
        [--target smollm2-135m] [--dtypes float32,bfloat16] [--max-gamma 8] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from specdec_tune.atomic import atomic_write_text
from specdec_tune.backends.vllm.costs import decode_ms, verify_curve_ms
from specdec_tune.backends.vllm.measuring import VllmBackend
from specdec_tune.backends.vllm.models import resolve_target
from specdec_tune.backends.vllm.server import build_info, find_python
from specdec_tune.measure.hardware import local_cpu_isa
from specdec_tune.measure.llamacpp.cases import TextCase
from specdec_tune.measure.servers import servers_die_with_us

PROMPT = "Here is some code to rewrite. " * 12 + "def add(a, b):\n    return a + b\n"


def measure(target: str, dtype: str, max_gamma: int) -> dict[str, object]:
    python = find_python()
    backend = VllmBackend(
        python, target, max_model_len=1024, build=build_info(python), dtype=dtype, memory_share=0.08
    )
    try:
        t0 = time.monotonic()
        server = backend.server(None)
        start_s = time.monotonic() - t0
        prompt = server.tokenize(PROMPT)
        t_ms, t_spread = decode_ms(server, TextCase([prompt], [48], 0.0), passes=3)
        curve, v_spread = verify_curve_ms(server, prompt, max_gamma, 3)
        fallback = "fallback to torch linear" in server.log_tail(100_000)
    finally:
        backend.close()
    slope = (curve[-1] - curve[0]) / max(1, len(curve) - 1)
    return {
        "dtype": dtype, "start_s": round(start_s, 1), "t_target_ms": round(t_ms, 2),
        "t_target_spread": round(t_spread, 3), "verify_raw_ms": [round(v, 1) for v in curve],
        "verify_spread": round(v_spread, 3), "ms_per_drafted_token": round(slope, 2),
        "onednn_fallback_logged": fallback,
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--max-gamma", type=int, default=8)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "vllm" / "dtype.json")
    args = ap.parse_args()
    target = resolve_target(args.target).path
    with servers_die_with_us():
        rows = [measure(target, d, args.max_gamma) for d in args.dtypes.split(",")]
    out = {"cpu_isa": local_cpu_isa(), "target": args.target, "rows": rows}
    atomic_write_text(args.out, json.dumps(out, indent=1) + "\n")
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
