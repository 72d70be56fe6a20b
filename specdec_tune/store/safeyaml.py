"""The one way a YAML file from outside is read: a size cap, no anchors or aliases (no expansion
bombs), a nesting cap (no RecursionError), libyaml's C parser where it is installed, and every
problem a one-line SpecDecError. Profiles and costs files both come through here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from ..errors import SpecDecError

# A profile with a full batch and category table is tens of KB; 4 MiB leaves room for hand-made
# ones and keeps a crafted file from costing CI seconds or memory.
MAX_YAML_BYTES = 4 * 1024 * 1024
MAX_YAML_DEPTH = 32  # a profile nests about 8 levels deep

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_capped_text(path: Path, what: str, max_bytes: int | None = None) -> str:
    """A text file of at most `max_bytes`, as a SpecDecError when it is missing, larger, a folder,
    not UTF-8 or unreadable (never reads more than the cap)."""
    max_bytes = max_yaml_bytes() if max_bytes is None else max_bytes
    if not path.exists():
        raise SpecDecError(f"{what} not found: {path}")
    if path.is_dir():
        raise SpecDecError(f"{what} path is a folder, not a file: {path}")
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise SpecDecError(f"cannot read {what} {path}: {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise SpecDecError(
            f"{what} {path} is larger than {max_bytes // (1024 * 1024)} MiB, so not a specdec-tune "
            "file (set SPECDEC_MAX_YAML_MB to read larger ones)"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecDecError(f"{path} is not a text file (not UTF-8), so not a specdec-tune {what}") from None


def max_yaml_bytes() -> int:
    """The size cap, raised by SPECDEC_MAX_YAML_MB for an unusually large file a person trusts."""
    raw = os.environ.get("SPECDEC_MAX_YAML_MB", "")
    if raw.isdigit() and 0 < int(raw) <= 1024:
        return int(raw) * 1024 * 1024
    return MAX_YAML_BYTES


def safe_yaml(text: str, label: str) -> Any:
    """Parse `text` (from `label`) into plain data: scalars, lists, string-keyed mappings."""
    try:
        _check_events(text, label)
        return yaml.load(text, Loader=_Loader)  # a safe loader, C or Python
    except SpecDecError:
        raise
    except yaml.YAMLError as e:
        where = ""
        mark = getattr(e, "problem_mark", None)
        if mark is not None:
            where = f" (line {mark.line + 1}, column {mark.column + 1})"
        problem = getattr(e, "problem", None) or "parse error"
        raise SpecDecError(
            f"{label} is not valid YAML{where}: {problem}; if the file was cut off, re-run `specdec-tune run`"
        ) from None
    except (ValueError, OverflowError, RecursionError, MemoryError) as e:
        # e.g. an integer of thousands of digits (Python refuses to convert it)
        first = (str(e).splitlines() or [type(e).__name__])[0][:200]
        raise SpecDecError(f"{label} holds a value YAML cannot turn into data: {first}") from None


def _check_events(text: str, label: str) -> None:
    """Walk the event stream once (libyaml, no objects built) and refuse what a profile never holds."""
    depth = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise SpecDecError(
                f"{label} uses YAML anchors or aliases (&, *): specdec-tune files never do, and they "
                "can expand a small file into a huge one; write the values out"
            )
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                raise SpecDecError(
                    f"{label} nests deeper than {MAX_YAML_DEPTH} levels, so it is not a specdec-tune file"
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
