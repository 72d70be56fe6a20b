"""How much does one vLLM server differ from another of the same config, and what does it come from?

One reference server stays up for the whole run; test servers of the same config start one after
another, each timed in turn with the reference (ABBA, T = 0, vLLM's own decode time) for a few
repeats, then stopped. Each test server's level is the median of its repeats' test/reference
ratios, so drift of the machine over the run cancels. Test servers alternate between conditions
(environments beside the user's) so that a setting that makes servers more alike shows up as a
smaller spread of levels.

Each server also times a step no speculative config changes (one forward of 2 new tokens after a
cached 256-token prefix, median of 5) and its prompts' prefill, turn by turn with the rates: does a
server's level follow a slower forward that an anchor could divide out? (Stop 60: no; r = 0.40.)

Why: `check` and the schedule's verdict compare servers, and two servers of one config have read
2.5-10 % apart here (docs/vllm.md), an error no number of repeats in one server pair removes.

    SPECDEC_VLLM_PYTHON=.vllm-venv/bin/python python benchmarks/vllm_server_spread.py
    SPECDEC_VLLM_PYTHON=.vllm-venv/bin/python python benchmarks/vllm_server_spread.py --condition thp=THP_MEM_ALLOC_ENABLE=1
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.vllm_aot import TASKS  # noqa: E402  (the same prompts as the AOT comparison)
from specdec_tune.backends.vllm.args import measure_only_args, parse_vllm_draft, server_args  # noqa: E402
from specdec_tune.backends.vllm.costs import PREFILL_S  # noqa: E402
from specdec_tune.backends.vllm.measuring import DECODE_S, SETTLE_S  # noqa: E402
from specdec_tune.backends.vllm.models import resolve_target  # noqa: E402
from specdec_tune.backends.vllm.server import (  # noqa: E402
    VllmServer,
    build_info,
    counters_since,
    find_python,
    server_env,
)
from specdec_tune.domain import Config  # noqa: E402

WORKER_NAME = "VLLM::Worker"  # the comm of a CPU worker process (its threads run the model)


def _group_pids(pgid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if os.getpgid(int(d.name)) == pgid:
                    out.append(int(d.name))
            except OSError:
                continue
    return out


def pin_frontend(pgid: int) -> set[int] | None:
    """Keep a CPU server's frontend off its workers' cores (an experiment: it made servers noisier,
    see the docstring above): every thread of the group's processes
    but the workers (the API server, the engine core) onto the CPUs no worker is bound to. vLLM's CPU
    build binds its workers' threads to cores and reserves the rest "for the scheduler process",
    but leaves that process and the API server free to run on the workers' cores, where they
    preempt a decode step. The CPUs they were put on, or None (no worker found, or no CPU left)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    pids = _group_pids(pgid)
    names = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            names[pid] = Path(f"/proc/{pid}/comm").read_text().strip()
    workers = [pid for pid, name in names.items() if name.startswith(WORKER_NAME)]
    if not workers:
        return None
    taken: set[int] = set()
    free: set[int] = set()
    for pid in workers:
        with contextlib.suppress(OSError):
            taken |= os.sched_getaffinity(pid)
    with contextlib.suppress(OSError):
        free = os.sched_getaffinity(pgid) - taken  # the CPUs the server was started on, less the workers'
    if not free:
        return None
    for pid in names:
        if pid in workers:
            continue
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(tid), free)
    return free


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", type=int, default=3, help="test servers per condition")
    ap.add_argument("--repeats", type=int, default=4, help="ABBA repeats per test server")
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--draft", default=None, help="a vLLM draft (default: plain decoding)")
    ap.add_argument("--gamma", type=int, default=5)
    ap.add_argument("-n", type=int, default=48, help="new tokens per prompt")
    ap.add_argument(
        "--condition", action="append", default=[], metavar="NAME=VAR=VALUE",
        help="an extra condition: test servers with VAR=VALUE in their environment (repeatable)",
    )  # fmt: skip
    ap.add_argument(
        "--pin-frontend", action="store_true",
        help="every server's API server and engine core, and this client, off the workers' cores",
    )  # fmt: skip
    ap.add_argument("--out", type=Path, default=None, help="write the levels as JSON here")
    a = ap.parse_args()
    target = resolve_target(a.target)
    spec = Config(parse_vllm_draft(a.draft), a.gamma) if a.draft else None
    args = server_args(target.path, spec, max_model_len=768) + measure_only_args(0.083)
    python = find_python()
    base = server_env(build_info(python))
    conditions: dict[str, dict[str, str]] = {"default": {}}
    for c in a.condition:
        name, var, value = c.split("=", 2)
        conditions[name] = {var: value}
    reference = VllmServer(python=python, args=list(args), model=target.path, extra_env=dict(base))
    test: VllmServer | None = None
    levels: dict[str, list[float]] = {name: [] for name in conditions}
    within: dict[str, list[float]] = {name: [] for name in conditions}
    steps: dict[str, list[float]] = {name: [] for name in conditions}
    shorts: dict[str, list[float]] = {name: [] for name in conditions}

    everywhere = os.sched_getaffinity(0)

    def start(server: VllmServer) -> None:
        os.sched_setaffinity(0, everywhere)  # a server starts where vLLM would place it
        server.start()
        if a.pin_frontend:
            free = pin_frontend(os.getpgid(server.proc.pid))
            os.sched_setaffinity(0, free or os.sched_getaffinity(0))
            print(f"frontend pinned to {free}", flush=True)

    try:
        start(reference)
        prompts = [
            reference.tokenize(f"Write a Python function that {t}. Explain it step by step.") for t in TASKS
        ]

        block = 16
        long = [t for p in prompts for t in p]
        prefix = (long * (256 // max(1, len(long)) + 1))[: 256 // block * block]

        def step_ms(server: VllmServer) -> float:
            """The anchor: ms of one forward over 2 new tokens after a cached prefix (median of 5),
            a step that no speculative config changes."""
            server.complete([*prefix, 11, 12], 1, 0.0)  # caches the prefix
            samples = []
            for r in range(5):
                c0 = server.counters()
                server.complete([*prefix, 13, 20 + r], 1, 0.0)
                samples.append(1000.0 * counters_since(c0, server.counters()).get(PREFILL_S, 0.0))
            return statistics.median(samples)

        def rate(
            server: VllmServer,
            anchors: dict[int, list[float]] | None = None,
            short: dict[int, list[float]] | None = None,
        ) -> float:
            """The server's plain decode rate over the prompts; with `anchors` and `short`, its step
            anchor and its prompts' mean prefill ms are appended there (by the server's id)."""
            time.sleep(SETTLE_S)  # the other server's worker lets go of its core first
            before = server.counters()
            n = sum(server.complete(p, a.n, 0.0)["n"] - 1 for p in prompts)
            d = counters_since(before, server.counters())
            if anchors is not None and short is not None:
                anchors.setdefault(id(server), []).append(step_ms(server))
                short.setdefault(id(server), []).append(1000.0 * d.get(PREFILL_S, 0.0) / len(prompts))
            return n / d[DECODE_S]

        rate(reference)  # untimed
        for i in range(a.servers):
            for name, env in conditions.items():
                test = VllmServer(
                    python=python, args=list(args), model=target.path, extra_env={**base, **env}
                )
                started = time.monotonic()
                start(test)
                start_s = time.monotonic() - started
                rate(test)  # untimed
                ratios = []
                anchors: dict[int, list[float]] = {}
                short: dict[int, list[float]] = {}
                for r in range(a.repeats):
                    pair = (test, reference) if r % 2 == 0 else (reference, test)
                    got = {id(s): rate(s, anchors, short) for s in pair}
                    ratios.append(got[id(test)] / got[id(reference)])
                # the anchors' ratios: reference ms / test ms, as the rates' test / reference
                step_level = statistics.median(
                    x / y for x, y in zip(anchors[id(reference)], anchors[id(test)], strict=True)
                )
                short_level = statistics.median(
                    x / y for x, y in zip(short[id(reference)], short[id(test)], strict=True)
                )
                steps[name].append(step_level)
                shorts[name].append(short_level)
                print(
                    f"  anchor levels: cached-prefix step {step_level:.3f}, short prefill {short_level:.3f}"
                )
                test.stop()
                test = None
                level = statistics.median(ratios)
                levels[name].append(level)
                within[name].append(max(ratios) / min(ratios) - 1)
                print(
                    f"{name} server {i + 1}: started in {start_s:.1f} s; test/reference "
                    f"{[round(x, 3) for x in ratios]} -> level {level:.3f}",
                    flush=True,
                )
        for name in conditions:
            v = levels[name]
            spread = max(v) / min(v) - 1
            print(
                f"{name}: levels {[round(x, 3) for x in v]}, mean {statistics.mean(v):.3f}, "
                f"spread between servers {100 * spread:.1f} %, within a server (max/min) "
                f"median {100 * statistics.median(within[name]):.1f} %"
            )
        if a.out:
            a.out.write_text(
                json.dumps({"levels": levels, "within": within, "step": steps, "short": shorts}, indent=1)
            )
    finally:
        for server in (test, reference):
            if server is not None:
                server.stop()


if __name__ == "__main__":
    main()
