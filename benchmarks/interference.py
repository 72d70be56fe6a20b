"""Measurement under interference (issue 21's "Done means"): does a busy machine change the answer?

(a) Selection: one quiet default `specdec-tune run` (the quiet best, and the profile (b) and (c)
    check), then N default runs each with a planted background load, each on a fresh study and a
    fresh output path. Afterwards every config any run chose, plus the quiet best, is measured in
    ONE quiet interleaved comparison (the measuring seam, `measure_many`). Per run: is its choice
    within 5 % of the quiet best in that comparison, and does its profile list as best a config
    whose head-to-head (final round) speedup is below an alternative's in the same table?
(b) check: M `check`s of the quiet profile on the quiet machine and M under the load; false
    regressions (exit 1) and inconclusives (exit 6) counted.
(c) A planted 15 % slowdown of the target forward (each target forward sleeps 15 % of its own
    duration; the patch of `planted_regression.py`, applied to the target instead of the draft,
    as a sitecustomize so the fresh processes a check confirms in carry it too): M checks,
    catches (exit 1) and inconclusives counted.

(d) A slower machine of the same slug, emulated (root and the cgroup-v1 freezer needed, else
    skipped and said): the check's processes are frozen for --slower-frozen of every
    --slower-period seconds, so everything they do, the machine anchors included, runs about
    1 / (1 - frozen / period) times slower while the OS sees no other work. Expected: exit 3.

Loads: `busy` (one process spinning one core), `bursts` (spinning --burst-on s, idle --burst-off s),
`both` (runs alternate, checks under load alternate). Results to results/interference.json and
a printed table.

Every finished step is kept in --work (the studies, the profiles, state.json), and the results file
is rewritten after each (`"complete": false` until the end), so an interrupted benchmark resumes
where it stopped when started again with the same --work. --lock PATH holds an exclusive file lock
around each measured step (a run, a check, the comparison), so other jobs on a shared box that take
the same lock wait between steps instead of interfering.

    python benchmarks/interference.py                       # N=10, M=20: several hours on 2 cores
    python benchmarks/interference.py --quick --runs 1 --checks 1   # end to end in ~10 min
    python benchmarks/interference.py --lock /tmp/cpu.lock            # resumes from --work
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SLOWDOWN = 0.15
SPIN = "import time\nwhile True:\n    pass\n"
BURSTS = (
    "import sys, time\non, off = float(sys.argv[1]), float(sys.argv[2])\n"
    "while True:\n    end = time.perf_counter() + on\n    while time.perf_counter() < end:\n        pass\n"
    "    time.sleep(off)\n"
)
# The target forward made 15 % slower: each forward sleeps 15 % of its own duration. It is a
# sitecustomize on PYTHONPATH, so every process of a planted check has it: the check and the fresh
# processes it confirms a doubtful result in (app.checking), as a slower model or library would.
PLANT = f"""
import time
from specdec_tune.runtime import session
real = session.load_model
state = {{"target": True}}
def load(*a, **k):
    loaded = real(*a, **k)
    if state.pop("target", False):  # the target is loaded first, drafts after it
        model, forward = loaded.model, loaded.model.forward
        def slower(*fa, **fk):
            t0 = time.perf_counter()
            out = forward(*fa, **fk)
            time.sleep({SLOWDOWN} * (time.perf_counter() - t0))
            return out
        model.forward = slower
    return loaded
session.load_model = load
"""


def planted_env(env: dict[str, str], work: Path) -> dict[str, str]:
    """`env` with the plant's sitecustomize first on PYTHONPATH (written into `work`)."""
    folder = work / "plant"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(PLANT)
    path = os.pathsep.join(x for x in (str(folder), env.get("PYTHONPATH", "")) if x)
    return {**env, "PYTHONPATH": path}


FREEZER = Path("/sys/fs/cgroup/freezer/specdec-interference")
CLI = "import sys\nfrom specdec_tune.cli import main\nsys.argv = ['specdec-tune', *sys.argv[1:]]\nmain()\n"


class Load:
    """A planted background load (a process we start and stop by its pid), or none."""

    def __init__(self, pattern: str | None, on_s: float, off_s: float) -> None:
        self.pattern, self.on_s, self.off_s = pattern, on_s, off_s
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Load:
        if self.pattern == "busy":
            self.proc = subprocess.Popen([sys.executable, "-c", SPIN])
        elif self.pattern == "bursts":
            self.proc = subprocess.Popen([sys.executable, "-c", BURSTS, str(self.on_s), str(self.off_s)])
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


