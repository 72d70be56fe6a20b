"""The YAML profile schema: plain dataclasses, validation with clear errors, atomic write, load.

A profile is what `specdec-tune run` found best for one target model on one accelerator. This
module never imports torch (layer 1: plain data).
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import types
import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Union

import yaml

from specdec_tune.errors import SpecDecError

SCHEMA_VERSION = 1

DRAFT_KINDS = ("none", "model", "prompt_lookup", "layer_skip")

# Floats are written with this many significant digits: enough for timings and rates, few enough
# that two profiles diff cleanly.
FLOAT_DIGITS = 5


@dataclass
class DraftSpec:
    """Which drafter proposes tokens. `name` is what tables show and what the search space lists.

    kind: "none" (plain target, gamma 0), "model" (a separate draft model at `path`),
    "prompt_lookup" (n-gram lookup, `ngram_min`..`ngram_max`), "layer_skip" (the target's first
    `layers` layers as the draft).
    """

    name: str
    kind: str
    path: str | None = None
    ngram_min: int | None = None
    ngram_max: int | None = None
    layers: int | None = None

    @property
    def label(self) -> str:
        """Short human label of the drafter, e.g. "lookup (n=1..3)" or "skip (8 layers)"."""
        if self.kind == "prompt_lookup":
            return f"{self.name} (n={self.ngram_min}..{self.ngram_max})"
        if self.kind == "layer_skip":
            return f"{self.name} ({self.layers} layers)"
        return self.name


@dataclass
class Config:
    """One point of the search space."""

    draft: DraftSpec
    gamma: int
    threshold: float = 0.0

    @property
    def label(self) -> str:
        """Short human label, e.g. "draft-1l γ=4 t=0.30"; the threshold only where it can act."""
        if self.draft.kind == "none":
            return "no speculation"
        text = f"{self.draft.name} γ={self.gamma}"
        # prompt lookup has no confidence to threshold, so t= would only be noise there
        if self.draft.kind != "prompt_lookup" or self.threshold > 0:
            text += f" t={self.threshold:.2f}"
        return text


@dataclass
class Metrics:
    """What was measured for one config, timed against the baseline in the same run."""

    tokens_per_s: float
    baseline_tokens_per_s: float
    speedup: float
    speedup_spread: float  # (max - min) / median of the per-repeat speedups
    acceptance_rate: float  # accepted / proposed draft tokens (0 for gamma 0)
    mean_accepted_len: float  # tokens emitted per target forward
    per_position_acceptance: list[float] = field(default_factory=list)
    repeats: int = 1
    predicted_speedup: float | None = None  # the cost model's prediction, when it has one
    # Set when the final round re-measured this config: its speedup in the search trial, which
    # the final-round `speedup` above replaces (the search value of a winner is biased upwards).
    search_speedup: float | None = None


@dataclass
class Result:
    config: Config
    metrics: Metrics


@dataclass
class DraftCosts:
    """Measured cost and acceptance of one drafter on this hardware."""

    name: str
    t_draft_ms: float  # per proposed token
    c: float  # t_draft_ms / t_target_ms
    acceptance_rate: float
    acceptance_vector: list[float]  # P(draft token i accepted | 1..i-1 accepted), i = 1..Gamma


@dataclass
class Costs:
    """Hardware costs measured by the profiler (each a median over repeats)."""

    t_target_ms: float
    t_target_spread: float  # relative (max - min) / median
    verify_ms: list[float]  # C_ver(gamma) for gamma = 1..Gamma (index 0 is gamma 1)
    verify_spread: float  # worst relative spread over the curve
    context_len: int
    drafts: list[DraftCosts] = field(default_factory=list)
    copy_bandwidth_gbps: float | None = None
    decode_bandwidth_gbps: float | None = None
    roofline_share: float | None = None  # decode / copy bandwidth
    matmul_tflops: float | None = None
    # Per-token cost of the plain decoding loop besides the forward (T_plain - T_target), and per
    # step of the speculative loop besides draft and verification forwards; see costmodel.
    loop_overhead_ms: float | None = None
    step_overhead_ms: float | None = None


@dataclass
class TargetInfo:
    name: str  # what the user passed (HF id or folder) or "demo"
    path: str
    revision: str | None  # git commit of the HF snapshot when known
    content_hash: str  # sha256 over config + weight files (first 16 hex)
    dtype: str
    num_params: int


@dataclass
class WorkloadInfo:
    name: str
    prompts: int
    sha256: str  # hash of the prompts (first 16 hex)
    max_new_tokens: int
    temperature: float


@dataclass
class SearchInfo:
    sampler: str  # "tpe" or "grid"
    trials: int  # finished trials counted into the study
    failed: int
    pruned: int
    study_name: str
    storage: str
    seed: int
    space: dict[str, Any] = field(default_factory=dict)  # drafts, gamma range, threshold range
    finalists: int = 0  # configs re-measured head to head after the search (0: no final round)
    final_repeats: int = 0  # interleaved repeats of that final round


@dataclass
class Profile:
    hardware: dict[str, Any]  # fingerprint from specdec_tune.hardware; must contain "slug"
    target: TargetInfo
    workload: WorkloadInfo
    costs: Costs | None
    search: SearchInfo
    best: Result
    alternatives: list[Result]  # next best, at most 4
    baseline: Metrics  # gamma 0: plain target, speedup 1
    versions: dict[str, str] = field(default_factory=dict)  # specdec_tune, torch, transformers, ...
    created: str = ""  # ISO 8601 UTC
    schema_version: int = SCHEMA_VERSION


# --------------------------------------------------------------------------- to / from plain dicts


def profile_to_dict(p: Profile) -> dict[str, Any]:
    """The profile as plain YAML/JSON-able data, keys in dataclass field order, floats rounded."""
    return _plain(p)


def _plain(value: Any) -> Any:
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


def profile_from_dict(d: Any) -> Profile:
    """Build and validate a Profile from plain data (parsed YAML).

    Raises SpecDecError naming the offending field path, e.g. 'best.config.gamma'.
    """
    if not isinstance(d, dict):
        raise SpecDecError(f"a profile must be a YAML mapping at the top level, got {_describe(d)}")
    if "schema_version" not in d:
        # schema_version is the last key written, so a file without it was most likely cut off:
        # converting the rest names the first field that went missing
        _convert(d, Profile, "")
        raise SpecDecError(
            f"profile field 'schema_version' is missing: it is the last line specdec-tune writes, so the "
            f"file may be cut off (this specdec-tune reads schema version {SCHEMA_VERSION})"
        )
    version = d["schema_version"]
    if version != SCHEMA_VERSION or isinstance(version, bool):
        raise SpecDecError(
            f"profile schema_version {version!r} is not supported: this specdec-tune reads schema version "
            f"{SCHEMA_VERSION} (re-run `specdec-tune run` to write a current profile, or install the "
            f"specdec-tune that wrote it)"
        )
    profile = _convert(d, Profile, "")
    _validate(profile)
    return profile


_NONE_TYPE = type(None)


def _convert(value: Any, tp: Any, path: str) -> Any:
    """Check `value` against the annotation `tp` and build dataclasses; path names the field."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin is Union or origin is types.UnionType:
        args = [a for a in typing.get_args(tp) if a is not _NONE_TYPE]
        if value is None:
            return None
        return _convert(value, args[0], path)
    if value is None:
        raise _field_error(path, f"must be {_expected(tp)}{_range_of(path)}", value)
    if is_dataclass(tp):
        return _convert_dataclass(value, tp, path)
    if origin is list:
        if not isinstance(value, list):
            raise _field_error(path, "must be a list", value)
        (item_tp,) = typing.get_args(tp)
        return [_convert(v, item_tp, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise _field_error(path, "must be a mapping", value)
        _, value_tp = typing.get_args(tp)
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise _field_error(path, "must have string keys", k)
            out[k] = _convert(v, value_tp, f"{path}.{k}")
        return out
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _field_error(path, "must be an int" + _range_of(path), value)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _field_error(path, "must be a number" + _range_of(path), value)
        if not math.isfinite(value):
            raise _field_error(path, "must be a finite number" + _range_of(path), value)
        return float(value)
    if tp is str:
        # YAML turns an unquoted ISO timestamp into a datetime; a hand-edited `created:` is still fine
        if hasattr(value, "isoformat") and not isinstance(value, str):
            return value.isoformat()
        if not isinstance(value, str):
            # an unquoted hash or version would have been mangled by YAML already (0123 is octal)
            raise _field_error(path, "must be a string (quote it in YAML)", value)
        return value
    raise TypeError(f"profile schema has an unsupported annotation {tp!r} at {path}")  # a bug, not input


def _convert_dataclass(value: Any, cls: type, path: str) -> Any:
    if not isinstance(value, dict):
        raise _field_error(path or "(top level)", "must be a mapping", value)
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
        kwargs[f.name] = _convert(value[f.name], hints[f.name], sub)
    return cls(**kwargs)


# The allowed range of a numeric field, named in type errors too ("must be an int >= 0, got 'x'")
_FIELD_RANGES = {
    "gamma": ">= 0",
    "threshold": "in [0, 1]",
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


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _field_error(path: str, expectation: str, value: Any) -> SpecDecError:
    return SpecDecError(f"profile field '{path}' {expectation}, got {_describe(value)}")


# ------------------------------------------------------------------------------ semantic checks


def _validate(p: Profile) -> None:
    slug = p.hardware.get("slug")
    if not isinstance(slug, str) or not slug:
        raise _field_error("hardware.slug", "must be a non-empty string", slug)
    _at_least(p.workload.temperature, 0.0, "workload.temperature")
    _at_least(p.workload.max_new_tokens, 1, "workload.max_new_tokens")
    _at_least(p.workload.prompts, 1, "workload.prompts")
    _validate_result(p.best, "best")
    for i, alt in enumerate(p.alternatives):
        _validate_result(alt, f"alternatives[{i}]")
    _validate_metrics(p.baseline, "baseline")
    _at_least(p.search.finalists, 0, "search.finalists")
    _at_least(p.search.final_repeats, 0, "search.final_repeats")
    if p.costs is not None:
        c = p.costs
        _positive(c.t_target_ms, "costs.t_target_ms")
        _at_least(c.context_len, 0, "costs.context_len")
        for i, v in enumerate(c.verify_ms):
            _positive(v, f"costs.verify_ms[{i}]")
        for name in ("loop_overhead_ms", "step_overhead_ms"):
            if getattr(c, name) is not None:
                _at_least(getattr(c, name), 0.0, f"costs.{name}")
        for i, dc in enumerate(c.drafts):
            where = f"costs.drafts[{i}]"
            _at_least(dc.t_draft_ms, 0.0, f"{where}.t_draft_ms")
            _probability(dc.acceptance_rate, f"{where}.acceptance_rate")
            for j, a in enumerate(dc.acceptance_vector):
                _probability(a, f"{where}.acceptance_vector[{j}]")


def _validate_result(r: Result, path: str) -> None:
    d = r.config.draft
    where = f"{path}.config.draft"
    if d.kind not in DRAFT_KINDS:
        raise _field_error(f"{where}.kind", f"must be one of {', '.join(DRAFT_KINDS)}", d.kind)
    if d.kind == "model" and not d.path:
        raise _field_error(
            f"{where}.path", "must name the draft model folder or HF id for kind 'model'", d.path
        )
    if d.kind == "prompt_lookup":
        for name in ("ngram_min", "ngram_max"):
            v = getattr(d, name)
            if v is None or v < 1:
                raise _field_error(f"{where}.{name}", "must be an int >= 1 for kind 'prompt_lookup'", v)
        if d.ngram_min > d.ngram_max:
            raise _field_error(f"{where}.ngram_min", f"must be <= ngram_max ({d.ngram_max})", d.ngram_min)
    if d.kind == "layer_skip" and (d.layers is None or d.layers < 1):
        raise _field_error(f"{where}.layers", "must be an int >= 1 for kind 'layer_skip'", d.layers)
    gamma_path = f"{path}.config.gamma"
    if d.kind == "none":
        if r.config.gamma != 0:
            raise _field_error(gamma_path, "must be 0 for draft kind 'none'", r.config.gamma)
    else:
        _at_least(r.config.gamma, 1, gamma_path)
    t = r.config.threshold
    if not 0.0 <= t <= 1.0:
        raise _field_error(f"{path}.config.threshold", "must be a number in [0, 1]", t)
    _validate_metrics(r.metrics, f"{path}.metrics")


def _validate_metrics(m: Metrics, path: str) -> None:
    _at_least(m.tokens_per_s, 0.0, f"{path}.tokens_per_s")
    _at_least(m.baseline_tokens_per_s, 0.0, f"{path}.baseline_tokens_per_s")
    _at_least(m.speedup, 0.0, f"{path}.speedup")
    _at_least(m.speedup_spread, 0.0, f"{path}.speedup_spread")
    _probability(m.acceptance_rate, f"{path}.acceptance_rate")
    _at_least(m.mean_accepted_len, 0.0, f"{path}.mean_accepted_len")
    for i, a in enumerate(m.per_position_acceptance):
        _probability(a, f"{path}.per_position_acceptance[{i}]")
    _at_least(m.repeats, 1, f"{path}.repeats")
    if m.search_speedup is not None:
        _at_least(m.search_speedup, 0.0, f"{path}.search_speedup")


def _at_least(value: float, low: float, path: str) -> None:
    if value < low:
        kind = "an int" if isinstance(low, int) else "a number"
        raise _field_error(path, f"must be {kind} >= {low}", value)


def _positive(value: float, path: str) -> None:
    if value <= 0:
        raise _field_error(path, "must be a number > 0", value)


def _probability(value: float, path: str) -> None:
    if not 0.0 <= value <= 1.0:
        raise _field_error(path, "must be a number in [0, 1]", value)


# ------------------------------------------------------------------------------------ file I/O


class _Dumper(yaml.SafeDumper):
    """Short lists of numbers on one line (`verify_ms: [7.1, 7.2]`): far easier to read and diff."""


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
        f"# specdec-tune profile — {p.target.name} on {p.hardware.get('slug')} "
        f"(schema {p.schema_version}); written by `specdec-tune run`, read by check/export/show\n"
    )
    return header + body


def save_profile(p: Profile, path: str | os.PathLike[str]) -> Path:
    """Write the profile as YAML atomically (parent folders are created); returns the path."""
    text = profile_to_yaml(p)
    path = Path(path)
    atomic_write_text(path, text)
    return path


def load_profile(path: str | os.PathLike[str]) -> Profile:
    """Read and validate a profile; every problem with the file is a SpecDecError, never a traceback."""
    path = Path(path)
    if not path.exists():
        raise SpecDecError(f"profile not found: {path}")
    if path.is_dir():
        raise SpecDecError(f"profile path is a folder, not a YAML file: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SpecDecError(f"{path} is not a text file, so not a specdec-tune profile") from None
    except OSError as e:
        raise SpecDecError(f"cannot read profile {path}: {e.strerror or e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        where = ""
        mark = getattr(e, "problem_mark", None)
        if mark is not None:
            where = f" (line {mark.line + 1}, column {mark.column + 1})"
        problem = getattr(e, "problem", None) or "parse error"
        raise SpecDecError(
            f"{path} is not valid YAML{where}: {problem}; if the file was cut off, re-run `specdec-tune run`"
        ) from None
    if data is None:
        raise SpecDecError(f"profile {path} is empty")
    try:
        return profile_from_dict(data)
    except SpecDecError as e:
        raise SpecDecError(f"{path}: {e}") from None


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    """Write text so that readers see the old file or the new one, never a half-written one."""
    atomic_write_bytes(path, text.encode(encoding))


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Temp file in the same folder + fsync + os.replace; parent folders are created.

    OS errors (permissions, full disk) become SpecDecError; the old file is left untouched.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # keep the mode of the file we replace; mkstemp's 0600 would hide a shared profile
        mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise SpecDecError(f"cannot write {path}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise SpecDecError(f"cannot write {path}: {e.strerror or e}") from None
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    # makes the rename itself durable on POSIX; not possible (nor needed) on Windows
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def costs_to_yaml(costs: Costs, hardware: dict[str, Any]) -> str:
    """The `specdec-tune profile --out` file: measured costs and the hardware they belong to."""
    doc = {"schema_version": SCHEMA_VERSION, "hardware": _plain(hardware), "costs": _plain(costs)}
    return "# specdec-tune measured costs\n" + yaml.dump(
        doc, Dumper=_Dumper, sort_keys=False, allow_unicode=True
    )


def load_costs(path: str | os.PathLike[str]) -> tuple[Costs, dict[str, Any]]:
    """Read a costs file written by `specdec-tune profile --out` -> (costs, hardware)."""
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise SpecDecError(f"cannot read costs file {p}: {str(exc).splitlines()[0]}") from None
    if not isinstance(doc, dict) or "costs" not in doc or not isinstance(doc.get("hardware"), dict):
        raise SpecDecError(f"{p} is not a costs file written by `specdec-tune profile --out`")
    return _convert_dataclass(doc["costs"], Costs, "costs"), doc["hardware"]
