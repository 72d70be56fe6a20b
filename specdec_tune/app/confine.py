"""`check --models-root DIR`: what a profile may make `check` load. A profile from a pull request
names its target, drafts and workload; with a root, only demo models, bundled shapes and workloads,
HF ids from the local cache, and files and folders inside DIR (after following links) are allowed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import SpecDecError
from ..runtime.models.loading import is_demo_name
from ..runtime.models.shapes import SHAPE_PREFIX, bundled_shapes
from ..runtime.workloads import builtin_workloads

ROOT_ENV = "SPECDEC_MODELS_ROOT"
_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # org/name, loaded from the local HF cache only


def models_root(root: Path | str | None) -> Path | None:
    """The confining folder (resolved), from the option or SPECDEC_MODELS_ROOT; None: no confinement."""
    if root is None or str(root) == "":
        root = os.environ.get(ROOT_ENV) or None
    if root is None:
        return None
    path = Path(root).expanduser()
    if not path.is_dir():
        raise SpecDecError(f"--models-root {root} is not a folder")
    return path.resolve()


def confine_model(ref: str, root: Path | None, what: str) -> None:
    """Refuse a model reference outside `root` (nothing is refused without a root)."""
    if root is None:
        return

    text = ref.strip()
    if is_demo_name(text):
        return
    if text.startswith(SHAPE_PREFIX):
        name = text[len(SHAPE_PREFIX) :].strip()
        if name in bundled_shapes():
            return
        _inside(name, root, what)
        return
    if _HF_ID.match(text) and ".." not in text and not Path(text).exists():
        return
    _inside(text, root, what)


def confine_workload(name: str, root: Path | None) -> None:
    """Refuse a workload file outside `root`; built-in workload names are always allowed."""
    if root is None:
        return

    if name in builtin_workloads():
        return
    _inside(name, root, "workload")


def _inside(path_text: str, root: Path, what: str) -> None:
    try:
        resolved = Path(path_text).expanduser().resolve()
    except (OSError, RuntimeError, ValueError):
        resolved = None
    if resolved is None or not resolved.is_relative_to(root):
        raise SpecDecError(
            f"the profile's {what} '{path_text}' is outside --models-root {root}: check loads only demo "
            "models, bundled shapes and workloads, cached HF ids and files inside that folder"
        )
