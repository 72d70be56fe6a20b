"""The models, workload and draft a stored profile names, loaded here for `check` and for the
fresh processes that measure as `check` does (app.reference), confined where asked.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..errors import OtherHardwareError, SpecDecError
from ..measure.hardware import hardware_info, hardware_slug, same_hardware
from ..store.refs import resolve_ref, target_ref
from .common import Models
from .confine import confine_model, confine_workload
from .confine import models_root as models_root_of


def open_profile_models(
    p: Any,
    path: Path,
    device: str = "auto",
    models_root: Path | None = None,
    rows: list[Any] | None = None,
    allow_other_hardware: bool = False,
) -> tuple[Any, Any]:
    """The models and workload a stored profile names, loaded here (confined to `models_root`
    when given), with its best config's draft spec. Raises OtherHardwareError on another slug
    (unless allowed) and SpecDecError when the workload changed."""
    # models are named relative to the profile's folder (store.refs), so any working directory works
    folder = Path(path).parent

    def local(spec: Any) -> Any:
        return dataclasses.replace(spec, path=resolve_ref(spec.path, folder)) if spec.path else spec

    spec = local(p.best.config.draft)
    extra = [local(r.best.config.draft) for r in rows or [] if r.best.config.draft.kind != "none"]
    specs = {d.name: d for d in ([spec] if spec.kind != "none" else []) + extra}
    target = resolve_ref(target_ref(p), folder)
    root = models_root_of(models_root)
    confine_model(target, root, "target")
    for d in specs.values():
        if d.path:
            confine_model(d.path, root, f"draft '{d.name}'")
    confine_workload(p.workload.name, root)
    s = open_models(
        Models(
            target=target,
            drafts=list(specs.values()),
            workload=p.workload.name,
            prompts=p.workload.prompts,
            max_new_tokens=p.workload.max_new_tokens,
            temperature=p.workload.temperature,
            context_length=p.workload.context_length,
            device=device,
            dtype=p.target.dtype,
            engine_mode=p.engine_mode,
        )
    )
    hw = hardware_info(s.device)
    if not same_hardware(p.hardware, hw) and not allow_other_hardware:
        raise OtherHardwareError(
            f"{path} was measured on {p.hardware.get('slug')}, this machine is {hardware_slug(hw)}; "
            "re-run `specdec-tune run` here or pass --allow-other-hardware"
        )
    if s.workload.sha256 != p.workload.sha256:
        raise SpecDecError(
            f"workload '{p.workload.name}' has changed since the profile was made "
            f"(hash {s.workload.sha256} != {p.workload.sha256}); re-run `specdec-tune run`"
        )
    return s, spec


def open_models(models: Models) -> Any:
    """Load what a stored profile names. Whatever the loaders raise for a folder the profile points
    at (a broken config.json, a tokenizer that will not build) is the profile's problem: exit 2."""
    try:
        return models.open(lazy_drafts=False)
    except (SpecDecError, MemoryError):
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise SpecDecError(
            f"could not load the models or workload the profile names ({type(exc).__name__}: {first})"
        ) from None


def measure_best(s: Any, drafter: Any, cfg: Any, repeats: int, anchor: Any = None, seed: int = 0) -> Any:
    """Config `cfg` (a profile's best) against plain decoding over session `s`'s workload, as `check`
    and its reference processes measure it (`bench.measure`; `anchor`: a decode anchor between)."""
    from ..measure.bench import measure

    return measure(
        s.target.model, drafter, cfg.gamma, cfg.threshold, s.case, repeats=repeats, seed=seed, ctx=s.ctx,
        anchor=anchor,
    )  # fmt: skip
