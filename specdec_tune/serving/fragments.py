"""Each engine's speculative settings for one measured config (the flag set's names, checked by
flagcheck), and the round-2 fragment that `export --format flags` prints byte for byte as before.
Plain data in, data out, no torch.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from ..domain import Config, Result
from ..store.schema import Profile
from .flagsets import FlagSet
from .llamacpp_args import llamacpp_args
from .schedule import LAST_BATCH

__all__ = ["EXPORTERS", "fragment_batch_notes", "lookup_notes", "num", "render_fragment"]


HF_BATCH_NOTE = (
    "HF's assisted generation runs one sequence per generate() call (batch size 1), so the batch "
    "table's B = 1 row is what applies"
)


def render_fragment(engine: str, settings: Any) -> str:
    """The round-2 output (`--format flags`): JSON for HF and TensorRT-LLM, the speculative config and
    its `vllm serve` flag for vLLM, shell-quoted flags otherwise."""
    if engine in ("hf", "trtllm"):
        return json.dumps(settings, indent=2)
    if engine == "vllm":
        compact = json.dumps(settings)
        # line 1 for LLM(speculative_config=...), line 2 for `vllm serve`
        return f"{compact}\n--speculative-config {shlex.quote(compact)}"
    return shlex.join(settings)


def num(x: float) -> float:
    """Thresholds as people write them: 0.3, not 0.30000000000000004."""
    return round(x, 4)


def _flag_num(x: float) -> str:
    return f"{num(x):g}"


def lookup_notes(engine: str, display: str, cfg: Config, match: str | None) -> list[str]:
    d = cfg.draft
    measured = d.lookup_match or "latest"
    if match is None or measured == match:
        return []
    return [
        f"prompt lookup was measured continuing the {measured} earlier match of the n-gram; {display} "
        f"continues the {match}, so its acceptance can differ (`specdec-tune run --for {engine}` "
        "measures its policy)"
    ]


# -------------------------------------------------------------------------------------- engines


def _hf(p: Profile, cfg: Config, fs: FlagSet, path: str) -> tuple[dict[str, Any], list[str]]:
    d = cfg.draft
    notes: list[str] = []
    sampling: dict[str, Any] = {"do_sample": p.workload.temperature > 0}
    if p.workload.temperature > 0:
        sampling["temperature"] = p.workload.temperature
    if d.kind == "model":
        # transformers reads these three from the assistant's own generation_config, not from
        # generate() kwargs; its default threshold is 0.4, so 0 must be written out to disable it
        out = {
            "generate_kwargs": {"assistant_model": path, **sampling},
            "assistant_model.generation_config": _hf_assistant_fields(cfg),
        }
        return out, _hf_threshold_note(cfg) + _hf_schedule_note(cfg)
    if d.kind == "prompt_lookup":
        kwargs = {"prompt_lookup_num_tokens": cfg.gamma, "max_matching_ngram_size": d.ngram_max, **sampling}
        if d.ngram_min is not None and d.ngram_min > 1:
            notes.append(
                f"HF prompt lookup: max_matching_ngram_size = ngram_max ({d.ngram_max}); HF always falls "
                f"back to n-grams down to 1, so ngram_min={d.ngram_min} has no equivalent"
            )
        notes += lookup_notes("hf", "HF", cfg, "earliest")
        return {"generate_kwargs": kwargs}, notes
    # layer_skip: the early-exit drafter is the target itself, so its generation_config holds the knobs
    out = {
        "generate_kwargs": {"assistant_early_exit": d.layers, **sampling},
        "model.generation_config": _hf_assistant_fields(cfg),
    }
    return out, _hf_threshold_note(cfg) + _hf_schedule_note(cfg)


def _hf_assistant_fields(cfg: Config) -> dict[str, Any]:
    return {
        "num_assistant_tokens": cfg.gamma,
        "num_assistant_tokens_schedule": "heuristic" if cfg.gamma_policy == "heuristic" else "constant",
        "assistant_confidence_threshold": num(cfg.threshold),
    }


def _hf_schedule_note(cfg: Config) -> list[str]:
    if cfg.gamma_policy != "heuristic":
        return []
    return [
        f"HF's heuristic schedule starts at num_assistant_tokens={cfg.gamma} and grows without bound "
        f"(+2 after a fully accepted step); it was measured here capped at γ={cfg.gamma}"
    ]


def _hf_threshold_note(cfg: Config) -> list[str]:
    if cfg.threshold <= 0:
        return []
    return [
        "HF adapts assistant_confidence_threshold during generation when scikit-learn is installed; "
        f"the tuned t={_flag_num(cfg.threshold)} is then only its starting value"
    ]


def _vllm(p: Profile, cfg: Config, fs: FlagSet, path: str) -> tuple[dict[str, Any], list[str]]:
    d = cfg.draft
    if d.kind == "model":
        return {"method": "draft_model", "model": path, "num_speculative_tokens": cfg.gamma}, []
    out = {
        "method": "ngram",
        "num_speculative_tokens": cfg.gamma,
        "prompt_lookup_max": d.ngram_max,
        "prompt_lookup_min": d.ngram_min,
    }
    return out, lookup_notes("vllm", "vLLM", cfg, "earliest")


def _llamacpp(p: Profile, cfg: Config, fs: FlagSet, path: str) -> tuple[list[str], list[str]]:
    args, notes = llamacpp_args(cfg, fs, path, clamp_n_max=False)
    if cfg.draft.kind != "model":
        notes = lookup_notes("llamacpp", "llama.cpp", cfg, "latest") + notes
    return args, notes


def _sglang(p: Profile, cfg: Config, fs: FlagSet, path: str) -> tuple[list[str], list[str]]:
    # only draft models reach here (capabilities.blockers); SGLang counts the last verified token as
    # the root of the draft tree, so a chain of gamma drafts is gamma + 1 draft tokens
    args = [
        "--speculative-algorithm", "STANDALONE",
        "--speculative-draft-model-path", path,
        "--speculative-num-steps", str(cfg.gamma),
        "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", str(cfg.gamma + 1),
    ]  # fmt: skip
    return args, []


def _trtllm(p: Profile, cfg: Config, fs: FlagSet, path: str) -> tuple[dict[str, Any], list[str]]:
    d = cfg.draft
    if d.kind == "model":
        spec = {"decoding_type": "Draft_Target", "max_draft_len": cfg.gamma, "speculative_model": path}
        return {"speculative_config": spec}, []
    # NGram: n = max..1 like HF; is_use_oldest picks the earliest (True) or latest match, so the
    # measured policy is written; a pool per request, as our prompt lookup searches its own text
    spec = {
        "decoding_type": "NGram",
        "max_draft_len": cfg.gamma,
        "max_matching_ngram_size": d.ngram_max,
        "is_use_oldest": (d.lookup_match or "latest") == "earliest",
        "is_public_pool": False,
    }
    notes = []
    if d.ngram_min is not None and d.ngram_min > 1:
        notes.append(
            f"TensorRT-LLM's NGram tries n = max_matching_ngram_size ({d.ngram_max}) down to 1, so "
            f"ngram_min={d.ngram_min} has no equivalent"
        )
    return {"speculative_config": spec}, notes


EXPORTERS = {"hf": _hf, "vllm": _vllm, "llamacpp": _llamacpp, "sglang": _sglang, "trtllm": _trtllm}


def fragment_batch_notes(profile: Profile, engine: str, chosen: Result, settings: Any) -> list[str]:
    """The round-2 mapping of the batch table, kept for `--format flags` (whose output stays as it
    was): notes for the engines without a schedule; for vLLM the raw table as
    `num_speculative_tokens_per_batch_size` (row i's γ from its batch size up to the next row's).
    """
    rows = sorted(profile.batch_table, key=lambda r: r.batch_size)
    name = chosen.config.draft.name
    b_star = profile.b_star
    if engine == "hf":
        return [HF_BATCH_NOTE + (f"; here speculation stopped paying at B* = {b_star}" if b_star else "")]
    if engine != "vllm":
        where = {
            "sglang": "SGLang has no batch-size switch for speculation; cap concurrency with "
            "--max-running-requests",
            "llamacpp": "llama.cpp has no batch-size switch for speculation; cap the parallel slots (-np)",
        }[engine]
        if b_star:
            return [f"speculation stopped paying at batch size B* = {b_star} here: {where} below it"]
        return [f"{where}; the batch table measured speculation winning up to B = {rows[-1].batch_size}"]
    notes = []
    schedule = []
    for i, row in enumerate(rows):
        start = 1 if i == 0 else row.batch_size
        end = rows[i + 1].batch_size - 1 if i + 1 < len(rows) else LAST_BATCH
        best = row.best.config
        if best.gamma == 0:
            k = 0
        elif best.draft.name == name:
            k = best.gamma
        else:
            own = next((r for r in row.per_draft if r.config.draft.name == name), None)
            k = own.config.gamma if own else chosen.config.gamma
            notes.append(
                f"at batch size {row.batch_size} the best was {best.label}; vLLM runs one draft, so "
                f"{name} γ={k} is scheduled there" + ("" if own else " (not measured at that batch size)")
            )
        schedule.append([start, end, k])
    settings["num_speculative_tokens_per_batch_size"] = schedule
    settings["num_speculative_tokens"] = max(settings["num_speculative_tokens"], *(k for _, _, k in schedule))
    if any(k == 0 for _, _, k in schedule):
        notes.append(
            f"K = 0 from B* = {b_star} on: vLLM accepts it (dynamic/utils.py); that it switches drafting off "
            "entirely at run time was not verified; vLLM ignores the schedule with data parallelism > 1"
        )
    return notes
