"""The llama.cpp backend on a busy machine: does it know the noise, and does `check` tell a load or
a slower machine from a regression? SmolLM2-135M-Instruct (Q4_1) inside llama-server.

(a) One quiet `run --backend llamacpp` and N runs with a planted background load (one process
    spinning one core, or bursts), each on a fresh study: what each recorded as its noise (plain
    passes' spread, what the OS said), its budget note, its best and the final round's verdict;
    then one more run with one core busy and `--threads 1`. With one core of two busy, llama.cpp's
    2 threads crawl (they wait for each other at every step): such a run ends with one line naming
    the load and the --threads that avoids it (exit 2), which is recorded as its result.
(b) `check` of the quiet profile: M on the quiet machine, M under the load, and S on an emulated
    slower machine of the same slug (the cgroup-v1 freezer of benchmarks/interference.py: root
    needed, else skipped and said). Expected: quiet pass (exit 0), loaded pass or inconclusive
    (exit 6, also when the server stops answering under the load), never a regression (exit 1);
    slower: other hardware (exit 3).

A planted slowdown of the target forward has no in-process hook in llama.cpp (another binary is
"other software", exit 3), so catching a regression is measured by benchmarks/interference.py on the
native engine, whose `check` shares the judging (output.check.judge_config).

Every step is kept in --work (state.json) and the results file is rewritten after each; --lock PATH
flocks each measured step, as in interference.py.

    python benchmarks/llamacpp_interference.py --lock /tmp/cpu.lock      # ~20 min on 2 cores
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import yaml
from interference import (
    ROOT,
    Load,
    State,
    add_slower_machine,
    checks,
    cli,
    common_fields,
    config_key,
    locked,
    save_json,
)


def summary(path: Path, seconds: float, load: str | None) -> dict:
    """What a llama.cpp run recorded: its best, the final round's verdict, its noise and budget."""
    p = yaml.safe_load(path.read_text())
    search = p.get("search") or {}
    m = p["best"]["metrics"]
    return {
        "load": load,
        "seconds": round(seconds, 1),
        "best": config_key(p["best"]["config"]),
        "speedup": m["speedup"],
        "interval": m.get("speedup_interval"),
        "verdict": search.get("final_verdict", ""),
        "finalists": search.get("finalists"),
        "trials": search.get("trials"),
        "budget_note": search.get("budget_note"),
        "noise": p.get("noise"),
        "anchors": {k: v for k, v in (p.get("anchors") or {}).items() if not k.startswith("reference")},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2, help="N runs under load (alternating busy, bursts)")
    ap.add_argument("--checks", type=int, default=5, help="M checks per condition")
    ap.add_argument("--slower-checks", type=int, default=3)
    ap.add_argument("--slower-period", type=float, default=0.010)
    ap.add_argument("--slower-frozen", type=float, default=0.0045)
    ap.add_argument("--workload", default="code-edit")
    ap.add_argument("--loaded", choices=["busy", "bursts", "both"], default="both", help="the checks' load")
    ap.add_argument("--burst-on", type=float, default=2.0)
    ap.add_argument("--burst-off", type=float, default=2.0)
    ap.add_argument("--work", type=Path, default=Path("/tmp/specdec-llamacpp-interference"))
    ap.add_argument("--lock", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/llamacpp_interference.json")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    state = State(args.work / "state.json")
    state.data.setdefault("started", time.time())
    env = {**os.environ, "SPECDEC_STORAGE": f"sqlite:///{args.work / 'studies.db'}"}

    def run(name: str, pattern: str | None, extra: list[str]) -> dict:
        out = args.work / f"{name}.yaml"
        argv = ["run", "--backend", "llamacpp", "--target", "smollm2-135m", "--workload", args.workload]
        argv += ["--study-name", f"{name}-{time.time_ns()}", "--out", str(out), "--force", *extra]
        with locked(args.lock), Load(pattern, args.burst_on, args.burst_off):
            try:
                code, _, secs, err = cli(argv, env)
            except SystemExit as exc:  # exit 2: one red line, which is the result under this load
                return {"load": pattern, "args": extra, "exit": 2, "said": str(exc)[-1500:]}
        if code != 0 or not out.exists():
            raise SystemExit(f"run {name} ({pattern or 'quiet'}) exited {code}: {err.strip()[-2000:]}")
        said = [line for line in err.splitlines() if "machine" in line or "threads" in line]
        return summary(out, secs, pattern) | {"args": extra, "exit": 0, "said": said[:3]}

    runs = state.data.setdefault("runs", {})
    plan = [("quiet", None, [])] + [(f"loaded-{i}", ("busy", "bursts")[i % 2], []) for i in range(args.runs)]
    plan.append(("busy-threads-1", "busy", ["--threads", "1"]))  # the remedy the busy run names
    for name, pattern, extra in plan:
        if name not in runs:
            runs[name] = run(name, pattern, extra)
            state.save()
        r = runs[name]
        if r["exit"]:
            print(f"{name}: exit {r['exit']}: {r['said'][-300:]}", flush=True)
        else:
            print(f"{name}: {r['best']} {r['speedup']:.3f}x ({r['verdict']}) in {r['seconds']} s; noise cv "
                  f"{r['noise']['plain_pass_cv']:.1%}, others {r['noise']['others_cpu_share']}", flush=True)  # fmt: skip
        write(state, args)
    done = state.data.setdefault("checks", {})
    quiet = args.work / "quiet.yaml"
    todo = {"quiet": {"load": None}, f"loaded_{args.loaded}": {"load": args.loaded}}
    add_slower_machine(todo, args, state)
    for name, how in todo.items():
        if name in done:
            continue
        how = dict(how)
        m = args.slower_checks if name.startswith("slower") else args.checks
        print(f"checks of the quiet profile: {name}", flush=True)
        done[name] = checks(quiet, m, how.pop("load"), args, env, state, name, **how)
        state.save()
        write(state, args)
    state.data["complete"] = True
    state.save()
    r = write(state, args)
    for name, c in r["checks"].items():
        print(f"check {name:<24} pass {c['passed']}  regression {c['regression']}  "
              f"inconclusive {c['inconclusive']}  other hardware {c['other_hardware']}  (of {len(c['exit_codes'])})")  # fmt: skip


def write(state: State, args: argparse.Namespace) -> dict:
    d = state.data
    result = {
        "complete": bool(d.get("complete")),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "runs": d.get("runs", {}),
        "checks": d.get("checks", {}),
        **common_fields(d),
    }
    return save_json(args.out, result)


if __name__ == "__main__":
    main()
