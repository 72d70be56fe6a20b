"""Check settings against an engine version's flag set (flagsets): unknown or removed options, bad
values, missing companions, options that exclude each other, schedules that break the engine's rules.
"""

from __future__ import annotations

import json
from typing import Any

from .flagsets import FlagSet, Option

__all__ = ["flatten", "problems"]

NESTED_ENGINES = ("hf", "trtllm")  # settings nested one level: {"speculative_config": {...}}


def _lookup(fs: FlagSet, name: str) -> tuple[str, Option] | None:
    for key, opt in fs.options.items():
        if name == key or name in opt.aliases:
            return key, opt
    return None


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _ranges_ok(value: Any) -> bool:
    """vLLM's [[start, end, K], ...]: inclusive, contiguous, sorted, from 1, K >= 0."""
    ok = isinstance(value, list) and bool(value) and value[0][0] == 1
    for i, (start, end, k) in enumerate(value):
        ok = ok and all(_is_int(x) for x in (start, end, k))
        ok = ok and 1 <= start <= end and k >= 0
        ok = ok and (i == 0 or start == value[i - 1][1] + 1)
    return ok


def _len_schedule_ok(value: Any) -> bool:
    """TensorRT-LLM's {max batch size: draft len}: keys >= 1, values >= 0 (JSON keys may be strings)."""
    if not isinstance(value, dict) or not value:
        return False
    keys = [int(k) for k in value]
    return all(k >= 1 for k in keys) and all(_is_int(v) and v >= 0 for v in value.values())


def _value_problem(name: str, opt: Option, value: Any) -> str | None:
    t = opt.type
    try:
        if t == "bool":
            ok = isinstance(value, bool)
        elif t == "int":
            v = int(value) if isinstance(value, str) else value
            ok = _is_int(v)
            ok = ok and (opt.low is None or v >= opt.low) and (opt.high is None or v <= opt.high)
        elif t == "float":
            v = float(value)
            ok = (opt.low is None or v >= opt.low) and (opt.high is None or v <= opt.high)
        elif t == "choice":
            ok = value in opt.choices
        elif t == "list":
            ok = all(v in opt.choices for v in str(value).split(","))
        elif t == "json":
            ok = isinstance(json.loads(value), dict)
        elif t == "ranges":
            ok = _ranges_ok(value)
        elif t == "len_schedule":
            ok = _len_schedule_ok(value)
        else:
            ok = isinstance(value, str) and bool(value)
    except (TypeError, ValueError, IndexError):
        ok = False
    return None if ok else f"{name}: {value!r} is not a valid {t}"


def _relations(fs: FlagSet, given: dict[str, Any]) -> list[str]:
    """Companions an option needs, options it excludes, and a schedule's bound (TensorRT-LLM: the
    smallest batch size's draft length equals max_draft_len, none is larger)."""
    out = []
    for key, value in given.items():
        opt = fs.options[key]
        for need, want in opt.requires:
            have = given.get(need)
            if have is None:
                out.append(f"{key} needs {need}" + (f" {want}" if want else ""))
            elif want is not None and want not in str(have).split(","):
                out.append(f"{key} needs {need} to include {want}, got {have}")
        out += [f"{key} and {other} exclude each other" for other in opt.excludes if other in given]
        bound = given.get(opt.bounded_by) if opt.bounded_by else None
        if bound is not None and isinstance(value, dict) and value:
            ks = sorted(value, key=int)
            if value[ks[0]] != bound or any(v > bound for v in value.values()):
                out.append(f"{key}: the smallest batch size's value must equal {opt.bounded_by} ({bound})")
    return out


def flatten(engine: str, settings: Any) -> list[tuple[str, Any]]:
    """(option, value) pairs of an argv list or a settings mapping (nested one level for HF and
    TensorRT-LLM, whose keys are then "outer.inner")."""
    if isinstance(settings, list):
        return _argv_items(settings)
    items: list[tuple[str, Any]] = []
    for k, v in (settings or {}).items():
        if isinstance(v, dict) and engine in NESTED_ENGINES:
            items += [(f"{k}.{kk}", vv) for kk, vv in v.items()]
        else:
            items.append((k, v))
    return items


def _argv_items(argv: list[str]) -> list[tuple[str, Any]]:
    items: list[tuple[str, Any]] = []
    i = 0
    while i < len(argv):
        has_value = i + 1 < len(argv) and not argv[i + 1].startswith("-")
        items.append((argv[i], argv[i + 1] if has_value else True))
        i += 2 if has_value else 1
    return items


def problems(fs: FlagSet, settings: Any) -> list[str]:
    """What in `settings` (an argv list, or a mapping of keys) the engine version `fs` would refuse:
    unknown or removed options, bad values, missing companions, exclusive pairs."""
    given: dict[str, Any] = {}
    out: list[str] = []
    for name, value in flatten(fs.engine, settings):
        if name in fs.removed:
            out.append(f"{name} was removed: {fs.removed[name]}")
            continue
        found = _lookup(fs, name)
        if found is None:
            out.append(f"{name} is not an option of {fs.engine} {fs.version}")
            continue
        key, opt = found
        problem = _value_problem(name, opt, value)
        if problem:
            out.append(problem)
        if opt.type == "json" and problem is None:
            out += problems(fs, json.loads(value))
        given[key] = value
    return out + _relations(fs, given)
