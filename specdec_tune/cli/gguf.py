"""`specdec-tune gguf cut|demo`: GGUF files for the llama.cpp backend (a cut draft, the demo pair)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..app.ggufs import gguf_cut, gguf_demo
from .options import JsonOut
from .terminal import console, print_json, user_errors

gguf_app = typer.Typer(
    no_args_is_help=True, help="Write GGUF files for llama.cpp (a cut draft, the demo pair)."
)


def _render(files: list, json_out: bool) -> None:
    if json_out:
        print_json([f.as_dict() for f in files])
        return
    for f in files:
        blocks = f"{f.blocks} block" + ("s" if f.blocks != 1 else "")
        console().print(f"wrote {f.path}  ({f.model}, {blocks}, {f.size_bytes / 1e6:.1f} MB)", soft_wrap=True)


@gguf_app.command("cut")
def gguf_cut_cmd(
    src: Annotated[Path, typer.Argument(help="A GGUF model (e.g. a Llama target).")],
    layers: Annotated[int, typer.Option("--layers", "-k", help="Blocks to keep (1 .. blocks-1).")],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Output file (default: SRC-<K>l.gguf beside SRC).")
    ] = None,
    json_out: JsonOut = False,
) -> None:
    """Write the first K blocks of SRC plus its embedding, output norm and head: llama.cpp's
    equivalent of `--draft layer-skip:K` (pass it to llama-server as --model-draft)."""
    with user_errors():
        _render([gguf_cut(src, layers, out)], json_out)


@gguf_app.command("demo")
def gguf_demo_cmd(
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Folder for demo-target.gguf and demo-draft.gguf.")
    ],
    ftype: Annotated[str, typer.Option("--type", help="f32 (exact) or f16 for the weight matrices.")] = "f32",
    json_out: JsonOut = False,
) -> None:
    """Write the shipped demo target and draft (draft-1l) as Llama GGUFs llama.cpp loads."""
    with user_errors():
        _render(gguf_demo(out, ftype), json_out)
