"""The tokens/s `check` judges against, measured the way `check` measures: in fresh processes.

The final round's rates come from the process that ran the whole search, and the absolute rate of
one process differs from another's on the same quiet VM by several per cent (in
benchmarks/interference.py, 20 quiet checks measured 0.955-1.083x the run's stored plain rate,
median +4.5 %; a check of the committed profile measured -6.3 %). That is as large as the gap
between a 10 % tolerance and a 15 % slower target forward, so a single process's number is a poor
reference. `run` therefore ends by measuring its best config against plain decoding in a few fresh
processes, each exactly as `check` does (the machine anchors around it, 3 interleaved repeats),
and stores each quiet process's medians in `anchors.reference_*`; `check` judges its tokens/s
against their spread (output.check.rate_items).

`command(PROFILE, THREADS)` starts one such process (`main`): it prints one JSON line.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..backends.base import Purpose
from ..checkpolicy import CHECK_POLICY, CheckPolicy
from ..errors import SpecDecError, Unsettled
from ..measure import narrow, noise
from ..measure.anchors import measure_twice
from ..measure.children import die_with_parent
from ..measure.hardware import machine_id
from ..measure.timing import median, spread
from ..measurepolicy import MEASURE_POLICY, MeasurePolicy
from ..store.schema import Profile
from ..store.yamlio import load_profile, save_profile
from .profile_models import open_stored, stored_models


def measure_here(
    path: Path, threads: int | None = None, device: str = "auto", sliced: bool = False
) -> dict[str, Any]:
    """One reference measurement in this process: the profile's best config against plain
    decoding, in the profile's engine, as `check` measures it (app.checking), and whether the OS saw
    other work meanwhile. `threads`: the engine's threads, as the run had them (a CPU's slug names
    them); `sliced`: on the check slice instead (measure.narrow: one thread on the core other
    processes use least; `threads` and `core` in the result say it was), and then every other
    batch-table row too, and every repeat's speedup."""
    p = load_profile(path)
    where = narrow.take() if sliced else None
    if where is not None:
        threads = where.threads
    # On the slice, every other batch-table row too: `check` measures them there (app.check_rows).
    others = [(r.batch_size, r.best.config) for r in p.batch_table if r.batch_size != 1]
    others = others if where is not None else []
    configs = [p.best.config] + [c for _, c in others]
    drafts = list({c.draft.name: c.draft for c in configs if c.gamma > 0}.values())
    models = stored_models(p, path, drafts, device=device, threads=threads)
    anchor = p.anchors.decode_anchor if p.anchors is not None else None
    purpose = Purpose("check", costs=p.costs, decode_anchor=anchor)
    # the slug was judged by whoever started this process (run here, or check with its flags)
    with open_stored(p, path, models, purpose, allow_other_hardware=True) as s:
        by_name = {d.name: d for d in s.specs}
        cfg = replace(p.best.config, draft=by_name.get(p.best.config.draft.name, p.best.config.draft))
        (machine, m), _, busy = noise.busy_window(
            lambda: measure_twice(
                s.device, lambda: s.measure([cfg], s.case, 1, MEASURE_POLICY.reference_repeats)[0]
            )
        )
        at_rows = {}
        for b, c in others:
            c = replace(c, draft=by_name.get(c.draft.name, c.draft))
            (row,), _, row_busy = noise.busy_window(
                lambda b=b, c=c: s.measure([c], s.case, b, MEASURE_POLICY.reference_repeats)
            )
            busy = busy or row_busy
            at_rows[str(b)] = [round(x, 4) for x in row.speedups] or [round(row.metrics.speedup, 4)]
    got = {
        "tokens_per_s": round(m.metrics.tokens_per_s, 3),
        "baseline_tokens_per_s": round(m.metrics.baseline_tokens_per_s, 3),
        "speedup": round(m.metrics.speedup, 4),
        "matmul_gflops": round(machine.matmul_gflops, 3),
        "baseline_spread": round(spread(m.baseline_rates), 4) if m.baseline_rates else 0.0,
        "busy": busy,
    }
    if m.plain_per_anchor:
        got["plain_per_anchor"] = round(median(m.plain_per_anchor), 5)
    if where is not None:
        got["threads"], got["core"] = where.threads, where.core
        got["speedups"] = [round(x, 4) for x in m.speedups]  # every repeat's: judged as they are
    if at_rows:
        got["rows"] = at_rows  # batch size -> that row's speedup in each repeat
    return got


