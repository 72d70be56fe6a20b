"""The one mapping from a measured `Config` to llama-server's speculative-decoding arguments, per
flag set; or, for a profile measured by the llamacpp backend, the exact arguments that ran.

Both `export --to llamacpp` formats call `llamacpp_args`. A measuring backend that stores each
config's server flags hands them in as `measured`: they are then emitted as they are (after the
flag-set check), never rebuilt from the config.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..domain import Config
from ..measure.llamacpp.args import reads_draft_n_max
from .flagsets import FlagSet

__all__ = ["SPEC_FLAGS", "llamacpp_args", "measured_llamacpp_args"]

# The argv entries of a stored command line that are speculative-decoding settings (the rest, such
# as -m, --port, -np or the thread count, belong to how the measurement ran the server)
SPEC_FLAGS = ("--spec-", "-md", "--model-draft", "--draft")


def _num(x: float) -> str:
    return f"{round(x, 4):g}"


def llamacpp_args(
    config: Config,
    fs: FlagSet,
    draft_path: str,
    *,
    measured: Sequence[str] | None = None,
    clamp_n_max: bool = True,
) -> tuple[list[str], list[str]]:
    """(llama-server arguments, notes) that run `config` as measured under flag set `fs`.

    `measured`: the flags the llamacpp backend ran this config with; returned as they are.
    `clamp_n_max`: for b8955-b9463 (flag set b8955) also write --spec-draft-n-max = γ for n-gram
    drafting, as before: that their servers ignore it there was not read; False only for the round-2
    fragment kept byte-identical. The current set writes only flags its n-gram drafting reads
    (measure.llamacpp.args.reads_draft_n_max).
    """
    if measured is not None:
        notes = ["the flags are the ones the llamacpp backend measured this config with"]
        return list(measured), notes + _inert_n_max_note(measured)
    d = config.draft
    old = fs.version == "b8953"
    g = str(config.gamma)
    if d.kind == "model":
        notes = []
        if not draft_path.endswith(".gguf"):
            notes.append(
                f"llama.cpp loads GGUF files: convert the draft ({draft_path}) with convert_hf_to_gguf.py "
                "and pass the .gguf path instead"
            )
        # p-min's default was 0.75 before b9235 and is 0.0 since, so it is always written
        if old:
            return [
                "-md",
                draft_path,
                "--draft-max",
                g,
                "--draft-min",
                "0",
                "--draft-p-min",
                _num(config.threshold),
            ], notes
        # since b9464 a draft model does not enable drafting by itself: --spec-type draft-simple
        args = [] if fs.version == "b8955" else ["--spec-type", "draft-simple"]
        args += ["--spec-draft-model", draft_path, "--spec-draft-n-max", g]
        return [*args, "--spec-draft-n-min", "0", "--spec-draft-p-min", _num(config.threshold)], notes
    notes = []
    if d.ngram_min != d.ngram_max:
        notes.append(
            f"llama.cpp's ngram-simple matches one n-gram length (n = ngram_max {d.ngram_max}) and does "
            f"not fall back to shorter ones down to ngram_min {d.ngram_min}"
        )
    if old:
        args = ["--spec-type", "ngram-simple", "--spec-ngram-size-n", str(d.ngram_max)]
        return [*args, "--spec-ngram-size-m", g, "--draft-max", g], notes
    types = ["ngram-simple"]
    args = ["--spec-type", ",".join(types), "--spec-ngram-simple-size-n", str(d.ngram_max)]
    args += ["--spec-ngram-simple-size-m", g]
    # b8955's servers were not read on this: they keep the flag, as exported before
    n_max = clamp_n_max and (fs.version == "b8955" or reads_draft_n_max(types))
    return ([*args, "--spec-draft-n-max", g] if n_max else args), notes


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
    `stored` what the backend recorded beside the config (an argv list); anything else is None, so a
    profile measured in our own engine maps its config with `llamacpp_args`.
    """
    name = backend.get("name") if isinstance(backend, dict) else getattr(backend, "name", None)
    if name != "llamacpp" or not isinstance(stored, (list, tuple)):
        return None
    argv = [str(a) for a in stored]
    out: list[str] = []
    for i, a in enumerate(argv):
        if a.startswith(SPEC_FLAGS):
            out.append(a)
            if i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                out.append(argv[i + 1])
    return out
