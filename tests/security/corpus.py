"""Crafted profiles: each is a valid sample profile (tests/helpers) with one hostile change, or a
file no profile writer makes. Every one must end `show` and `check` with exit 2 (or 3) and one line."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from helpers import make_sample_profile

from specdec_tune.store.yamlio import profile_to_dict

BIG_INT = "9" * 5000


def sample() -> dict[str, Any]:
    return copy.deepcopy(profile_to_dict(make_sample_profile()))


def _set(path: str, value: Any) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        data = sample()
        node = data
        *parents, last = path.split(".")
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
        out = folder / "p.yaml"
        out.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        return out

    return build


def _replace(old: str, new: str) -> Callable[[Path], Path]:
    """Edit the YAML text of the sample (for what safe_dump would never write)."""

    def build(folder: Path) -> Path:
        text = yaml.safe_dump(sample(), sort_keys=False)
        assert old in text, old
        out = folder / "p.yaml"
        out.write_text(text.replace(old, new, 1), encoding="utf-8")
        return out

    return build


def _raw(content: bytes | str) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        out = folder / "p.yaml"
        out.write_bytes(content.encode() if isinstance(content, str) else content)
        return out

    return build


def _alias_bomb(indent: int) -> str:
    """The billion laughs: nine levels of nine aliases, a few hundred bytes."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    return "".join(" " * indent + line + "\n" for line in lines)


def _big_file(folder: Path) -> Path:
    out = folder / "p.yaml"
    text = yaml.safe_dump(sample(), sort_keys=False)
    with open(out, "w", encoding="utf-8") as f:
        f.write(text)
        f.write(("# padding\n" * 1024) * 420)  # ~4.3 MB of comments: valid YAML, over the cap
    return out


def _folder(folder: Path) -> Path:
    (folder / "dir.yaml").mkdir()
    return folder / "dir.yaml"


PROFILES: dict[str, Callable[[Path], Path]] = {
    "alias-bomb-hardware": _replace("hardware:\n", "hardware:\n" + _alias_bomb(2)),
    "alias-bomb-space": _replace("  space:\n", "  space:\n" + _alias_bomb(4)),
    "anchor-only": _replace("  slug: nvidia-h200", "  slug: &s nvidia-h200"),
    "alias-scalar": _replace("  cuda: '12.8'", "  gpu_name2: &n x\n  cuda: *n"),
    "over-size-cap": _big_file,
    "huge-int-max-new-tokens": _replace("max_new_tokens: 128", f"max_new_tokens: {BIG_INT}"),
    "huge-int-hardware": _replace("  sm_count: 132", f"  sm_count: {BIG_INT}"),
    "deep-nesting-hardware": _replace("  sm_count: 132", "  sm_count: " + "[" * 20000 + "]" * 20000),
    "deep-nesting-top": _raw("[" * 20000 + "]" * 20000),
    "deep-mapping": _raw("".join(" " * i + "a:\n" for i in range(200)) + " " * 200 + "b: 1\n"),
    "max-new-tokens-1e30": _set("workload.max_new_tokens", 10**30),
    "max-new-tokens-1e6": _set("workload.max_new_tokens", 10**6),
    "prompts-1e9": _set("workload.prompts", 10**9),
    "repeats-1e9": _set("best.metrics.repeats", 10**9),
    "final-repeats-1e9": _set("search.final_repeats", 10**9),
    "gamma-65": _set("best.config.gamma", 65),
    "gamma-inf": _replace("    gamma: 4\n", "    gamma: .inf\n"),
    "temperature-nan": _replace("temperature: 0.0", "temperature: .nan"),
    "temperature-1e308": _set("workload.temperature", 1e308),
    "threshold-1": _set("best.config.threshold", 1.0),
    "hardware-nested": _set("hardware.cuda", {"a": {"b": {"c": 1}}}),
    "hardware-long-string": _set("hardware.gpu_name", "x" * 5000),
    "hardware-huge-list": _set("hardware.gpu_name", list(range(5000))),
    "space-gamma-huge": _set("search.space.gamma", [1, 10**9]),
    "space-drafts-mapping": _set("search.space.drafts", {"a": 1}),
    "space-many-keys": _set("search.space", {f"k{i}": i for i in range(1000)}),
    "ngram-max-huge": _set("best.config.draft.ngram_max", 10**9),
    "layers-huge": _set("best.config.draft.layers", 10**9),
    "verify-ms-long": _set("costs.verify_ms", [7.0] * 1000),
    "per-position-long": _set("best.metrics.per_position_acceptance", [0.5] * 10000),
    "context-len-huge": _set("costs.context_len", 10**12),
    "slug-empty": _set("hardware.slug", ""),
    "markup-and-bad-gamma": _replace("    gamma: 4\n", "    gamma: '[/x][bold]'\n"),
    "binary": _raw(bytes(range(256)) * 4),
    "not-utf8": _raw(b"hardware: \xff\xfe\n"),
    "empty": _raw(""),
    "top-level-list": _raw("- 1\n- 2\n"),
    "python-tag": _raw("!!python/object/apply:os.system ['echo pwned']\n"),
    "two-documents": _raw("a: 1\n---\nb: 2\n"),
    "schema-99": _set("schema_version", 99),
    "unknown-field": _set("best.config.gama", 4),
    "folder": _folder,
}