def command(path: Path, threads: int | None = None, device: str = "auto", sliced: bool = False) -> list[str]:
    """The command line of one reference process (`main` in a fresh interpreter); `sliced`: on
    the check slice (measure.narrow)."""
    return [sys.executable, "-c", CHILD, str(path), SLICE if sliced else str(threads or 0), device]


SLICE = "slice"  # the THREADS argument of a process measuring on the check slice
# Not `-m specdec_tune.app.reference`: the package imports this module first, and runpy warns.
CHILD = "import sys; from specdec_tune.app.reference import main; sys.exit(main(sys.argv[1:]))"


def process_seconds(pass_s: float, gamma_share: float = 0.5, policy: MeasurePolicy = MEASURE_POLICY) -> float:
    """About how long one reference process takes (measurepolicy's reference fields): start-up,
    then its repeats' plain passes and as many speculative ones (`gamma_share` of a plain pass each)
    and decode-anchor parts, plus the warm-up."""
    passes_s = (policy.reference_repeats + 1) * pass_s * (1 + gamma_share + policy.reference_anchor_share)
    return policy.reference_startup_s + passes_s


def record_reference(
    path: Path,
    processes: int = MEASURE_POLICY.reference_processes,
    budget_s: float | None = None,
    pass_s: float | None = None,
    threads: int | None = None,
    *,
    run: Any = subprocess.run,
    device: str = "auto",
    what: str = "reference process",
    extra: int | None = None,
    policy: CheckPolicy = CHECK_POLICY,
    sliced: bool = False,
    rows: int = 1,
    first: int = 1,
    startup_s: float = 0.0,
) -> tuple[list[dict[str, Any]], str]:
    """Measure the reference in up to `processes` fresh processes, one after the other, within
    `budget_s` (each process's length estimated from `pass_s`, one plain pass). Returns the quiet
    processes' measurements and a note on what was skipped. A process that fails is left out; one
    that finds the machine busy or whose plain passes spread beyond the policy's `max_plain_spread`
    (disturbed though the OS saw nothing: its median would make a reference every later check is
    judged by) is left out and another takes its place (`extra` at most, by default the policy's
    `extra_processes`); each one is killed if it outlives four times
    its estimate (a minute at least). `threads`: the engine's threads in the processes (the run's);
    `sliced`: each on the check slice instead (measure.narrow), every batch-table row too (`rows`
    of them, the first included: each process may then take that many times its estimate before it
    is killed; the budget plans the rows apart, app.session_plan.keep_for_reference_rows). `first`:
    the number the notes give the first process. `startup_s`: what each process spends starting its
    engine's servers beside that (`server_startup_s`)."""
    extra = policy.extra_processes if extra is None else extra
    estimate = (process_seconds(pass_s) if pass_s else 60.0) + startup_s
    started = time.monotonic()
    kept: list[dict[str, Any]] = []
    notes: list[str] = []
    planned, i = processes, 0
    while i < planned:
        if budget_s is not None and time.monotonic() - started + estimate > budget_s:
            notes.append(f"{planned - i} of {planned} {what}es did not fit the budget")
            break
        i += 1
        try:
            done = run(
                command(path, threads, device, sliced),
                capture_output=True,
                text=True,
                timeout=max(4 * estimate * rows, 60.0),
                preexec_fn=die_with_parent,  # a killed run or check leaves none behind
            )
        except subprocess.TimeoutExpired:
            notes.append(f"{what} {i + first - 1} timed out")
            continue
        line = (done.stdout.strip().splitlines() or [""])[-1]
        try:
            got = json.loads(line) if done.returncode == 0 else None
        except ValueError:
            got = None
        if not isinstance(got, dict):
            why = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
            notes.append(f"{what} {i + first - 1} failed: {why}")
        elif got.get("busy") or (got.get("baseline_spread") or 0.0) > policy.max_plain_spread:
            why = (
                "other work was running"
                if got.get("busy")
                else f"its plain passes varied {got['baseline_spread']:.0%}, disturbed"
            )
            notes.append(f"{what} {i + first - 1} left out: {why}")
            planned = min(planned + 1, processes + extra)
        else:
            kept.append(got)
    return kept, "; ".join(notes)


