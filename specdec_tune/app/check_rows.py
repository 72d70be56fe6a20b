"""One stored config re-measured in its session and judged, the way `check` judges every row beside
the first (app.checking measures the machine anchors around that one): the measurement watched by
the OS, the machine's load by the session's policy, a doubtful drop measured again in the session
with the repeats its spread needs, and the policy's judges (output.check)."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..backends.base import CheckSession
from ..checkpolicy import CheckPolicy
from ..domain import Config
from ..errors import SpecDecError
from ..limits import MAX_BATCH_SIZE, check_count
from ..measure import narrow, noise
from ..output.check import (
    CheckItem,
    Evidence,
    another_look,
    confirm_repeats,
    judge_config,
    needs_confirmation,
)
from ..output.environment import classify, load_of
from ..output.references import REPEATS
from ..runtime.models.devices import resolve_device
from ..store.schema import Profile


@dataclass(frozen=True)
class Judging:
    """How `check` judges: the tolerances, the repeats of a first measurement, and the policy (the
    session's: `session.policy`)."""

    tolerance: float
    acceptance_tolerance: float | None
    repeats: int
    policy: CheckPolicy
    same_machine: bool = True  # the profile's own machine (app.checking.same_machine): rates judged
    sliced: bool = False  # measured on the check slice (measure.narrow), as the reference was
    machine_ratio: float | None = None  # matmul here / the reference's (output.elsewhere), once measured


def stored_rows(p: Profile, path: Path, batch_size: int | None) -> list[tuple[int, Any]]:
    """(batch size, stored Result) of every row `check` judges: the best (batch size 1), then each
    other batch table row; only `batch_size`'s when given (SpecDecError when the profile has none)."""
    rows = [(1, p.best)] + [(r.batch_size, r.best) for r in p.batch_table if r.batch_size != 1]
    if batch_size is None:
        return rows
    check_count(batch_size, "--batch-size", high=MAX_BATCH_SIZE)
    picked = [(b, r) for b, r in rows if b == batch_size]
    if not picked:
        sizes = ", ".join(str(b) for b, _ in rows)
        raise SpecDecError(f"{path} has no batch table row for batch size {batch_size}; it has: {sizes}")
    return picked


def stored_divergence(p: Profile, stored: Any) -> tuple[int, int]:
    """(prompts that parted, prompts compared) at T = 0 when `p` was measured, where its engine's
    exactness (`backend.exactness`) is about `stored`'s config; (0, 0) otherwise."""
    e = p.backend.exactness or {}
    if not e or e.get("config") != stored.config.label:
        return (0, 0)
    prompts = int(e.get("prompts") or 0)
    return (max(0, prompts - int(e.get("identical", prompts))), prompts)


def where_of(batch_size: int, context_length: int | None = None) -> str:
    """The items' suffix of a row: "" for the best, " @ B=4", " @ B=1, L=2048"."""
    if context_length is not None:
        return f" @ B={batch_size}, L={context_length}"
    return "" if batch_size == 1 else f" @ B={batch_size}"


def in_session(s: CheckSession, config: Config, batch_size: int, repeats: int, seed: int = 0) -> Any:
    """`config` against plain decoding over the session's workload at `batch_size`."""
    (m,) = s.measure([config], s.case, batch_size, repeats, seed)
    return m


def row_items(
    s: CheckSession,
    stored: Any,
    config: Config,
    batch_size: int,
    j: Judging,
    temperature: float,
    where: str,
    reference: dict[str, list[float]] | None = None,
) -> list[CheckItem]:
    """The items of one stored result (`stored`) re-measured as `config` at `batch_size`: a drop
    measured while other work shared the machine is inconclusive (output.check.speedup_item), one
    not clearly passing is measured again in the session. `reference`: what the speedup is judged
    against instead of the stored repeats (the row's reference processes on the check slice)."""
    m, os_noise, busy_seen = noise.busy_window(lambda: in_session(s, config, batch_size, j.repeats))
    env = classify(os_noise, j.policy, busy_seen=busy_seen, threads=s.threads, cpus=os.cpu_count() or 1)
    e = Evidence(
        stored, m, temperature=temperature, environment=env, where=where, same_machine=j.same_machine,
        reference=reference or {}, machine_ratio=j.machine_ratio,
    )  # fmt: skip
    if needs_confirmation(e, j.tolerance, j.policy):
        n = j.repeats if s.renew() else confirm_repeats(m, j.repeats, j.policy, shared=not env.quiet)
        e = looked_again(
            replace(e, again=in_session(s, config, batch_size, n, seed=1)), s, config, batch_size, j
        )
    return judge_config(e, j.tolerance, acceptance_tolerance=j.acceptance_tolerance, policy=j.policy)


def looked_again(e: Evidence, s: CheckSession, config: Config, batch_size: int, j: Judging) -> Evidence:
    """`e` with the further confirmations `output.check.another_look` asks for pooled into its
    `again` (at least a first measurement's repeats each; in a renewed engine where the session
    renews one, as vLLM starts a new server pair), each watched by the OS: other work seen there
    makes the verdict a shared machine's."""
    while (more := another_look(e, j.tolerance, j.policy)) is not None:
        assert e.again is not None
        s.renew()
        n, seed = max(j.repeats, more), e.looks + 1

        def measured(n: int = n, seed: int = seed) -> Any:
            return in_session(s, config, batch_size, n, seed=seed)

        m, os_noise, busy_seen = noise.busy_window(measured)
        load = load_of(os_noise, j.policy, busy_seen=busy_seen, threads=s.threads, cpus=os.cpu_count() or 1)
        e = replace(e, again=e.again.joined(m), looks=e.looks + 1, environment=e.environment.at_worst(load))
    return e


def row_reference(p: Any, batch_size: int, j: Judging) -> dict[str, list[float]]:
    """What a batch-table row's speedup is judged against: on the check slice, that row's speedups in
    the reference processes (`reference_speedups`), measured there too; {} (its stored repeats)
    otherwise, or where the profile has too few of them."""
    if not j.sliced:
        return {}
    row = next((r for r in p.batch_table if r.batch_size == batch_size), None)
    if row is None or len(row.reference_speedups) < j.policy.min_reference_processes:
        return {}
    return {"speedup": list(row.reference_speedups), REPEATS: list(row.reference_speedup_repeats)}


def check_slice(p: Any, device: str) -> narrow.Slice | None:
    """This process moved to the check slice (measure.narrow: one engine thread on the core other
    processes use least) where the profile's reference was measured there and the check runs on a
    CPU; None (nothing moved) otherwise, or where the OS cannot pin."""
    if p.anchors is None or not p.anchors.sliced or p.hardware.get("kind") != "cpu":
        return None
    if resolve_device(device) != "cpu":
        return None
    return narrow.take()
