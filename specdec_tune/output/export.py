"""Translate a profile into one serving engine's settings (HF, vLLM, llama.cpp, SGLang), per engine
version, exporting only a config the engine runs the way it was measured.

When the best config cannot run there as measured (engines.blockers), the best measured
alternative that can is exported instead and the warnings say which, at what measured speedup, and
what was lost. When nothing in the profile can, nothing is exported (the CLI exits 5). Every emitted
option is checked against the engine version's flag set (flagsets), so a renamed flag is a bug
here, never a server that refuses to start. Plain data in, text out, no torch.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..domain import Config, Result
from ..engines import ENGINES, blockers, engine_info
from ..store.schema import Profile
from .flagsets import FlagSet, flagset, problems

__all__ = ["ENGINES", "NO_SPECULATION", "Export", "export", "export_profile", "export_settings"]

NO_SPECULATION = "profile says: do not speculate (plain decoding was fastest on this hardware)"


@dataclass
class Export:
    engine: str
    version: str
    source: str  # where the flag set was read from
    settings: Any  # a dict (hf, vllm) or an argv list (llamacpp, sglang); None when nothing exported
    text: str  # what to paste: JSON or a shell-quoted command line; "" when nothing exported
    warnings: list[str] = field(default_factory=list)
    exported: Result | None = None  # the measured config handed over
    fallback: bool = False  # True when that is not the profile's best config
    lost: list[str] = field(default_factory=list)  # why the best could not be exported
    nothing: str = ""  # one line: why nothing was exported

    def as_dict(self) -> dict[str, Any]:
        r = self.exported
        return {
            "engine": self.engine,
            "engine_version": self.version,
            "flags_source": self.source,
            "exported": r is not None,
            "config": r.config.label if r else None,
            "measured_speedup": r.metrics.speedup if r else None,
            "fallback": self.fallback,
            "lost": self.lost,
            "settings": self.settings,
            "warnings": self.warnings,
            "nothing": self.nothing or None,
        }


def export(
    profile: Profile,
    to: str,
    version: str | None = None,
    model_path: Callable[[str], str] | None = None,
) -> Export:
    """The best config `to` can run as measured, as its settings for engine `version` (None: current).

    `model_path` turns a stored draft reference into what the engine should load (app passes the
    resolver of the profile's portable references); by default the reference is used as written.
    """
    e = engine_info(to)
    fs = flagset(e.key, version)
    resolve = model_path or (lambda ref: ref)
    out = Export(e.key, fs.version, fs.source, None, "")
    best = profile.best
    if best.config.draft.kind == "none":
        out.nothing = NO_SPECULATION
        return out
    out.lost = blockers(best.config, e.key)
    chosen = best if not out.lost else _best_expressible(profile, e.key)
    if chosen is None:
        out.nothing = (
            f"nothing in the profile runs on {e.display} as measured and beats plain decoding; "
            f"best {best.config.label}: {'; '.join(out.lost)}"
        )
        return out
    if chosen is not best:
        out.fallback = True
        loss = best.metrics.speedup - chosen.metrics.speedup
        out.warnings.append(
            f"the best config {best.config.label} (measured {best.metrics.speedup:.3f}x) cannot run on "
            f"{e.display} as measured: {'; '.join(out.lost)}. Exported instead the best measured config it "
            f"can run: {chosen.config.label}, measured {chosen.metrics.speedup:.3f}x ({loss:.3f}x less)"
        )
    d = chosen.config.draft
    settings, notes = _EXPORTERS[e.key](profile, chosen.config, fs, resolve(d.path) if d.path else "")
    bad = problems(fs, settings)
    if bad:  # a bug in this module, not the user's input
        raise RuntimeError(f"export to {e.key} {fs.version} emitted options it refuses: {'; '.join(bad)}")
    if profile.batch_table:
        notes += _batch_sizes(profile, e.key, chosen, settings)
        bad = problems(fs, settings)
        if bad:
            raise RuntimeError(f"export to {e.key} {fs.version} emitted options it refuses: {'; '.join(bad)}")
    out.settings, out.exported = settings, chosen
    out.warnings += notes
    out.text = _render(e.key, settings)
    return out


def _best_expressible(profile: Profile, engine: str) -> Result | None:
    """The first of the ranked alternatives `engine` runs as measured and that beats the baseline."""
    for r in profile.alternatives:
        if r.config.draft.kind != "none" and r.metrics.speedup > 1.0 and not blockers(r.config, engine):
            return r
    return None


def export_settings(profile: Profile, to: str, version: str | None = None) -> tuple[Any, list[str]]:
    """(settings, warnings) of `export`; settings None when nothing is exported."""
    r = export(profile, to, version)
    return r.settings, r.warnings + ([r.nothing] if r.nothing else [])


def export_profile(profile: Profile, to: str, version: str | None = None) -> tuple[str, list[str]]:
    """(text for stdout, warnings) of `export`; text "" when nothing is exported."""
    r = export(profile, to, version)
    return r.text, r.warnings + ([r.nothing] if r.nothing else [])


def _render(engine: str, settings: Any) -> str:
    if engine == "hf":
        return json.dumps(settings, indent=2)
    if engine == "vllm":
        compact = json.dumps(settings)
        # line 1 for LLM(speculative_config=...), line 2 for `vllm serve`
        return f"{compact}\n--speculative-config {shlex.quote(compact)}"
    return shlex.join(settings)


def _num(x: float) -> float:
    """Thresholds as people write them: 0.3, not 0.30000000000000004."""
    return round(x, 4)


def _flag_num(x: float) -> str:
    return f"{_num(x):g}"


def _lookup_notes(engine: str, display: str, cfg: Config, match: str | None) -> list[str]:
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
        notes += _lookup_notes("hf", "HF", cfg, "earliest")
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
        "assistant_confidence_threshold": _num(cfg.threshold),
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
    return out, _lookup_notes("vllm", "vLLM", cfg, "earliest")


def _llamacpp(p: Profile, cfg: Config, fs: FlagSet, path: str) -> tuple[list[str], list[str]]:
    d = cfg.draft
    old = fs.version == "b8953"
    if d.kind == "model":
        notes = []
        if not path.endswith(".gguf"):
            notes.append(
                f"llama.cpp loads GGUF files: convert the draft ({path}) with convert_hf_to_gguf.py "
                "and pass the .gguf path instead"
            )
        # p-min's default was 0.75 before b9235 and is 0.0 since, so it is always written
        if old:
            args = ["-md", path, "--draft-max", str(cfg.gamma), "--draft-min", "0"]
            args += ["--draft-p-min", _flag_num(cfg.threshold)]
        else:
            # since b9464 a draft model does not enable drafting by itself: --spec-type draft-simple
            args = [] if fs.version == "b8955" else ["--spec-type", "draft-simple"]
            args += ["--spec-draft-model", path, "--spec-draft-n-max", str(cfg.gamma)]
            args += ["--spec-draft-n-min", "0", "--spec-draft-p-min", _flag_num(cfg.threshold)]
        return args, notes
    notes = _lookup_notes("llamacpp", "llama.cpp", cfg, "latest")
    if d.ngram_min != d.ngram_max:
        notes.append(
            f"llama.cpp's ngram-simple matches one n-gram length (n = ngram_max {d.ngram_max}) and does "
            f"not fall back to shorter ones down to ngram_min {d.ngram_min}"
        )
    if old:
        args = ["--spec-type", "ngram-simple", "--spec-ngram-size-n", str(d.ngram_max)]
        args += ["--spec-ngram-size-m", str(cfg.gamma), "--draft-max", str(cfg.gamma)]
    else:
        args = ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(d.ngram_max)]
        args += ["--spec-ngram-simple-size-m", str(cfg.gamma)]
    return args, notes


def _sglang(p: Profile, cfg: Config, fs: FlagSet, path: str) -> tuple[list[str], list[str]]:
    # only draft models reach here (engines.blockers); SGLang counts the last verified token as
    # the root of the draft tree, so a chain of gamma drafts is gamma + 1 draft tokens
    args = [
        "--speculative-algorithm", "STANDALONE",
        "--speculative-draft-model-path", path,
        "--speculative-num-steps", str(cfg.gamma),
        "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", str(cfg.gamma + 1),
    ]  # fmt: skip
    return args, []


_EXPORTERS = {"hf": _hf, "vllm": _vllm, "llamacpp": _llamacpp, "sglang": _sglang}

# The last range of vLLM's schedule ends here: beyond any concurrency a server is configured for.
LAST_BATCH = 65536


def _batch_sizes(profile: Profile, engine: str, chosen: Result, settings: Any) -> list[str]:
    """Map the profile's batch table (γ*(B), B*) onto what `engine` can express; notes for the rest.

    vLLM takes a batch-size schedule (`num_speculative_tokens_per_batch_size`, the successor of the
    removed `disable_by_batch_size`): row i's γ holds from its batch size up to the next row's.
    """
    rows = sorted(profile.batch_table, key=lambda r: r.batch_size)
    name = chosen.config.draft.name
    b_star = profile.b_star
    if engine != "vllm":
        where = {
            "sglang": "SGLang has no batch-size switch for speculation; cap concurrency with "
            "--max-running-requests",
            "llamacpp": "llama.cpp has no batch-size switch for speculation; cap the parallel slots (-np)",
            "hf": "HF's assisted generation decodes one request at a time",
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