def store_reference(profile: Profile, kept: list[dict[str, Any]]) -> Profile:
    """The quiet reference processes' measurements (`record_reference`) into `profile.anchors` and
    its batch table, with this machine's id: what `check` judges against."""
    profile.anchors.reference_tokens_per_s = [k["tokens_per_s"] for k in kept]
    profile.anchors.reference_baseline_tokens_per_s = [k["baseline_tokens_per_s"] for k in kept]
    profile.anchors.reference_speedups = [k["speedup"] for k in kept if k.get("speedup")]
    slices = {k.get("threads") for k in kept}
    profile.anchors.reference_threads = slices.pop() if len(slices) == 1 and None not in slices else None
    profile.anchors.reference_speedup_repeats = [x for k in kept for x in k.get("speedups", [])]
    for row in profile.batch_table:
        at_row = [k["rows"][str(row.batch_size)] for k in kept if str(row.batch_size) in k.get("rows", {})]
        whole = len(at_row) == len(kept)
        row.reference_speedups = [round(statistics.median(xs), 4) for xs in at_row] if whole else []
        row.reference_speedup_repeats = [x for xs in at_row for x in xs] if whole else []
    profile.anchors.machine = machine_id()  # absolute rates are judged on this machine only
    matmul = [k["matmul_gflops"] for k in kept if k.get("matmul_gflops")]
    profile.anchors.reference_matmul_gflops = statistics.median_high(matmul) if matmul else None
    per_anchor = [k["plain_per_anchor"] for k in kept if k.get("plain_per_anchor")]
    if len(per_anchor) >= CHECK_POLICY.min_reference_processes:
        profile.anchors.reference_plain_per_anchor = per_anchor
    return profile


@dataclass
class Rebased:
    """What `specdec-tune reference` measured: the profile written, the quiet processes' speedups
    and plain tokens/s, whether they ran on the check slice, and what was left out."""

    out: Path
    speedups: list[float]
    baseline_tokens_per_s: list[float]
    sliced: bool
    note: str


def rebase(
    path: Path,
    out: Path | None = None,
    processes: int = MEASURE_POLICY.reference_processes,
    *,
    device: str = "auto",
    policy: CheckPolicy = CHECK_POLICY,
) -> Rebased:
    """`specdec-tune reference`: the profile's reference measured again on this machine, by the
    code that runs this (in fresh processes, as `run` ends), and written to `out` (default: the
    profile itself). A speedup is the machine's as much as the code's: on another VM of one slug
    the unchanged committed profiles read 0.85-0.93x their stored speedup (docs/ci.md), so a gate
    on changing runners first measures the reference on the runner with the base revision's code,
    then checks the candidate against it. Measured as the stored reference was: on the check slice
    where it was (`anchors.reference_threads`), else with the engine's own threads; one process at
    a time until `processes` quiet ones agree (the policy's `reference_agreement`), at most
    `reference_max_processes`, the largest agreeing group kept. Raises SpecDecError for a profile
    without anchors, and `Unsettled` (exit 6) when fewer than the policy's minimum agree."""
    p = load_profile(path)
    if p.anchors is None:
        raise SpecDecError(
            f"{path} has no machine anchors, so `check` keeps no reference for it: run it again"
        )
    out = path if out is None else out
    sliced = p.hardware.get("kind") == "cpu" and p.anchors.reference_threads is not None
    rows = slice_rows(p) if sliced else 1
    pass_s = p.noise.plain_pass_s if p.noise is not None else None
    cap = max(processes, policy.reference_max_processes)
    settled = settle(
        path, processes, cap, None, pass_s, None, device=device, sliced=sliced, rows=rows, policy=policy,
        startup_s=server_startup_s(p),
    )  # fmt: skip
    kept, group, notes = settled.kept, settled.group, settled.notes
    if len(group) < policy.min_reference_processes:
        raise Unsettled(
            f"no {policy.min_reference_processes} of {settled.started} reference processes agreed within "
            f"{policy.reference_agreement:.0%} (quiet ones read {settled.speeds or 'nothing'}"
            + (f"; {'; '.join(notes)}" if notes else "")
            + "): measure it again on a quieter machine"
        )
    chosen = [kept[i] for i in group]
    store_reference(p, chosen)
    save_profile(p, out)
    return Rebased(
        out, [k["speedup"] for k in chosen if k.get("speedup")], [k["baseline_tokens_per_s"] for k in chosen],
        sliced, "; ".join(notes),
    )  # fmt: skip


