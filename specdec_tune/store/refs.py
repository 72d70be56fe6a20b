"""Portable references in a profile: models by demo name, by HF id (the revision beside it), or by a
folder relative to the profile's own folder ("./" or "../" first), never by an absolute path of the
machine that ran the search; and the study storage URL without a password or a home folder.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

from ..demo import demo_path, is_demo_name
from ..domain import Result, slugify
from ..urls import redact_url
from .schema import Profile


def portable_ref(name_or_path: str, profile_dir: Path) -> str:
    """How a profile in `profile_dir` names the model the user passed as `name_or_path`: a model
    folder or file (a GGUF) relative to the profile's folder, a name as it is."""
    if is_demo_name(name_or_path):
        return name_or_path
    p = Path(name_or_path).expanduser()
    if not (p.is_dir() or p.is_file()):
        return name_or_path  # an HF id (loaded from the local cache), a built-in GGUF's name
    rel = Path(os.path.relpath(p.resolve(), Path(profile_dir).resolve())).as_posix()
    return rel if rel.startswith("../") or rel == ".." else f"./{rel}"


_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def profile_file_slug(name: str) -> str:
    """The default profile file name of a target, unique per model reference: a name as it is
    (profiles/<hw>/demo.yaml), an HF id with its org ("org--model"), a folder or a file with a
    short hash of its absolute path, so org-a/X and org-b/X, or /models/a/hf and /models/b/hf, or
    /models/a/m.gguf and /models/b/m.gguf, never collide."""
    import hashlib

    text = name.strip()
    p = Path(text).expanduser()
    if is_demo_name(text) or ("/" not in text and not text.startswith("~") and not p.exists()):
        return slugify(text)  # a name (demo, a built-in model, an HF id without org): unique as it is
    if _HF_ID.match(text) and ".." not in text and not p.exists():
        org, model = text.split("/")
        return f"{slugify(org)}--{slugify(model)}"
    where = str(p.resolve()) if not text.startswith("shape:") else text
    return f"{slugify(text)}-{hashlib.sha256(where.encode()).hexdigest()[:8]}"


def is_relative_ref(ref: str) -> bool:
    return ref in (".", "..") or ref.startswith(("./", "../"))


def resolve_ref(ref: str, profile_dir: Path) -> str:
    """What the model loader takes for a stored reference: a relative folder joined to the profile's
    folder; a demo name, an HF id or (in profiles written before references were portable) an
    absolute path as written."""
    if is_relative_ref(ref):
        return str((Path(profile_dir) / ref).resolve())
    return ref


def engine_path(ref: str, profile_dir: Path) -> str:
    """What a serving engine should load for a stored draft reference: the installed folder of a
    demo model, the absolute folder of a relative one, an HF id as it is."""
    if is_demo_name(ref):
        return str(demo_path(ref))
    return resolve_ref(ref, profile_dir)


def target_ref(profile: Profile) -> str:
    """The stored target reference; for an old profile whose `path` is another machine's absolute
    folder, what the user passed (`name`), as `check` always did."""
    path = profile.target.path
    if os.path.isabs(path) and not Path(path).is_dir():
        return profile.target.name
    return path


def make_portable(profile: Profile, profile_path: Path, target_arg: str) -> Profile:
    """The profile with its target and draft models named portably for a file at `profile_path`."""
    folder = Path(profile_path).parent

    def result(r: Result) -> Result:
        d = r.config.draft
        if d.kind != "model" or not d.path:
            return r
        draft = dataclasses.replace(d, path=portable_ref(d.path, folder))
        return dataclasses.replace(r, config=dataclasses.replace(r.config, draft=draft))

    ref = portable_ref(target_arg, folder)
    target = dataclasses.replace(profile.target, name=ref, path=ref)
    return dataclasses.replace(
        profile,
        target=target,
        best=result(profile.best),
        alternatives=[result(a) for a in profile.alternatives],
        batch_table=[
            dataclasses.replace(row, best=result(row.best), per_draft=[result(r) for r in row.per_draft])
            for row in profile.batch_table
        ],
    )


def storage_for_record(url: str) -> str:
    """A storage URL as a profile may hold it: no password (SQLAlchemy's hide_password), and the
    user's home folder written as ~."""
    text = redact_url(url)
    home = str(Path.home())
    if home not in ("", "/"):
        text = text.replace(home.rstrip("/") + "/", "~/")
    return text
