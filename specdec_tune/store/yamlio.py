"""Profiles and costs files as YAML: to and from plain data (floats rounded so two profiles diff
cleanly), written atomically, read back with every problem a one-line SpecDecError.
"""

from __future__ import annotations

import math
import os
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml

from ..atomic import atomic_write_text
from ..domain import Costs
from ..errors import SpecDecError
from ..urls import redact_url
from .fields import SCHEMA_VERSION, convert_dataclass
from .safeyaml import read_capped_text, safe_yaml
from .schema import BackendInfo, Profile
from .validate import profile_from_dict, validate_costs

# Floats are written with this many significant digits: enough for timings and rates, few enough
# that two profiles diff cleanly.
FLOAT_DIGITS = 5


def profile_to_dict(p: Profile) -> dict[str, Any]:
    """The profile as plain YAML/JSON-able data, keys in dataclass field order, floats rounded, and
    the study storage URL without its password, whatever the profile held (a file written by hand
    or by an older version): this is what `save_profile` writes and `show --json` prints."""
    data = _plain(p)
    search = data.get("search")
    if isinstance(search, dict) and isinstance(search.get("storage"), str):
        search["storage"] = redact_url(search["storage"])
    return data


def _plain(value: Any) -> Any:
    if isinstance(value, BackendInfo):  # the mapping without its defaults: `{}` for our engine
        return _plain(value.as_dict())
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    # numpy scalars sneak in from measurement code; YAML's safe dumper refuses them
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bool) or value is None or isinstance(value, int | str):
        return value
    if isinstance(value, float):
        return _round(value)
    return str(value)


def _round(x: float) -> float:
    if not math.isfinite(x) or x == 0:
        return x
    return float(f"{x:.{FLOAT_DIGITS}g}")


class _Dumper(yaml.SafeDumper):
    """Short lists of numbers on one line (`verify_ms: [7.1, 7.2]`): far easier to read and diff."""

    def ignore_aliases(self, data: Any) -> bool:
        return True  # the loader refuses anchors and aliases (store.safeyaml): never write one


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flat = all(isinstance(v, int | float | bool) or v is None for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flat and bool(data))


_Dumper.add_representer(list, _represent_list)


def profile_to_yaml(p: Profile) -> str:
    """The YAML text `save_profile` writes, header comment included."""
    data = profile_to_dict(p)
    # a profile that could not be loaded back must never be written
    profile_from_dict(data)
    body = yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)
    header = (
        f"# specdec-tune profile — {_comment(p.target.name)} on {_comment(p.hardware.get('slug'))} "
        f"(schema {p.schema_version}); written by `specdec-tune run`, read by check/export/show\n"
    )
    return header + body


def _comment(value: object) -> str:
    # a name goes into the header comment: a newline there would start YAML content, and YAML
    # refuses control characters outside quoted scalars
    return "".join(c if c.isprintable() else "?" for c in str(value))


def save_profile(p: Profile, path: str | os.PathLike[str]) -> Path:
    """Write the profile as YAML atomically (parent folders are created); returns the path."""
    text = profile_to_yaml(p)
    path = Path(path)
    atomic_write_text(path, text)
    return path


def load_profile(path: str | os.PathLike[str]) -> Profile:
    """Read and validate a profile; every problem with the file is a SpecDecError, never a traceback."""
    path = Path(path)
    data = safe_yaml(read_capped_text(path, "profile"), str(path))
    if data is None:
        raise SpecDecError(f"profile {path} is empty")
    try:
        return profile_from_dict(data)
    except SpecDecError as e:
        raise SpecDecError(f"{path}: {e}") from None


def costs_to_yaml(costs: Costs, hardware: dict[str, Any], target: dict[str, Any] | None = None) -> str:
    """The `specdec-tune profile --out` file: measured costs, the hardware they belong to, and (for
    a reader, never read back) the target they were measured for."""
    doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "hardware": _plain(hardware)}
    if target:
        doc["target"] = _plain(target)
    doc["costs"] = _plain(costs)
    header = "# specdec-tune measured costs\n"
    if costs.weights == "random":
        header = (
            f"# specdec-tune measured costs of shape {costs.shape} with RANDOM weights: the timings are "
            "those of its real size;\n# acceptance is given or unknown, never measured against it\n"
        )
    return header + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, allow_unicode=True)


def load_costs(path: str | os.PathLike[str]) -> tuple[Costs, dict[str, Any]]:
    """Read a costs file written by `specdec-tune profile --out` -> (costs, hardware)."""
    p = Path(path)
    doc = safe_yaml(read_capped_text(p, "costs file"), str(p))
    if not isinstance(doc, dict) or "costs" not in doc or not isinstance(doc.get("hardware"), dict):
        raise SpecDecError(f"{p} is not a costs file written by `specdec-tune profile --out`")
    if doc["costs"] is None:
        raise SpecDecError(f"{p} holds no measured costs (a profile written by `run --no-profile`)")
    try:
        costs = convert_dataclass(doc["costs"], Costs, "costs")
        validate_costs(costs)
    except SpecDecError as e:
        raise SpecDecError(f"{p}: {e}") from None
    return costs, doc["hardware"]
