"""GGUF files for llama.cpp: cut the first K blocks out of a GGUF (llama.cpp's `layer-skip:K` draft)
and write the shipped demo models as F32/F16 Llama GGUFs with their tokenizer, cached once per weights.

Pure functions over the `gguf` package (imported lazily); every write is atomic.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...atomic import atomic_path
from ...errors import SpecDecError
from ...paths import cache_dir
from .loading import content_hash, demo_path, file_sha256

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

# Which shipped model each demo GGUF holds; "draft" is the default bench draft.
DEMO_GGUFS = {"target": "demo", "draft": "draft-1l", "draft-1l": "draft-1l", "draft-2l": "draft-2l"}
DEMO_FILES = {"target": "demo-target.gguf", "draft": "demo-draft.gguf"}
# The demo tokenizer pre-tokenizes with the GPT-2 regex (ByteLevel, use_regex=true): llama.cpp's "gpt-2".
DEMO_PRE_TOKENIZER = "gpt-2"
# Bump when demo_to_gguf writes different bytes for the same weights: it invalidates the cache.
CONVERTER_VERSION = "1"
FTYPES = ("f32", "f16")
_BLOCK = re.compile(r"^blk\.(\d+)\.")


def _gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise SpecDecError("GGUF files need the `gguf` package: pip install gguf") from None
    return gguf


def _read(src: Path) -> Any:
    if not src.is_file():
        raise SpecDecError(f"GGUF file {src} does not exist; pass the path of a .gguf file")
    try:
        return _gguf().GGUFReader(src, "r")
    except (ValueError, OSError) as exc:
        raise SpecDecError(f"{src} is not a readable GGUF file ({exc})") from None


def gguf_block_count(src: Path) -> int:
    """`<arch>.block_count` of a GGUF file."""
    return _block_count(_read(src), src)[1]


def _block_count(reader: Any, src: Path) -> tuple[str, int]:
    arch_field = reader.get_field("general.architecture")
    if arch_field is None:
        raise SpecDecError(f"{src} has no general.architecture: it is not a model GGUF")
    arch = str(arch_field.contents())
    field = reader.get_field(f"{arch}.block_count")
    if field is None:
        raise SpecDecError(f"{src} has no {arch}.block_count: it is not a transformer-block model")
    return arch, int(field.contents())


def cut_layers(src: Path, dst: Path, layers: int) -> Path:
    """Write `dst`: the first `layers` blocks of the GGUF `src` plus every tensor outside the blocks
    (token embedding, output norm, output head when there is one), all metadata copied and
    `<arch>.block_count` set to `layers`. Tensors are copied raw: quantised ones keep type and shape."""
    gguf = _gguf()
    src, dst = Path(src), Path(dst)
    reader = _read(src)
    arch, total = _block_count(reader, src)
    if not 1 <= layers < total:
        raise SpecDecError(
            f"--layers must be between 1 and {total - 1} ({src.name} has {total} blocks), got {layers}"
        )
    if src.resolve() == dst.resolve():
        raise SpecDecError(f"the output {dst} is the input; write the cut model to another file")
    kept = [t for t in reader.tensors if (m := _BLOCK.match(t.name)) is None or int(m.group(1)) < layers]
    with atomic_path(dst) as tmp:
        writer = gguf.GGUFWriter(tmp, arch, endianess=reader.endianess)
        writer.data_alignment = reader.alignment
        for field in reader.fields.values():
            # GGUF.* are the header's virtual fields; the writer writes general.architecture itself.
            if field.name.startswith("GGUF.") or field.name == "general.architecture":
                continue
            vtype = field.types[0]
            sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            value = field.contents()
            if field.name == f"{arch}.block_count":
                value = layers
            elif field.name.startswith(f"{arch}.") and isinstance(value, list) and len(value) == total:
                value = value[:layers]  # a per-layer array (head counts, window sizes, ...)
            writer.add_key_value(field.name, value, vtype, sub_type=sub_type)
        for t in kept:
            writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t in kept:
            writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
        writer.close()
    return dst


def _permute_rope(w: torch.Tensor, n_head: int) -> torch.Tensor:
    # HF rotates the two halves of each head; llama.cpp's Llama rotates interleaved pairs.
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _vocab(tokenizer: PreTrainedTokenizerBase, vocab_size: int) -> tuple[list[str], list[int]]:
    """Token strings and types, id by id, as llama.cpp's convert_hf_to_gguf.py writes a BPE vocab."""
    gguf = _gguf()
    by_id = {i: tok for tok, i in tokenizer.get_vocab().items()}
    added = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.NORMAL)
    return tokens, types


