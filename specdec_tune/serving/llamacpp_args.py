"""`export --to llamacpp`'s llama-server arguments of a measured `Config`: exactly the flags the
llamacpp backend starts its measured server with (`measure.llamacpp.args.spec_args`, the one mapping:
an exported config is one that ran), renamed for an older build's flag set where one is asked for;
or, for a profile measured by the llamacpp backend, the stored arguments that ran.

Both `export --to llamacpp` formats call `llamacpp_args`. A measuring backend that stores each
config's server flags hands them in as `measured`: they are then emitted as they are (after the
flag-set check), never rebuilt from the config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..domain import Config
from ..errors import SpecDecError
from ..measure.llamacpp.args import reads_draft_n_max, spec_args
from .flagcheck import problems
from .flagsets import FlagSet

__all__ = ["SPEC_FLAGS", "llamacpp_args", "measured_llamacpp_args"]

# The argv entries of a stored command line that are speculative-decoding settings (the rest, such
# as -m, --port, -np or the thread count, belong to how the measurement ran the server)
SPEC_FLAGS = ("--spec-", "-md", "--model-draft", "--draft")
# Builds up to b8954 (flag set b8953) name the flags of the current set so (renamed in 14e733e3)
B8953_NAMES = {
    "--spec-draft-model": "-md",
    "--spec-draft-n-max": "--draft-max",
    "--spec-draft-n-min": "--draft-min",
    "--spec-draft-p-min": "--draft-p-min",
    "--spec-ngram-simple-size-n": "--spec-ngram-size-n",
    "--spec-ngram-simple-size-m": "--spec-ngram-size-m",
}


def llamacpp_args(
    config: Config,
    fs: FlagSet,
    draft_path: str,
    *,
    measured: Sequence[str] | None = None,
    clamp_n_max: bool = True,
) -> tuple[list[str], list[str]]:
    """(llama-server arguments, notes) that run `config` as measured under flag set `fs`.

    `measured`: the flags the llamacpp backend ran this config with; returned as they are. Otherwise
    the flags its measured server is started with (`spec_args`), `draft_path` as the draft GGUF,
    in `fs`'s names (`for_build`). `clamp_n_max`: for b8955-b9463 also write --spec-draft-n-max = γ
    for n-gram drafting, as before: that their servers ignore it there was not read; False only for
    the round-2 fragment kept byte-identical.
    """
    if measured is not None:
        notes = ["the flags are the ones the llamacpp backend measured this config with"]
        return list(measured), notes + _inert_n_max_note(measured)
    d = config.draft
    notes = []
    if d.kind == "model" and not draft_path.endswith(".gguf"):
        notes.append(
            f"llama.cpp loads GGUF files: convert the draft ({draft_path}) with convert_hf_to_gguf.py "
            "and pass the .gguf path instead"
        )
    if d.kind == "prompt_lookup" and d.ngram_min != d.ngram_max:
        notes.append(
            f"llama.cpp's ngram-simple matches one n-gram length (n = ngram_max {d.ngram_max}) and does "
            f"not fall back to shorter ones down to ngram_min {d.ngram_min}"
        )
        config = dataclasses.replace(config, draft=dataclasses.replace(d, ngram_min=d.ngram_max))
    argv = for_build(spec_args(config, draft_path or None), fs, clamp_n_max)
    bad = problems(fs, argv)
    if bad:
        raise SpecDecError(
            f"llama.cpp builds of flag set {fs.version} cannot run {config.label} as measured "
            f"({bad[0]}): export for a newer build (--engine-version)"
        )
    return argv, notes


def for_build(argv: Sequence[str], fs: FlagSet, clamp_n_max: bool = True) -> list[str]:
    """The current set's speculative flags `argv` (spec_args) in flag set `fs`'s names.

    Before b9464 a draft model enables drafting by itself and `draft-simple` is no spec type;
    b8955-b9463 also get --spec-draft-n-max = γ for n-gram drafting with `clamp_n_max` (as exported
    before: whether their n-gram drafting reads it was not read); builds up to b8954 name the flags
    as before the rename (B8953_NAMES) and always take --draft-max = γ for n-gram drafting.
    """
    if fs.version not in ("b8955", "b8953"):
        return list(argv)
    pairs = list(zip(argv[::2], argv[1::2], strict=True))
    values = dict(pairs)
    types = [t for t in values.get("--spec-type", "").split(",") if t and t != "draft-simple"]
    out: list[str] = []
    for flag, value in pairs:
        if flag == "--spec-type":
            out += [flag, ",".join(types)] if types else []
        else:
            out += [B8953_NAMES.get(flag, flag) if fs.version == "b8953" else flag, value]
    size_m = values.get("--spec-ngram-simple-size-m")
    if size_m is not None and "--spec-draft-n-max" not in values and (clamp_n_max or fs.version == "b8953"):
        out += ["--draft-max" if fs.version == "b8953" else "--spec-draft-n-max", size_m]
    return out


def _inert_n_max_note(argv: Sequence[str]) -> list[str]:
    """Why a stored --spec-draft-n-max that none of the stored spec types reads is still emitted."""
    argv = list(argv)
    if "--spec-draft-n-max" not in argv or "--spec-type" not in argv[:-1]:
        return []
    types = argv[argv.index("--spec-type") + 1].split(",")
    if reads_draft_n_max(types):
        return []
    return [
        f"--spec-draft-n-max is kept as the server ran with it, though {','.join(types)} does not "
        "read it: its draft length is --spec-ngram-simple-size-m (ngram-simple) or "
        "--spec-ngram-mod-n-max (ngram-mod)"
    ]


def measured_llamacpp_args(backend: object, stored: object) -> list[str] | None:
    """The speculative flags a llamacpp-backend profile stored for one config, or None.

    `backend` is the profile's top-level `backend` mapping ({name: llamacpp, build: {...}}) and
    `stored` what the backend recorded beside the config (an argv list); anything else, or nothing
    stored (a config the backend recorded no flags for), is None, so the config is mapped with
    `llamacpp_args` as its measured server was started.
    """
    name = backend.get("name") if isinstance(backend, dict) else getattr(backend, "name", None)
    if name != "llamacpp" or not isinstance(stored, (list, tuple)) or not stored:
        return None
    argv = [str(a) for a in stored]
    out: list[str] = []
    for i, a in enumerate(argv):
        if a.startswith(SPEC_FLAGS):
            out.append(a)
            if i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                out.append(argv[i + 1])
    return out
