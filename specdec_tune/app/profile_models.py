"""What a stored profile names, re-opened in the engine that measured it, for `check` and for the
fresh processes that measure as `check` does (app.reference): its target and drafts (resolved from
the profile's folder, confined where asked), workload, decoding settings, engine and context length;
the session refused on another machine, another engine build or a changed workload.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from ..backends.base import CheckSession, Models, Purpose, engine_build, open_session
from ..domain import DraftSpec
from ..errors import OtherHardwareError, SpecDecError
from ..measure.hardware import hardware_difference, hardware_info, hardware_slug
from ..output.environment import other_software
from ..store.refs import resolve_ref, target_ref
from ..store.schema import Profile
from .confine import confine_model, confine_workload
from .confine import models_root as models_root_of


def stored_models(
    p: Profile,
    path: Path,
    drafts: list[DraftSpec],
    *,
    device: str = "auto",
    server: str | None = None,
    threads: int | None = None,
    context_length: int | None = None,
    models_root: Path | None = None,
) -> Models:
    """What a session re-opens of profile `p` (at `path`): its target, `drafts` (their files resolved
    from the profile's folder), workload, decoding settings, engine and context length (the
    profile's best's, unless given). With `models_root` (or SPECDEC_MODELS_ROOT) only what
    app.confine allows."""
    folder = Path(path).parent
    drafts = [
        replace(d, path=resolve_ref(d.path, folder)) if d.path else d for d in drafts if d.kind != "none"
    ]
    target = resolve_ref(target_ref(p), folder)  # a built-in by its name, a file by its path
    root = models_root_of(models_root)
    confine_model(target, root, "target")
    for d in drafts:
        if d.path:
            confine_model(d.path, root, f"draft '{d.name}'")
    confine_workload(p.workload.name, root)
    return Models(
        target=target,
        drafts=list({d.name: d for d in drafts}.values()),
        workload=p.workload.name,
        prompts=p.workload.prompts,
        max_new_tokens=p.workload.max_new_tokens,
        temperature=p.workload.temperature,
        device=device,
        dtype=p.target.dtype,
        engine_mode=p.engine_mode,  # type: ignore[arg-type]
        backend=p.backend.name,
        server=server,
        launcher=list(p.backend.launcher) or None,
        threads=threads or p.backend.threads,
        context_length=context_length or p.workload.context_length,
    )


def refuse_other_build(p: Profile, path: Path, models: Models, allow: bool) -> None:
    """Another engine build than the profile's is other software (exit 3 unless `allow`), said
    before anything starts; an engine in this process has no build of its own ({})."""
    stored, build = p.backend.build, engine_build(models)
    if other_software(stored, build) and not allow:
        raise OtherHardwareError(
            f"{path} was measured with another {models.backend} build ({stored.get('package', '?')}, "
            f"binary {stored.get('binary_sha256', '?')}; here {build.get('package', '?')}, "
            f"{build.get('binary_sha256', '?')}): other software; re-run `specdec-tune run --backend "
            f"{models.backend}` or pass --allow-other-build"
        )


@contextlib.contextmanager
def open_stored(
    p: Profile,
    path: Path,
    models: Models,
    purpose: Purpose,
    *,
    allow_other_hardware: bool = False,
    slug_threads: int | None = None,
) -> Iterator[CheckSession]:
    """The session of `models` (stored_models), refused on another hardware slug (unless allowed)
    and when the workload changed since the profile was made; closed on leaving. `slug_threads`:
    the threads the slug is judged with where the session runs on fewer (the check slice,
    measure.narrow: the machine is still the one whose every core the profile's run used)."""
    with open_session(models, purpose) as s:
        hw = hardware_info(s.device)
        if slug_threads is not None and hw.get("kind") == "cpu":
            hw = {**hw, "torch_threads": slug_threads}
            hw["slug"] = hardware_slug(hw)
        differs = hardware_difference(p.hardware, hw)
        if differs is not None and not allow_other_hardware:
            raise OtherHardwareError(
                f"{path} is other hardware's ({differs}); re-run `{s.run_command}` here or pass "
                "--allow-other-hardware"
            )
        if s.workload.sha256 != p.workload.sha256:
            raise SpecDecError(
                f"workload '{p.workload.name}' has changed since the profile was made "
                f"(hash {s.workload.sha256} != {p.workload.sha256}); re-run `specdec-tune run`"
            )
        yield s