def hf_llama_to_gguf(folder: Path, dst: Path, name: str, ftype: str = "f32") -> Path:
    """Write a Llama transformers folder with a byte-level BPE tokenizer (GPT-2 pre-tokenizer) as a
    GGUF llama.cpp loads. 2-D weights in `ftype` (f32 or f16); norms stay f32."""
    if ftype not in FTYPES:
        raise SpecDecError(f"unknown GGUF type '{ftype}': use f32 or f16")
    gguf = _gguf()
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, local_files_only=True)
    cfg = model.config
    if cfg.model_type != "llama":
        raise SpecDecError(f"{folder} is a '{cfg.model_type}' model; only Llama models convert here")
    n_head, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_head
    rope = getattr(cfg, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise SpecDecError(f"{folder} uses rope scaling '{rope['rope_type']}', which this converter lacks")
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    with atomic_path(Path(dst)) as tmp:
        w = gguf.GGUFWriter(tmp, "llama")
        w.add_name(name)
        w.add_file_type(gguf.LlamaFileType.ALL_F32 if ftype == "f32" else gguf.LlamaFileType.MOSTLY_F16)
        w.add_context_length(cfg.max_position_embeddings)
        w.add_embedding_length(cfg.hidden_size)
        w.add_block_count(cfg.num_hidden_layers)
        w.add_feed_forward_length(cfg.intermediate_size)
        w.add_head_count(n_head)
        w.add_head_count_kv(n_kv)
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_rope_dimension_count(head_dim)
        w.add_rope_freq_base(float(rope.get("rope_theta", 10000.0)))
        w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
        w.add_vocab_size(cfg.vocab_size)
        tokens, types = _vocab(tokenizer, cfg.vocab_size)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(DEMO_PRE_TOKENIZER)
        w.add_token_list(tokens)
        w.add_token_types(types)
        special = gguf.SpecialVocab(folder, load_merges=True, n_vocab=cfg.vocab_size)
        special.add_special_token.setdefault("bos", False)  # our loop encodes without special tokens
        special.add_special_token.setdefault("eos", False)
        special.add_to_gguf(w, quiet=True)
        for hf_name, tensor in model.state_dict().items():
            if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
                continue  # llama.cpp reads the head from token_embd when output.weight is absent
            gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
            if gguf_name is None:
                raise SpecDecError(f"{folder}: no GGUF name for tensor {hf_name}")
            data = tensor.detach().to(torch.float32).numpy()
            if hf_name.endswith("q_proj.weight"):
                data = _permute_rope(data, n_head)
            elif hf_name.endswith("k_proj.weight"):
                data = _permute_rope(data, n_kv)
            dtype = np.float16 if ftype == "f16" and data.ndim == 2 else np.float32
            w.add_tensor(gguf_name, np.ascontiguousarray(data.astype(dtype)))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return Path(dst)


def _demo_folder(which: str) -> Path:
    if which not in DEMO_GGUFS:
        raise SpecDecError(f"unknown demo model '{which}': use one of {', '.join(DEMO_GGUFS)}")
    return demo_path(DEMO_GGUFS[which])


def demo_to_gguf(which: str, dst: Path, ftype: str = "f32") -> Path:
    """Write a shipped demo model ("target" or "draft" = draft-1l; also "draft-2l") as a Llama GGUF."""
    return hf_llama_to_gguf(_demo_folder(which), Path(dst), f"specdec-tune demo {which}", ftype)


def demo_weights_key() -> str:
    """16 hex digits naming the demo GGUFs: the demo weights, tokenizer and converter version."""
    h = hashlib.sha256(f"converter {CONVERTER_VERSION}\n".encode())
    for which in DEMO_FILES:
        folder = _demo_folder(which)
        h.update(f"{which} {content_hash(folder)} {file_sha256(folder / 'tokenizer.json')}\n".encode())
    return h.hexdigest()[:16]


def gguf_cache_dir() -> Path:
    """The cache folder's `gguf/` (`paths.cache_dir`)."""
    return cache_dir() / "gguf"


def demo_gguf_paths(cache_dir: Path | None = None) -> dict[str, Path]:
    """{"target": ..., "draft": ...}: the demo GGUFs under `cache_dir/<weights key>/`, written on first
    use (default folder: `gguf_cache_dir()`). A later call with the same weights writes nothing."""
    folder = Path(cache_dir if cache_dir is not None else gguf_cache_dir()) / demo_weights_key()
    paths = {which: folder / fname for which, fname in DEMO_FILES.items()}
    for which, path in paths.items():
        if not path.is_file():
            demo_to_gguf(which, path)
    return paths