class Slower:
    """An emulated slower machine: processes started with `enter` as preexec_fn sit in a freezer
    cgroup that a thread freezes for `frozen` of every `period` seconds while inside the block."""

    def __init__(self, period: float, frozen: float) -> None:
        self.period, self.frozen = period, frozen
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    @staticmethod
    def available() -> bool:
        try:
            FREEZER.mkdir(exist_ok=True)
            return (FREEZER / "freezer.state").exists()
        except OSError:
            return False

    @staticmethod
    def enter() -> None:
        (FREEZER / "cgroup.procs").write_text(str(os.getpid()))

    def _toggle(self) -> None:
        with open(FREEZER / "freezer.state", "w", buffering=1) as state:
            while not self.stop.is_set():
                state.write("FROZEN\n")
                time.sleep(self.frozen)
                state.write("THAWED\n")
                time.sleep(self.period - self.frozen)
            state.write("THAWED\n")

    def __enter__(self) -> Slower:
        self.stop.clear()
        self.thread = threading.Thread(target=self._toggle, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()


@contextlib.contextmanager
def locked(path: Path | None) -> Iterator[None]:
    """An exclusive flock on `path` for the block (nothing without a path)."""
    if path is None:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
    time.sleep(2.0)  # a job waiting for the lock gets it before our next step takes it again


def cli(
    args: list[str],
    env: dict[str, str],
    planted: Path | None = None,
    timeout: float = 3600,
    preexec: object = None,
) -> tuple[int, str, float, str]:
    """Run the CLI in a fresh process: (exit code, stdout, seconds, stderr); `planted`: the work
    folder the plant's sitecustomize goes into (PLANT), None for the real setup."""
    t0 = time.perf_counter()
    env = planted_env(env, planted) if planted is not None else env
    done = subprocess.run(
        [sys.executable, "-c", CLI, *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, preexec_fn=preexec,
    )  # fmt: skip
    if done.returncode == 2:
        raise SystemExit(f"specdec-tune {' '.join(args[:2])} failed: {done.stderr.strip()[-1500:]}")
    return done.returncode, done.stdout, time.perf_counter() - t0, done.stderr


def run_args(out: Path, study: str, args: argparse.Namespace) -> list[str]:
    extra = ["--budget", str(args.budget)] if args.budget else []
    if args.quick:
        extra += ["--prompts", "4", "--max-new-tokens", "24"]
    return ["run", "--device", "cpu", "--study-name", study, "--out", str(out), *extra]


def config_key(cfg: dict) -> str:
    d = cfg["draft"]
    policy = cfg.get("gamma_policy") or "fixed"
    return f"{d['name']} γ={cfg['gamma']} t={cfg['threshold']:.2f}" + (
        "" if policy == "fixed" else f" {policy}"
    )


def profile_summary(path: Path) -> dict:
    """What the profile chose, and whether its best is below a head-to-head alternative."""
    p = yaml.safe_load(path.read_text())
    best = p["best"]
    search = p.get("search") or {}
    h2h = [
        a
        for a in p.get("alternatives") or []
        if a["metrics"].get("search_speedup") is not None
        or a["metrics"].get("repeats") == best["metrics"].get("repeats")
    ]
    beaten_by = [config_key(a["config"]) for a in h2h if a["metrics"]["speedup"] > best["metrics"]["speedup"]]
    return {
        "best": config_key(best["config"]),
        "config": best["config"],
        "speedup": best["metrics"]["speedup"],
        "interval": best["metrics"].get("speedup_interval"),
        "verdict": search.get("final_verdict", ""),
        "finalists": search.get("finalists"),
        "noise": p.get("noise"),
        "best_below_alternative": beaten_by,
    }


def compare_quiet(summaries: list[dict], quiet_key: str, args: argparse.Namespace) -> dict[str, float]:
    """Every chosen config and the quiet best in one quiet interleaved run: speedup per config."""
    from specdec_tune.backends.native_pool import DrafterPool
    from specdec_tune.domain import Config, DraftSpec
    from specdec_tune.measure.bench import Entry, measure_many
    from specdec_tune.runtime.session import load_models

    configs: dict[str, Config] = {}
    for s in summaries:
        c = s["config"]
        spec = DraftSpec(
            **{k: v for k, v in c["draft"].items() if k in {f.name for f in dataclasses.fields(DraftSpec)}}
        )
        fields = {f.name for f in dataclasses.fields(Config)}
        rest = {k: v for k, v in c.items() if k in fields and k not in ("draft", "gamma", "threshold")}
        configs[config_key(c)] = Config(spec, int(c["gamma"]), float(c["threshold"]), **rest)
    specs = {c.draft.name: c.draft for c in configs.values() if c.draft.kind != "none"}
    budget = 24 if args.quick else 48
    prompts = 4 if args.quick else 8
    session = load_models(None, list(specs.values()), "demo-code", budget, 0.0, "cpu", limit=prompts)
    pool = DrafterPool(list(specs.values()), session.target.model, session.draft_model, session.ctx)
    keys = list(configs)
    entries = [
        Entry(
            pool.for_config(configs[k]) if configs[k].gamma > 0 else None,
            configs[k].gamma,
            configs[k].threshold,
        )
        for k in keys
    ]
    measured = measure_many(
        session.target.model, entries, session.case, args.compare_repeats, ctx=session.ctx
    )
    return {k: m.metrics.speedup for k, m in zip(keys, measured, strict=True)}


def dynamic_best() -> dict:
    """benchmarks/dynamic.py's best (its one interleaved comparison) as a profile summary."""
    from specdec_tune.runtime.session import parse_draft

    d = json.loads((ROOT / "benchmarks/results/dynamic.json").read_text())
    best = max(d["interleaved"], key=lambda e: e["speedup"])["config"]  # "NAME γ=G t=T"
    name, gamma, threshold = best.rsplit(" ", 2)
    draft = dataclasses.asdict(parse_draft(name))
    config = {"draft": draft, "gamma": int(gamma.split("=")[1]), "threshold": float(threshold.split("=")[1])}
    return {"best": config_key(config), "config": config}


def check_detail(stdout: str) -> dict:
    """Which items failed or were inconclusive, and what the anchors said (exit 3 prints no JSON)."""
    try:
        r = json.loads(stdout)
    except ValueError:
        return {}
    a = r.get("anchors") or {}
    return {
        "failed": {i["metric"]: [i["stored"], i["measured"]] for i in r["items"] if not i["ok"]},
        "inconclusive": [i["metric"] for i in r["items"] if i.get("inconclusive")],
        # why: the notes of the items that did not simply pass
        "notes": {i["metric"]: i["note"] for i in r["items"] if not i["ok"] or i.get("inconclusive")},
        "measured": {i["metric"]: [i["stored"], i["measured"]] for i in r["items"]},
        "anchors": {
            k: a.get(k)
            for k in (
                "slowdown",
                "by",
                "rates_judged",
                "copy_bandwidth_gbps",
                "matmul_gflops",
                "rate_scale",
                "plain_per_anchor",
            )
        },
        "busy": (r.get("noise") or {}).get("busy"),
        "noise": {
            k: (r.get("noise") or {}).get(k) for k in ("others_cpu_share", "steal_share", "anchor_drift")
        },
    }


def checks(
    profile: Path,
    m: int,
    load: str | None,
    args: argparse.Namespace,
    env: dict,
    state: State,
    name: str,
    planted: bool = False,
    slower: Slower | None = None,
) -> dict:
    done = state.data.setdefault("checks_partial", {}).setdefault(name, {"codes": [], "details": []})
    codes, details = done["codes"], done["details"]
    for i in range(len(codes), m):
        pattern = None if load is None else (load if load != "both" else ("busy", "bursts")[i % 2])
        with locked(args.lock), Load(pattern, args.burst_on, args.burst_off):
            argv = ["check", str(profile), "--device", "cpu", "--format", "json"]
            plant = args.work if planted else None
            if slower is None:
                code, out, secs, err = cli(argv, env, plant)
            else:
                with slower:
                    code, out, secs, err = cli(argv, env, plant, preexec=Slower.enter)
        codes.append(code)
        said = err.strip().splitlines()[-1:] if code == 3 else []  # "other hardware (measured N× slower …)"
        details.append(check_detail(out) | {"seconds": round(secs, 1)} | ({"said": said[0]} if said else {}))
        state.save()
        print(f"  {name} check {i + 1}/{m} load={pattern or 'none'}: exit {code} {details[-1]}", flush=True)  # fmt: skip
    return {
        "exit_codes": codes,
        "details": details,
        "passed": codes.count(0),
        "regression": codes.count(1),
        "other_hardware": codes.count(3),
        "inconclusive": codes.count(6),
    }


class State:
    """What is done so far (state.json in --work): rewritten atomically after every step."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict = json.loads(path.read_text()) if path.exists() else {}

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str) + "\n")
        os.replace(tmp, self.path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10, help="N default runs under load")
    ap.add_argument("--checks", type=int, default=20, help="M checks per condition")
    ap.add_argument("--slower-checks", type=int, default=3, help="checks on the emulated slower machine")
    ap.add_argument("--slower-period", type=float, default=0.010)
    ap.add_argument("--slower-frozen", type=float, default=0.0045)
    ap.add_argument("--load", choices=["busy", "bursts", "both"], default="both")
    ap.add_argument("--burst-on", type=float, default=2.0)
    ap.add_argument("--burst-off", type=float, default=2.0)
    ap.add_argument("--budget", type=float, default=None, help="--budget of each run (default: run's own)")
    ap.add_argument("--compare-repeats", type=int, default=12)
    ap.add_argument("--quick", action="store_true", help="4 prompts x 24 tokens, 90 s budget: a smoke test")
    ap.add_argument("--work", type=Path, default=Path("/tmp/specdec-interference"), help="kept for resuming")
    ap.add_argument("--lock", type=Path, default=None, help="flock this file around each measured step")
    ap.add_argument("--no-dynamic", dest="dynamic", action="store_false",
                    help="leave benchmarks/dynamic.py's best out of the quiet comparison")  # fmt: skip
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/interference.json")
    args = ap.parse_args()
    # Killed with SIGTERM, unwind: the planted load's process and a frozen cgroup are released by
    # their context managers, never left running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.quick and args.budget is None:
        args.budget = 90.0
    args.work.mkdir(parents=True, exist_ok=True)
    state = State(args.work / "state.json")
    state.data.setdefault("started", time.time())
    # Fresh studies: their own storage, never the user's.
    env = {**os.environ, "SPECDEC_STORAGE": f"sqlite:///{args.work / 'studies.db'}"}
    quiet = args.work / "quiet.yaml"
    if "quiet_run" not in state.data:
        print("quiet run (the quiet best and the profile to check)", flush=True)
        with locked(args.lock):
            _, _, secs, _ = cli(run_args(quiet, "quiet", args), env)
        state.data["quiet_run"] = profile_summary(quiet) | {"seconds": round(secs, 1), "load": None}
        state.save()
    q = state.data["quiet_run"]
    print(f"quiet run: {q['best']} {q['speedup']:.3f}x in {q['seconds']} s", flush=True)
    write(state, args)
    checks_done = state.data.setdefault("checks", {})
    plan: dict[str, dict] = {
        "quiet": {"load": None},
        "planted_15pct_target": {"load": None, "planted": True},
        "loaded": {"load": args.load},
    }
    add_slower_machine(plan, args, state)

    def run_checks(names: list[str]) -> None:
        for name in names:
            if name in checks_done or name not in plan:
                continue
            how = dict(plan[name])
            m = args.slower_checks if name.startswith("slower") else args.checks
            print(f"checks of the quiet profile: {name}", flush=True)
            checks_done[name] = checks(quiet, m, how.pop("load"), args, env, state, name, **how)
            state.save()
            write(state, args)

    # The quick checks first, then the runs and their quiet comparison; the checks under load
    # (each one adapts its repeats to the noise, so they take longest) last.
    run_checks(["quiet", "planted_15pct_target", "slower_machine_emulated"])
    runs = state.data.setdefault("runs", [])
    for i in range(len(runs), args.runs):
        pattern = args.load if args.load != "both" else ("busy", "bursts")[i % 2]
        out = args.work / f"run{i}.yaml"
        with locked(args.lock), Load(pattern, args.burst_on, args.burst_off):
            # A study of its own per attempt: an interrupted attempt's trials are not resumed.
            _, _, secs, _ = cli(run_args(out, f"loaded-{i}-{time.time_ns()}", args), env)
        runs.append(profile_summary(out) | {"seconds": round(secs, 1), "load": pattern})
        state.save()
        write(state, args)
        r = runs[-1]
        print(f"run {i + 1}/{args.runs} ({pattern}): {r['best']} {r['speedup']:.3f}x in {r['seconds']} s", flush=True)  # fmt: skip
    if "quiet_comparison" not in state.data:
        print("quiet interleaved comparison", flush=True)
        extra = [dynamic_best()] if args.dynamic else []
        with locked(args.lock):
            state.data["quiet_comparison"] = compare_quiet([q, *runs, *extra], q["best"], args)
        state.save()
    speedups = state.data["quiet_comparison"]
    ref = max(speedups.values())  # the quiet comparison's best of what anyone chose
    for r in runs:
        r["quiet_speedup"] = speedups[r["best"]]
        r["within_5pct_of_quiet_best"] = speedups[r["best"]] >= 0.95 * speedups[q["best"]]
        r["within_5pct_of_best_compared"] = speedups[r["best"]] >= 0.95 * ref
    if args.dynamic:
        dyn = dynamic_best()["best"]
        state.data["dynamic_best"] = {
            "config": dyn,
            "quiet_speedup": speedups[dyn],
            "quiet_run_best_within_5pct": speedups[q["best"]] >= 0.95 * speedups[dyn],
        }
    write(state, args)
    run_checks(["loaded"])
    state.data["complete"] = True
    state.save()
    print_table(write(state, args))


def write(state: State, args: argparse.Namespace) -> dict:
    """The results file from what is done so far ("complete": false until the end)."""
    d = state.data
    runs = d.get("runs", [])
    q = d.get("quiet_run", {})
    result = {
        "complete": bool(d.get("complete")),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "quiet_run": {k: v for k, v in q.items() if k != "config"},
        "runs": [{k: v for k, v in r.items() if k != "config"} for r in runs],
        "quiet_comparison": d.get("quiet_comparison"),
        "selection": {
            "within_5pct": sum(bool(r.get("within_5pct_of_quiet_best")) for r in runs),
            "runs": len(runs),
            "best_below_alternative": sum(bool(r["best_below_alternative"]) for r in [q, *runs] if r),
        },
        "checks": {name: c for name, c in d.get("checks", {}).items()},
        **common_fields(d),
        "dynamic_best": d.get("dynamic_best"),
    }
    return save_json(args.out, result)


def add_slower_machine(plan: dict[str, dict], args: argparse.Namespace, state: State) -> None:
    """The emulated slower machine's checks join `plan` where the freezer is writable; else the
    state says why they were skipped."""
    if args.slower_checks and Slower.available():
        plan["slower_machine_emulated"] = {
            "load": None,
            "slower": Slower(args.slower_period, args.slower_frozen),
        }
    elif args.slower_checks:
        state.data["slower_machine_skipped"] = "no writable cgroup-v1 freezer (root needed)"


def common_fields(d: dict) -> dict:
    """What every interference results file holds from its state: the checks in progress, whether
    the slower machine was skipped, and the seconds so far."""
    return {
        "checks_in_progress": {
            k: v for k, v in d.get("checks_partial", {}).items() if k not in d.get("checks", {})
        },
        "slower_machine_skipped": d.get("slower_machine_skipped"),
        "seconds": round(time.time() - d["started"], 1),
    }


def save_json(path: Path, result: dict) -> dict:
    """`result` written to `path` atomically (a temporary file, then a rename); returned."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    return result


def print_table(r: dict) -> None:
    print(f"\n{'run':<8}{'load':<8}{'chose':<44}{'own':>8}{'quiet':>8}  ≤5%  best<alt  verdict")
    q = r["quiet_run"]
    print(f"{'quiet':<8}{'-':<8}{q['best']:<44}{q['speedup']:>8.3f}{r['quiet_comparison'][q['best']]:>8.3f}"
          f"  -    {'YES' if q['best_below_alternative'] else 'no':<6} {q['verdict']}")  # fmt: skip
    for i, x in enumerate(r["runs"], 1):
        print(f"{i:<8}{x['load']:<8}{x['best']:<44}{x['speedup']:>8.3f}{x['quiet_speedup']:>8.3f}"
              f"  {'yes' if x['within_5pct_of_quiet_best'] else 'NO ':<4} {'YES' if x['best_below_alternative'] else 'no':<6} {x['verdict']}")  # fmt: skip
    s = r["selection"]
    print(f"selection: {s['within_5pct']}/{s['runs']} within 5 % of the quiet best; "
          f"{s['best_below_alternative']} profiles list a best below a head-to-head alternative")  # fmt: skip
    if r.get("dynamic_best"):
        d = r["dynamic_best"]
        print(f"benchmarks/dynamic.py's best {d['config']}: {d['quiet_speedup']:.3f}x in the same comparison; "
              f"the quiet run's best within 5 %: {'yes' if d['quiet_run_best_within_5pct'] else 'NO'}")  # fmt: skip
    for name, c in r["checks"].items():
        print(f"check {name:<22} pass {c['passed']}  regression {c['regression']}  "
              f"inconclusive {c['inconclusive']}  other hardware {c['other_hardware']}  (of {len(c['exit_codes'])})")  # fmt: skip
    print(f"{r['seconds']:.0f} s")


if __name__ == "__main__":
    main()
