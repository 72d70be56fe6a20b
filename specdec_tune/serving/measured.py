"""The command that ran: a profile measured inside an engine that records its launcher (the
program that started each server, `backend.launcher`) exports to that engine exactly the command
that measured the chosen config (its `backend_args`), or the engine's measured batch-size schedule
(`backend.schedule`) when that schedule was measured at least as fast as each fixed gamma it mixes.
No flag is rebuilt from the config: an exported config is one that ran.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..domain import Result
from ..store.schema import Profile


@dataclass
class MeasuredRun:
    argv: list[str]  # the launcher and every argument the measured server got (host and port aside)
    lead: int  # argv entries before the config's own arguments (the launcher)
    schedule: list[list[int]] = field(default_factory=list)  # the tiers handed over, if any
    notes: list[str] = field(default_factory=list)


def _backend(profile: Profile) -> dict[str, Any]:
    b = getattr(profile, "backend", None)
    if b is None:
        return {}
    return b if isinstance(b, dict) else getattr(b, "as_dict", lambda: {})()


def measured_run(profile: Profile, engine: str, chosen: Result, schedule: bool = True) -> MeasuredRun | None:
    """The command that measured `chosen` in `engine`, when `profile` was measured there and recorded
    its launcher; None otherwise (the export then builds the engine's flags from the config)."""
    b = _backend(profile)
    launcher = b.get("launcher")
    if b.get("name") != engine or not launcher or not chosen.backend_args:
        return None
    notes = []
    dropped = b.get("measure_only_args")
    if dropped:
        notes.append(
            f"{' '.join(dropped)} is left out: it split memory between the servers measured side by side"
        )
    env = (b.get("build") or {}).get("server_env")
    if env:
        notes.append(f"{env} is left out: the measurement's servers started with it (a start-time setting)")
    sched = b.get("schedule") or {}
    if schedule and sched.get("flags") and sched.get("draft") == chosen.config.draft.name:
        if sched.get("emitted"):
            notes.append(
                "the batch-size schedule "
                + ", ".join(f"{s}-{e}: K={k}" for s, e, k in sched["tiers"])
                + " was measured at every batch size it serves and at each switch, never slower than a fixed γ"
                + (
                    f" beyond the {sched['server_spread']:.1%} two servers of one config differed by"
                    if sched.get("server_spread")
                    else ""
                )
            )
            if sched.get("below_plain"):
                notes.append(
                    "plain decoding was faster than the schedule at "
                    + "; ".join(sched["below_plain"])
                    + ": the profile's batch table says what to serve at those sizes"
                )
            return MeasuredRun([*launcher, *sched["flags"]], len(launcher), sched["tiers"], notes)
        notes.append(
            "no batch-size schedule: the measured one lost to a fixed γ at "
            + "; ".join(sched.get("lost") or [])
            + ", so the best fixed config is exported"
        )
    return MeasuredRun([*launcher, *chosen.backend_args], len(launcher), [], notes)
