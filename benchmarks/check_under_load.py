"""Does `specdec-tune check` answer under load, and still catch a real regression?

Runs N checks of an unchanged profile and N with a planted 15 % slower speculative side
(`SPECDEC_TEST_SLOWER_SPEC`, the test-only hook of specdec_tune/measure/planted.py: every timed
speculative prompt takes 1.15x its time; the fresh processes a check confirms in inherit it), each
on a quiet machine and beside a CPU hog (a busy loop pinned to one core with os.sched_setaffinity,
started before the check and killed after it). Prints, for the four conditions, how many checks
passed (exit 0), found a regression (1) or were inconclusive (6); other hardware (3) and errors are
counted apart. Wanted: unchanged -> pass, quiet and loaded; planted -> regression, quiet and loaded.

    python benchmarks/check_under_load.py                           # N=5, the committed demo profile
    python benchmarks/check_under_load.py -n 2 --repeats 3 --json results/check_under_load.json
    python benchmarks/check_under_load.py PROFILE --factor 1.15 --core 1 --allow-other-hardware
    python benchmarks/check_under_load.py -n 1 --batch-size 1 --quiet-only      # smoke test, no hog
    python benchmarks/check_under_load.py -n 3 --reference-here   # the reference measured here first

The conditions alternate (unchanged quiet, unchanged loaded, planted quiet, planted loaded, ...), so
a slow drift of the machine lands on all four alike. A check's process is killed after --timeout s
(counted as an error). Needs Linux for the pinned hog.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specdec_tune.measure.children import die_with_parent  # noqa: E402
from specdec_tune.measure.planted import SLOWER_SPEC_ENV  # noqa: E402

VERDICTS = {0: "pass", 1: "regression", 6: "inconclusive", 3: "other hardware"}
HOG = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"
CLI = [sys.executable, "-m", "specdec_tune.cli"]


def hog(core: int) -> subprocess.Popen:
    """A busy loop pinned to `core` (it dies with this process, whatever happens)."""
    return subprocess.Popen([sys.executable, "-c", HOG, str(core)], preexec_fn=die_with_parent)


def one_check(args: argparse.Namespace, planted: bool, loaded: bool) -> dict:
    """One `check --json` in a fresh process: its verdict, seconds and speedup item."""
    env = dict(os.environ)
    env.pop(SLOWER_SPEC_ENV, None)
    if planted:
        env[SLOWER_SPEC_ENV] = str(args.factor)
    cmd = [*CLI, "check", str(args.profile), "--repeats", str(args.repeats), "--json"]
    if args.allow_other_hardware:
        cmd.append("--allow-other-hardware")
    if args.batch_size is not None:
        cmd += ["--batch-size", str(args.batch_size)]
    load = hog(args.core) if loaded else None
    started = time.monotonic()
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, env=env, timeout=args.timeout, preexec_fn=die_with_parent
        )
        code, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired:
        code, out, err = -1, "", f"timed out after {args.timeout} s"
    finally:
        if load is not None:
            load.kill()
            load.wait()
    seconds = time.monotonic() - started
    speedup = {}
    try:
        items = json.loads(out)["items"]
        speedup = next((i for i in items if i["metric"] == "speedup"), {})
    except (ValueError, KeyError, TypeError):
        pass
    return {
        "planted": planted,
        "loaded": loaded,
        "exit": code,
        "verdict": VERDICTS.get(code, "error"),
        "seconds": round(seconds, 1),
        "speedup": speedup.get("measured"),
        "note": speedup.get("note", ""),
        "stderr": (err.strip().splitlines() or [""])[-1][:300],
    }


def table(results: list[dict]) -> str:
    """The four conditions' counts, one line each."""
    lines = []
    for planted in (False, True):
        for loaded in (False, True):
            rows = [r for r in results if r["planted"] == planted and r["loaded"] == loaded]
            counts = Counter(r["verdict"] for r in rows)
            secs = [r["seconds"] for r in rows]
            name = f"{'planted' if planted else 'unchanged':9s} {'loaded' if loaded else 'quiet':6s}"
            other = {k: v for k, v in counts.items() if k not in ("pass", "regression", "inconclusive")}
            lines.append(
                f"{name}  pass {counts['pass']}  regression {counts['regression']}  "
                f"inconclusive {counts['inconclusive']}"
                + (f"  other {dict(other)}" if other else "")
                + (f"  ({min(secs):.0f}-{max(secs):.0f} s)" if secs else "")
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", nargs="?", type=Path, default=ROOT / "profiles/cpu-amd-epyc-2t/demo.yaml")
    ap.add_argument("-n", type=int, default=5, help="checks per condition (four conditions)")
    ap.add_argument("--repeats", type=int, default=3, help="check's --repeats")
    ap.add_argument("--factor", type=float, default=1.15, help="the planted slowdown of the speculative side")
    ap.add_argument("--core", type=int, default=None, help="the core the hog spins on (default: the last)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds before a check is killed")
    ap.add_argument("--allow-other-hardware", action="store_true", help="pass it on to check")
    ap.add_argument("--batch-size", type=int, default=None, help="check only this batch table row")
    ap.add_argument("--quiet-only", action="store_true", help="no hog: the two quiet conditions only")
    ap.add_argument("--json", type=Path, default=None, help="also write every check's result here")
    ap.add_argument(
        "--reference-here",
        action="store_true",
        help="first measure the profile's reference on this machine (`specdec-tune reference`, quiet, "
        "nothing planted) into PROFILE's folder as <name>.here.yaml, and check that: a gate on changing runners",
    )
    args = ap.parse_args()
    if args.core is None:
        args.core = max(os.sched_getaffinity(0))
    if args.reference_here:
        here = args.profile.with_name(args.profile.stem + ".here.yaml")
        env = {k: v for k, v in os.environ.items() if k != SLOWER_SPEC_ENV}
        cmd = [*CLI, "reference", str(args.profile), "--out", str(here)]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, preexec_fn=die_with_parent)
        print(done.stdout.strip() or done.stderr.strip())
        if done.returncode != 0:
            sys.exit(done.returncode)
        args.profile = here
    results = []
    for i in range(args.n):
        for planted in (False, True):
            for loaded in (False,) if args.quiet_only else (False, True):
                r = one_check(args, planted, loaded)
                results.append(r)
                tag = f"{'planted' if planted else 'unchanged'}/{'loaded' if loaded else 'quiet'}"
                print(f"[{i + 1}/{args.n}] {tag}: {r['verdict']} in {r['seconds']} s, speedup {r['speedup']}")
                if r["verdict"] not in ("pass", "regression"):
                    print(f"    {r['stderr']}")
                if args.json is not None:
                    args.json.parent.mkdir(parents=True, exist_ok=True)
                    args.json.write_text(
                        json.dumps({"args": vars(args), "results": results}, default=str, indent=1)
                    )
    print(table(results))


if __name__ == "__main__":
    main()
