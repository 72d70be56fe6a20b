"""Translate a profile's best config into one serving engine's settings (HF, vLLM, llama.cpp, SGLang).

Only settings the engine really has are emitted; whatever has no equivalent there becomes a warning
string, never an invented flag. Plain data in, text out, no torch.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from ..domain import Config
from ..errors import SpecDecError
from ..store.schema import Profile

ENGINES = ("hf", "vllm", "llamacpp", "sglang")

NO_SPECULATION = "profile says: do not speculate (plain decoding was fastest on this hardware)"


def export_settings(profile: Profile, to: str) -> tuple[Any, list[str]]:
    """The best config as `to`'s settings, structured (a dict, an argv list, or None) plus warnings.

    For `--json` output; `export_profile` renders the same settings as text.
    """
    engine = to.strip().lower()
    if engine not in _EXPORTERS:
        raise SpecDecError(f"unknown export target {to!r}: choose one of {', '.join(ENGINES)}")
    return _EXPORTERS[engine](profile)


def export_profile(profile: Profile, to: str) -> tuple[str, list[str]]:
    """The best config as text for `to` in hf|vllm|llamacpp|sglang: (text for stdout, warnings)."""
    settings, warnings = export_settings(profile, to)
    engine = to.strip().lower()
    if engine == "hf":
        return json.dumps(settings, indent=2), warnings
    if engine == "vllm":
        if settings is None:
            return "", warnings
        compact = json.dumps(settings)
        # line 1 for LLM(speculative_config=...), line 2 for `vllm serve`
        return f"{compact}\n--speculative-config {shlex.quote(compact)}", warnings
    return shlex.join(settings), warnings


def _no_layer_skip(engine: str, draft: str) -> str:
    return (
        f"{engine} has no layer-skip self-speculation (best draft '{draft}'): nothing to export; "
        "use a draft-model or n-gram alternative from the profile"
    )


def _num(x: float) -> float:
    """Thresholds as people write them: 0.3, not 0.30000000000000004."""
    return round(x, 4)


def _flag_num(x: float) -> str:
    return f"{_num(x):g}"


def _hf(p: Profile) -> tuple[dict[str, Any], list[str]]:
    cfg = p.best.config
    d = cfg.draft
    warnings: list[str] = []
    sampling: dict[str, Any] = {"do_sample": p.workload.temperature > 0}
    if p.workload.temperature > 0:
        sampling["temperature"] = p.workload.temperature
    if d.kind == "none":
        return {}, [NO_SPECULATION]
    if d.kind == "model":
        # transformers reads these three from the assistant's own generation_config, not from
        # generate() kwargs; its default threshold is 0.4, so 0 must be written out to disable it
        out = {
            "generate_kwargs": {"assistant_model": d.path, **sampling},
            "assistant_model.generation_config": _hf_assistant_fields(cfg),
        }
        warnings += _hf_threshold_note(cfg)
        return out, warnings
    if d.kind == "prompt_lookup":
        kwargs = {
            "prompt_lookup_num_tokens": cfg.gamma,
            "max_matching_ngram_size": d.ngram_max,
            **sampling,
        }
        if d.ngram_min is not None and d.ngram_min > 1:
            warnings.append(
                f"HF prompt lookup: max_matching_ngram_size = ngram_max ({d.ngram_max}); HF always falls "
                f"back to n-grams down to 1, so ngram_min={d.ngram_min} has no equivalent"
            )
        if cfg.threshold > 0:
            warnings.append(
                f"HF prompt lookup has no confidence threshold: t={_flag_num(cfg.threshold)} dropped"
            )
        return {"generate_kwargs": kwargs}, warnings
    # layer_skip: the early-exit drafter is the target itself, so its generation_config holds the knobs
    out = {
        "generate_kwargs": {"assistant_early_exit": d.layers, **sampling},
        "model.generation_config": _hf_assistant_fields(cfg),
    }
    warnings += _hf_threshold_note(cfg)
    return out, warnings


def _hf_assistant_fields(cfg: Config) -> dict[str, Any]:
    return {
        "num_assistant_tokens": cfg.gamma,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": _num(cfg.threshold),
    }


def _hf_threshold_note(cfg: Config) -> list[str]:
    if cfg.threshold <= 0:
        return []
    return [
        "HF adapts assistant_confidence_threshold during generation when scikit-learn is installed; "
        f"the tuned t={_flag_num(cfg.threshold)} is then only its starting value"
    ]


def _vllm(p: Profile) -> tuple[dict[str, Any] | None, list[str]]:
    cfg = p.best.config
    d = cfg.draft
    warnings: list[str] = []
    if d.kind == "none":
        return None, [NO_SPECULATION]
    if d.kind == "layer_skip":
        return None, [_no_layer_skip("vLLM", d.name)]
    if d.kind == "model":
        out = {"method": "draft_model", "model": d.path, "num_speculative_tokens": cfg.gamma}
    else:
        out = {
            "method": "ngram",
            "num_speculative_tokens": cfg.gamma,
            "prompt_lookup_max": d.ngram_max,
            "prompt_lookup_min": d.ngram_min,
        }
    if cfg.threshold > 0:
        warnings.append(
            f"vLLM has no draft confidence threshold: t={_flag_num(cfg.threshold)} dropped, "
            f"the draft always proposes {cfg.gamma} tokens"
        )
    return out, warnings


def _llamacpp(p: Profile) -> tuple[list[str], list[str]]:
    cfg = p.best.config
    d = cfg.draft
    if d.kind == "none":
        return [], [NO_SPECULATION]
    if d.kind == "layer_skip":
        return [], [_no_layer_skip("llama.cpp", d.name)]
    if d.kind == "model":
        warnings = []
        if not str(d.path).endswith(".gguf"):
            warnings.append(
                f"llama.cpp loads GGUF files: convert the draft ({d.path}) with convert_hf_to_gguf.py "
                "and pass the .gguf path to -md"
            )
        # --draft-p-min is llama.cpp's confidence early stop; its default is not 0, so always write it
        args = [
            "-md", str(d.path),
            "--draft-max", str(cfg.gamma),
            "--draft-min", "0",
            "--draft-p-min", _flag_num(cfg.threshold),
        ]  # fmt: skip
        return args, warnings
    warnings = [
        f"llama.cpp's ngram-simple matches one n-gram length (--spec-ngram-size-n = ngram_max "
        f"{d.ngram_max}) and does not fall back to shorter ones down to ngram_min {d.ngram_min}",
        "--spec-type needs a recent llama-server; older builds only have lookup decoding in the "
        "separate llama-lookup example",
    ]
    if cfg.threshold > 0:
        warnings.append(
            f"llama.cpp n-gram drafting has no confidence threshold: t={_flag_num(cfg.threshold)} dropped"
        )
    args = [
        "--spec-type", "ngram-simple",
        "--spec-ngram-size-n", str(d.ngram_max),
        "--spec-ngram-size-m", str(cfg.gamma),
        "--draft-max", str(cfg.gamma),
    ]  # fmt: skip
    return args, warnings


def _sglang(p: Profile) -> tuple[list[str], list[str]]:
    cfg = p.best.config
    d = cfg.draft
    warnings: list[str] = []
    if d.kind == "none":
        return [], [NO_SPECULATION]
    if d.kind == "layer_skip":
        return [], [_no_layer_skip("SGLang", d.name)]
    # SGLang counts the last verified token as the root of the draft tree, hence gamma + 1
    if d.kind == "model":
        args = [
            "--speculative-algorithm", "STANDALONE",
            "--speculative-draft-model-path", str(d.path),
            "--speculative-num-steps", str(cfg.gamma),
            "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", str(cfg.gamma + 1),
        ]  # fmt: skip
        if cfg.threshold > 0:
            warnings.append(
                f"SGLang has no draft confidence early stop: t={_flag_num(cfg.threshold)} dropped "
                "(--speculative-accept-threshold-* relax verification instead; do not use them for this)"
            )
        return args, warnings
    args = [
        "--speculative-algorithm", "NGRAM",
        "--speculative-num-draft-tokens", str(cfg.gamma + 1),
        "--speculative-ngram-min-match-window-size", str(d.ngram_min),
        "--speculative-ngram-max-match-window-size", str(d.ngram_max),
        "--speculative-ngram-max-bfs-breadth", "1",
    ]  # fmt: skip
    warnings.append(
        "SGLang's NGRAM drafts from a token cache shared across requests and runs on CUDA only; "
        "its acceptance can differ from the per-prompt lookup measured here"
    )
    if cfg.threshold > 0:
        warnings.append(f"SGLang NGRAM has no confidence threshold: t={_flag_num(cfg.threshold)} dropped")
    return args, warnings


_EXPORTERS = {"hf": _hf, "vllm": _vllm, "llamacpp": _llamacpp, "sglang": _sglang}
