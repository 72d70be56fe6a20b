"""Typed conversion of parsed YAML into the schema's dataclasses, with errors that name the field
path ("profile field 'best.config.gamma' must be an int >= 0, got 'x'"), and the file format's
version. The profile and costs schemas (`schema`) build on it. Never imports torch.
"""

from __future__ import annotations

import math
import types
import typing
from dataclasses import MISSING, fields, is_dataclass
from typing import Any, Union

from ..errors import SpecDecError
from ..limits import MAX_INT, THRESHOLD_RANGE

SCHEMA_VERSION = 2
# Version 1 profiles (before the batch table) still load: every field added since is optional.
READABLE_VERSIONS = (1, 2)


_NONE_TYPE = type(None)


def convert(value: Any, tp: Any, path: str) -> Any:
    """Check `value` against the annotation `tp` and build dataclasses; path names the field."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin is Union or origin is types.UnionType:
        args = [a for a in typing.get_args(tp) if a is not _NONE_TYPE]
        if value is None:
            return None
        return convert(value, args[0], path)
    if value is None:
        raise field_error(path, f"must be {_expected(tp)}{_range_of(path)}", value)
    if is_dataclass(tp):
        return convert_dataclass(value, tp, path)
    if origin is list:
        if not isinstance(value, list):
            raise field_error(path, "must be a list", value)
        (item_tp,) = typing.get_args(tp)
        return [convert(v, item_tp, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise field_error(path, "must be a mapping", value)
        _, value_tp = typing.get_args(tp)
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise field_error(path, "must have string keys", k)
            out[k] = convert(v, value_tp, f"{path}.{k}")
        return out
    if tp is bool:
        if not isinstance(value, bool):
            raise field_error(path, "must be true or false", value)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise field_error(path, "must be an int" + _range_of(path), value)
        if abs(value) > MAX_INT:
            raise field_error(path, f"must be an int of at most {MAX_INT}", value)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise field_error(path, "must be a number" + _range_of(path), value)
        if isinstance(value, int) and abs(value) > MAX_INT:
            raise field_error(path, f"must be a number of at most {MAX_INT}", value)
        if not math.isfinite(value):
            raise field_error(path, "must be a finite number" + _range_of(path), value)
        return float(value)
    if tp is str:
        # YAML turns an unquoted ISO timestamp into a datetime; a hand-edited `created:` is still fine
        if hasattr(value, "isoformat") and not isinstance(value, str):
            return value.isoformat()
        if not isinstance(value, str):
            # an unquoted hash or version would have been mangled by YAML already (0123 is octal)
            raise field_error(path, "must be a string (quote it in YAML)", value)
        return value
    raise TypeError(f"profile schema has an unsupported annotation {tp!r} at {path}")  # a bug, not input


def convert_dataclass(value: Any, cls: type, path: str) -> Any:
    if not isinstance(value, dict):
        raise field_error(path or "(top level)", "must be a mapping", value)
    hints = typing.get_type_hints(cls)
    known = [f.name for f in fields(cls)]
    unknown = [k for k in value if k not in known]
    if unknown:
        where = f"profile field '{_join(path, str(unknown[0]))}'"
        raise SpecDecError(
            f"{where} is not part of schema version {SCHEMA_VERSION} (known fields here: {', '.join(known)})"
        )
    kwargs = {}
    for f in fields(cls):
        sub = _join(path, f.name)
        if f.name not in value:
            if f.default is MISSING and f.default_factory is MISSING:
                raise SpecDecError(
                    f"profile field '{sub}' is missing (is the file truncated or hand-edited?)"
                )
            continue
        kwargs[f.name] = convert(value[f.name], hints[f.name], sub)
    return cls(**kwargs)


# The allowed range of a numeric field, named in type errors too ("must be an int >= 0, got 'x'")
_FIELD_RANGES = {
    "gamma": ">= 0",
    "threshold": f"in {THRESHOLD_RANGE}",
    "acceptance_rate": "in [0, 1]",
    "acceptance_vector": "in [0, 1]",
    "per_position_acceptance": "in [0, 1]",
    "repeats": ">= 1",
    "prompts": ">= 1",
    "max_new_tokens": ">= 1",
    "temperature": ">= 0",
    "ngram_min": ">= 1",
    "ngram_max": ">= 1",
    "layers": ">= 1",
}


def _range_of(path: str) -> str:
    name = path.rsplit(".", 1)[-1].split("[", 1)[0]
    rng = _FIELD_RANGES.get(name)
    return f" {rng}" if rng else ""


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _expected(tp: Any) -> str:
    if is_dataclass(tp) or typing.get_origin(tp) is dict:
        return "a mapping"
    if typing.get_origin(tp) is list:
        return "a list"
    return {int: "an int", float: "a number", str: "a string"}.get(tp, "set")


MAX_TEXT = 1024  # characters of a string in a free-form mapping (hardware, search.space)
MAX_ITEMS = 256  # entries of a list or mapping there


def check_plain(value: Any, path: str, depth: int = 2) -> None:
    """A free-form value (a `hardware` entry, an unknown `search.space` key): a scalar, or a short
    list or mapping of them `depth` levels deep at most; strings and collections are capped."""
    if value is None or isinstance(value, bool | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise field_error(path, "must be a finite number", value)
        return
    if isinstance(value, int):
        if abs(value) > MAX_INT:
            raise field_error(path, f"must be an int of at most {MAX_INT}", value)
        return
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise field_error(path, f"must be a string of at most {MAX_TEXT} characters", value)
        return
    if hasattr(value, "isoformat"):  # an unquoted date
        return
    if depth <= 0 or not isinstance(value, list | dict):
        raise field_error(path, "must be a number or a string", value)
    if len(value) > MAX_ITEMS:
        raise field_error(path, f"must have at most {MAX_ITEMS} entries", value)
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for k, v in items:
        if isinstance(value, dict) and not isinstance(k, str):
            raise field_error(path, "must have string keys", k)
        check_plain(v, f"{path}.{k}" if isinstance(value, dict) else f"{path}[{k}]", depth - 1)


def describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, int) and abs(value) > 10**30:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def field_error(path: str, expectation: str, value: Any) -> SpecDecError:
    return SpecDecError(f"profile field '{path}' {expectation}, got {describe(value)}")
