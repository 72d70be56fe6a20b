"""How long a vLLM server holds a core after it answers: a small matmul (the machine anchor) timed
at several waits after a request to an otherwise idle server. docs/vllm.md keeps the numbers; the
backend's SETTLE_S and the session's `settle_s` come from them.

    SPECDEC_VLLM_PYTHON=.vllm-venv/bin/python python benchmarks/vllm_settle.py [--model DIR]
"""

from __future__ import annotations

import argparse
import os
import time

from specdec_tune.backends.vllm.args import server_args
from specdec_tune.backends.vllm.server import VllmServer, find_python
from specdec_tune.demo import demo_path
from specdec_tune.measure.anchors import measure_matmul_gflops

WAITS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.2, 1.5, 2.0, 3.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(demo_path("demo")))
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    python = find_python(os.environ.get("SPECDEC_VLLM_PYTHON"))
    args = [
        *server_args(a.model, None, max_model_len=512, extra=["--enforce-eager"]),
        "--gpu-memory-utilization", "0.08",
    ]  # fmt: skip
    server = VllmServer(python=python, args=args, model=a.model)
    server.start(900.0)
    try:
        ids = server.tokenize("def add(a, b):\n    return a + b\n")
        print(f"idle: {measure_matmul_gflops('cpu')[0]:.1f} GFLOP/s")
        for r in range(a.rounds):
            for wait in WAITS:
                server.complete(ids, 16, 0.0)
                time.sleep(wait)
                print(f"round {r}, {wait:.2f} s after a reply: {measure_matmul_gflops('cpu')[0]:.1f} GFLOP/s")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
