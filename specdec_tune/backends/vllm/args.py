"""vLLM's drafts and flags: `--draft` strings for this engine, and the exact arguments of vLLM's
OpenAI server for a config. One place: the backend starts servers with them, the profile records
them and `export --to vllm` of a vLLM-measured profile emits them.

Read from vLLM 0.32.0's `vllm/config/speculative.py`: `--speculative-config` takes a JSON object;
`method: ngram` drafts `num_speculative_tokens` tokens after the longest match of
`prompt_lookup_min`..`prompt_lookup_max` tokens (either alone sets both); `method: draft_model`
runs `model` beside the target; `eagle`/`eagle3` run a head named by `model`; `suffix` needs the
arctic-inference package. `num_speculative_tokens_per_batch_size` is a list of inclusive
`[start, end, K]` ranges that must start at 1 (`vllm/v1/spec_decode/dynamic/utils.py`); K may be 0
(no speculation at that batch size) and never exceeds `num_speculative_tokens`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ...demo import DEMO_DRAFTS, demo_path
from ...domain import Config, DraftSpec
from ...errors import SpecDecError

# The drafts `run --backend vllm` searches unless told: vLLM's n-gram proposer at two match windows
# (its documented example is prompt_lookup_max 4, which sets min 4 too). Each draft's first trial is
# a server start (tens of seconds on a CPU), so the defaults are few; --draft adds others.
DEFAULT_DRAFTS = ("ngram:4", "ngram:2-4")
# The largest gamma searched unless told: an n-gram draft costs next to nothing per drafted token,
# and on a CPU the per-step overhead dominates, so long drafts can pay (the γ 5: 2.95x).
ENGINE_MAX_GAMMA = 8
# vLLM's documented example configs (docs/features/speculative_decoding): raced in the final
# round, so the answer is never below them. (draft, gamma) for an n-gram draft and a draft model.
EXAMPLE_NGRAM = ("ngram:4", 5)  # {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}
EXAMPLE_MODEL_GAMMA = 5  # {"method": "draft_model", "model": ..., "num_speculative_tokens": 5}
HEAD_METHODS = ("eagle", "eagle3")
DRAFT_HELP = (
    "vLLM drafts: ngram[:N] or ngram:MIN-MAX (prompt lookup), a draft model folder (or a demo draft), "
    "eagle:FOLDER / eagle3:FOLDER (a trained head), suffix (needs arctic-inference in vLLM's environment)"
)
_NGRAM = re.compile(r"^ngram(?::(\d+)(?:-(\d+))?)?$")
_HEAD = re.compile(r"^(eagle3?):(.+)$")


def parse_vllm_draft(text: str) -> DraftSpec:
    """A `--draft` value for the vLLM backend -> DraftSpec.

    `ngram:2-4` -> kind prompt_lookup, ngram 2..4; `ngram:4` -> 4..4 (as vLLM reads
    prompt_lookup_max alone); `draft-1l` or a folder -> kind model at that folder; `eagle3:DIR`
    -> kind model named `eagle3:DIR-NAME` (vLLM's method comes from the name's prefix)."""
    text = str(text).strip()
    m = _NGRAM.match(text)
    if m:
        lo = int(m.group(1) or 4)
        hi = int(m.group(2) or lo)
        if not 1 <= lo <= hi <= 32:
            raise SpecDecError(f"--draft {text}: an n-gram window MIN-MAX needs 1 <= MIN <= MAX <= 32")
        name = f"ngram:{lo}" if lo == hi else f"ngram:{lo}-{hi}"
        # vLLM takes the earliest occurrence of the matched n-gram (serving.capabilities)
        return DraftSpec(name=name, kind="prompt_lookup", ngram_min=lo, ngram_max=hi, lookup_match="earliest")
    if text == "suffix":
        raise SpecDecError(
            "suffix decoding needs the arctic-inference package in vLLM's environment, and no wheel of a "
            "current version installs here: drop --draft suffix"
        )
    m = _HEAD.match(text)
    if m:
        folder = _folder(m.group(2), text)
        return DraftSpec(name=f"{m.group(1)}:{folder.name}", kind="model", path=str(folder))
    if text in DEMO_DRAFTS:
        return DraftSpec(name=text, kind="model", path=str(demo_path(text)))
    folder = _folder(text, text)
    return DraftSpec(name=folder.name, kind="model", path=str(folder))


def _folder(path: str, given: str) -> Path:
    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file():
        raise SpecDecError(f"--draft {given}: not a model folder with a config.json. {DRAFT_HELP}")
    return folder.resolve()


def method_of(draft: DraftSpec) -> str:
    """vLLM's `method` for a draft."""
    if draft.kind == "prompt_lookup":
        return "ngram"
    head = draft.name.split(":", 1)[0]
    return head if head in HEAD_METHODS else "draft_model"


def speculative_config(
    config: Config, schedule: list[list[int]] | None = None, synthetic: list[float] | None = None
) -> dict[str, object] | None:
    """vLLM's `--speculative-config` for `config` (None: plain decoding). `schedule`: its
    `num_speculative_tokens_per_batch_size` tiers (`config.gamma` is then their largest K);
    `synthetic`: per-position acceptance for vLLM's synthetic rejection sampler (cost passes)."""
    d = config.draft
    if d.kind == "none" or config.gamma <= 0:
        return None
    if d.kind not in ("prompt_lookup", "model"):
        raise SpecDecError(f"vLLM has no draft of kind {d.kind} ({d.name}). {DRAFT_HELP}")
    spec: dict[str, object] = {"method": method_of(d), "num_speculative_tokens": config.gamma}
    if d.kind == "prompt_lookup":
        spec["prompt_lookup_min"] = d.ngram_min
        spec["prompt_lookup_max"] = d.ngram_max
    else:
        spec["model"] = d.path
    if schedule:
        spec["num_speculative_tokens_per_batch_size"] = [list(t) for t in schedule]
    if synthetic is not None:
        spec["rejection_sample_method"] = "synthetic"
        spec["synthetic_acceptance_rates"] = list(synthetic)
    return spec


def config_args(config: Config, schedule: list[list[int]] | None = None) -> list[str]:
    """The flags that make a server run `config` (nothing for plain decoding)."""
    spec = speculative_config(config, schedule)
    return [] if spec is None else ["--speculative-config", json.dumps(spec, separators=(",", ":"))]


def server_args(
    target: str,
    config: Config | None,
    *,
    max_model_len: int,
    seed: int = 0,
    dtype: str | None = None,
    extra: list[str] | None = None,
    schedule: list[list[int]] | None = None,
) -> list[str]:
    """Everything after `python -m vllm.entrypoints.openai.api_server` but host and port, and but the
    measurement's own memory share (`measure_only_args`): the deployed command of `config`. The
    user's `extra` engine arguments (e.g. --tensor-parallel-size 2) pass through as given."""
    args = ["--model", target, "--max-model-len", str(max_model_len), "--seed", str(seed)]
    if dtype and dtype != "auto":
        args += ["--dtype", dtype]
    args += list(extra or [])
    if config is not None:
        args += config_args(config, schedule)
    return args


def measure_only_args(memory_share: float | None) -> list[str]:
    """Flags a measurement adds that a deployment would not: the share of memory each of the
    servers alive side by side may take (a deployment runs one server)."""
    return [] if memory_share is None else ["--gpu-memory-utilization", f"{memory_share:.3f}"]