def server_startup_s(p: Profile) -> float:
    """What one reference process of a server engine spends starting its servers (the plain one and
    the best config's, each the profile's median start, `backend.start_s`): a vLLM server takes tens
    of seconds where a pass takes a few: by the passes alone, a vLLM demo process had 2 minutes."""
    return 2 * (p.backend.start_s or 0.0)


def slice_rows(p: Profile) -> int:
    """The rows a reference process on the check slice measures: the best config's, and every other
    batch-table row's (`measure_here`)."""
    return 1 + sum(r.batch_size != 1 for r in p.batch_table)


@dataclass
class Settled:
    """Reference processes started one at a time (`settle`): the quiet ones' measurements, the
    indices of the largest group of them that agrees, the notes on what was left out, and how many
    were started."""

    kept: list[dict[str, Any]]
    group: list[int]
    notes: list[str]
    started: int

    @property
    def speeds(self) -> str:
        return ", ".join(f"{k.get('speedup') or 0.0:.3f}" for k in self.kept)


def settle(
    path: Path,
    processes: int,
    cap: int,
    budget_s: float | None,
    pass_s: float | None,
    threads: int | None,
    *,
    device: str = "auto",
    sliced: bool = False,
    rows: int = 1,
    policy: CheckPolicy = CHECK_POLICY,
    run: Any = subprocess.run,
    startup_s: float = 0.0,
) -> Settled:
    """Reference processes (`record_reference`), one at a time, until `processes` quiet ones agree
    within the policy's `reference_agreement`, at most `cap` started and within `budget_s`; where the
    quiet ones do not all agree, a note says which were left out of the largest agreeing group."""
    started_at = time.monotonic()
    kept: list[dict[str, Any]] = []
    notes: list[str] = []
    group: list[int] = []
    started = 0
    while started < cap and len(group) < processes:
        left = None if budget_s is None else budget_s - (time.monotonic() - started_at)
        got, note = [], "did not fit the budget"
        if left is None or left > 0:
            got, note = record_reference(
                path, 1, left, pass_s, threads, device=device, sliced=sliced, rows=rows, extra=0,
                first=started + 1, policy=policy, run=run, startup_s=startup_s,
            )  # fmt: skip
        if not got and "did not fit the budget" in note:
            notes.append(f"reference processes {started + 1} to {cap} did not fit the budget")
            break
        started += 1
        kept += got
        notes += [note] if note else []
        group = agreeing([k.get("speedup") or 0.0 for k in kept], policy.reference_agreement)
    settled = Settled(kept, group, notes, started)
    if policy.min_reference_processes <= len(group) < len(kept):
        notes.append(
            f"{len(kept) - len(group)} quiet processes left out: of their speedups {settled.speeds}, "
            f"the {len(group)} kept agree within {policy.reference_agreement:.0%}"
        )
    return settled


def agreeing(values: list[float], within: float) -> list[int]:
    """The indices (ascending) of the largest group of `values` whose largest is at most
    (1 + `within`) times its smallest; of equally large groups, the lowest."""
    order = sorted(range(len(values)), key=values.__getitem__)
    best: list[int] = []
    low = 0
    for high in range(len(order)):
        while values[order[high]] > values[order[low]] * (1 + within):
            low += 1
        if high - low + 1 > len(best):
            best = order[low : high + 1]
    return sorted(best)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not 1 <= len(args) <= 3 or (len(args) >= 2 and not (args[1].isdigit() or args[1] == SLICE)):
        print(
            f"usage: reference PROFILE [THREADS (0: the engine's default; {SLICE}: the check slice) [DEVICE]]",
            file=sys.stderr,
        )
        return 2
    sliced = len(args) >= 2 and args[1] == SLICE
    threads = int(args[1]) if len(args) >= 2 and not sliced and int(args[1]) > 0 else None
    device = args[2] if len(args) == 3 else "auto"
    try:
        print(json.dumps(measure_here(Path(args[0]), threads, device, sliced=sliced)))
    except SpecDecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
