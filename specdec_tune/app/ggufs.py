"""The GGUF use cases: `gguf_cut` (the first K blocks of a GGUF, llama.cpp's layer-skip draft) and
`gguf_demo` (the shipped demo pair as GGUFs for llama.cpp). Each returns what it wrote."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..runtime.models.ggufs import DEMO_FILES, DEMO_GGUFS, cut_layers, demo_to_gguf, gguf_block_count


@dataclass
class GgufFile:
    """One GGUF written: where, which model, how many blocks, how big."""

    path: str
    model: str
    blocks: int
    size_bytes: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _described(path: Path, model: str) -> GgufFile:
    return GgufFile(str(path), model, gguf_block_count(path), path.stat().st_size)


def gguf_cut(src: Path, layers: int, out: Path | None = None) -> GgufFile:
    """Write the first `layers` blocks of `src` to `out` (default: `<stem>-<layers>l.gguf` beside it)."""
    src = Path(src)
    dst = Path(out) if out is not None else src.with_name(f"{src.stem}-{layers}l.gguf")
    return _described(cut_layers(src, dst, layers), f"{src.name} cut to {layers} blocks")


def gguf_demo(out_dir: Path, ftype: str = "f32") -> list[GgufFile]:
    """Write demo-target.gguf and demo-draft.gguf (draft-1l) into `out_dir`."""
    written = []
    for which, filename in DEMO_FILES.items():
        path = demo_to_gguf(which, Path(out_dir) / filename, ftype)
        written.append(_described(path, DEMO_GGUFS[which]))
    return written
