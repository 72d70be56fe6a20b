"""`check --dry-run`: what `check` would re-measure for a stored profile, and whether everything it
names is here (the target, each draft's file, the workload unchanged), without loading a model or
measuring anything. A shipped profile that passes this can be checked on its machine kind.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SpecDecError
from ..measure.hardware import hardware_info, hardware_slug
from ..runtime.models.loading import locate_model
from ..runtime.workloads import load_workload, stratified
from ..store.refs import resolve_ref, target_ref
from ..store.yamlio import load_profile
from .check_envelope import cells_to_check
from .check_rows import stored_rows


@dataclass
class CheckPlan:
    """What `check PROFILE` would do here: the engine, the configs it re-measures, and where the
    models the profile names lie on this machine."""

    profile: str
    backend: str
    measured_on: str  # the profile's hardware slug
    here: str  # this machine's slug: another one makes `check` exit 3
    target: str  # where the target lies here
    drafts: dict[str, str] = field(default_factory=dict)  # draft name -> its file ("" for n-gram drafts)
    workload: str = ""
    items: list[str] = field(default_factory=list)  # the configs re-measured, with their batch size
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def plan_check(path: Path, batch_size: int | None = None) -> CheckPlan:
    """Validate `path` at the current schema and resolve what it names, as `check` would before its
    first measurement. Raises SpecDecError (exit 2) for a profile that `check` could not load."""
    p = load_profile(path)
    folder = Path(path).parent
    backend = p.backend.name
    target = _locate(resolve_ref(target_ref(p), folder), p.target.name, "target")
    rows = stored_rows(p, path, batch_size)
    cells = cells_to_check(p) if batch_size is None else []
    drafts = {}
    for _, r in rows + [(c.batch_size, c.best) for c in cells]:
        d = r.config.draft
        if r.config.gamma > 0 and d.kind != "none":
            drafts[d.name] = (
                str(_locate(resolve_ref(d.path, folder), d.name, f"draft '{d.name}'")) if d.path else ""
            )
    wl = load_workload(p.workload.name)
    wl.prompts = stratified(wl.prompts, p.workload.prompts)
    if wl.sha256 != p.workload.sha256:
        raise SpecDecError(
            f"workload '{p.workload.name}' has changed since the profile was made "
            f"(hash {wl.sha256} != {p.workload.sha256}); re-run `specdec-tune run`"
        )
    cell_items = [f"{c.best.config.label} @ B={c.batch_size}, L={c.context_length}" for c in cells]
    measured_on = str(p.hardware.get("slug", "?"))
    here = hardware_slug(hardware_info("cpu")) if p.hardware.get("kind", "cpu") == "cpu" else "?"
    notes = [] if here in (measured_on, "?") else [f"measured on {measured_on}: `check` here exits 3"]
    return CheckPlan(
        profile=str(path),
        backend=backend,
        measured_on=measured_on,
        here=here,
        target=str(target),
        drafts=drafts,
        workload=p.workload.name,
        items=[r.config.label + ("" if b == 1 else f" @ B={b}") for b, r in rows] + cell_items,
        notes=notes,
    )


def _locate(ref: str, name: str, what: str) -> Path:
    """Where `ref` lies; a built-in model stored by its file in another machine's packages is
    found by its name, as `check` loads it."""
    try:
        return locate_model(ref)
    except SpecDecError:
        if name != ref:
            try:
                return locate_model(name)
            except SpecDecError:
                pass
        raise SpecDecError(f"the profile's {what} '{ref}' is not here") from None
