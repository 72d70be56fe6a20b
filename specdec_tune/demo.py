"""The shipped demo models: their names and where they are installed (package data).

A shared leaf: the loader (runtime.models.loading) loads them, the profile store (store.refs) names them
portably, and neither needs the other for it.
"""

from __future__ import annotations

from pathlib import Path

from .errors import SpecDecError

DEMO_DIR = Path(__file__).resolve().parent / "data" / "demo"
DEMO_TARGET = "demo"
DEMO_DRAFTS = ("draft-1l", "draft-2l")


def demo_path(name: str) -> Path:
    """Folder of a shipped demo model: "demo" (the target), "draft-1l" or "draft-2l"."""
    folder = DEMO_DIR / ("target" if name in (DEMO_TARGET, "target") else name)
    if not (folder / "config.json").is_file():
        raise SpecDecError(
            f"the demo model '{name}' is not installed at {folder}; reinstall specdec-tune "
            "or rebuild it with scripts/train_demo_models.py"
        )
    return folder


def is_demo_name(name: str) -> bool:
    return name in (DEMO_TARGET, *DEMO_DRAFTS)
