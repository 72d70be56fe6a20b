"""A run's two files, the profile YAML and its trials CSV beside it, written as one pair.

Both are written under one lock on the profile's path, the CSV first, and the profile records the
CSV's sha256: a reader finds out (and says so) when the CSV beside a profile belongs to another
run, instead of mixing two runs' numbers. A profile of another target is never replaced without
`force` (`run --force`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path
from typing import Any

from ..atomic import atomic_write_text, locked
from ..errors import SpecDecError
from .schema import Profile
from .yamlio import load_profile, save_profile

__all__ = ["check_replaceable", "rewrite_profile", "save_run", "trials_beside", "trials_path"]


def trials_path(profile_path: str | os.PathLike[str]) -> Path:
    """`<profile>.trials.csv` beside `<profile>.yaml`."""
    return Path(profile_path).with_suffix(".trials.csv")


def check_replaceable(path: str | os.PathLike[str], target_hash: str, force: bool = False) -> None:
    """Refuse to replace the profile at `path` when it is another target's (its content hash
    differs) or no readable profile at all, unless `force`. Called before a search, so the refusal
    costs nothing, and again under the lock at the write."""
    path = Path(path)
    if force or not path.exists():
        return
    try:
        old = load_profile(path)
    except SpecDecError:
        raise SpecDecError(
            f"{path} exists and is not a readable profile: pass --force to replace it, or --out another file"
        ) from None
    if old.target.content_hash != target_hash:
        raise SpecDecError(
            f"{path} holds the profile of another target ({old.target.name}, {old.target.content_hash}): "
            "pass --force to replace it, or --out another file"
        )


def save_run(
    profile: Profile, path: str | os.PathLike[str], rows: list[dict[str, Any]], force: bool = False
) -> tuple[Profile, Path]:
    """Write the trials CSV (one row per trial) and then the profile that records its sha256, both
    under the profile's lock -> (the profile as written, the CSV's path)."""
    import pandas as pd

    path = Path(path)
    text = pd.DataFrame(rows).to_csv(index=False)
    profile = dataclasses.replace(profile, trials_sha256=hashlib.sha256(text.encode()).hexdigest())
    csv = trials_path(path)
    with locked(path):
        check_replaceable(path, profile.target.content_hash, force)
        atomic_write_text(csv, text)
        save_profile(profile, path)
    return profile, csv


def rewrite_profile(profile: Profile, path: str | os.PathLike[str]) -> None:
    """Write back a profile read from `path` and extended (`run --per-category`), unless another
    run replaced the file in the meantime: that run's profile and CSV stay as they are."""
    path = Path(path)
    with locked(path):
        now = load_profile(path)
        if (now.created, now.trials_sha256) != (profile.created, profile.trials_sha256):
            raise SpecDecError(f"another run replaced {path} while this one measured: nothing written")
        save_profile(profile, path)


def trials_beside(profile: Profile, path: str | os.PathLike[str]) -> tuple[Path | None, str | None]:
    """The trials CSV of the profile at `path` -> (its path, None); (None, why) when the CSV beside
    it is from another run (its sha256 is not the one the profile recorded); (None, None) when
    there is none. A profile written before the hash was recorded takes the CSV as it is."""
    csv = trials_path(path)
    if not csv.is_file():
        return None, None
    if profile.trials_sha256 is None:
        return csv, None
    digest = hashlib.sha256()
    try:
        with open(csv, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError as e:
        raise SpecDecError(f"cannot read trials CSV {csv}: {e.strerror or e}") from None
    if digest.hexdigest() != profile.trials_sha256:
        return None, f"{csv} is from another run than {Path(path).name} (its sha256 differs): left out"
    return csv, None
