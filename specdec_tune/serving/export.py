"""Translate a profile into a deployment for one serving engine (HF, vLLM, llama.cpp, SGLang,
TensorRT-LLM), per engine version, exporting only a config the engine runs the way it was measured.

The default output is ready to run: the engine's command (or a Python snippet for HF and
TensorRT-LLM) with the target and draft resolved, the measured operating point, and the batch
settings from the profile's batch table (`-np`, `--max-running-requests`, a batch-size schedule made
safe by serving/schedule.py). `--format flags` keeps the round-2 fragment byte for byte.

When the best config cannot run there as measured (capabilities.blockers), the best measured alternative
that can is exported and the warnings say which; when nothing can, nothing is exported (exit 5).
Every emitted option is checked against the engine version's flag set. Plain data in, text out.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..domain import Config, Result
from ..errors import SpecDecError
from ..store.schema import Profile
from .capabilities import ENGINES, engine_info
from .choice import Choice, choose, choose_at_load
from .commands import command_argv, python_snippet
from .envelope import context_notes
from .flagcheck import problems
from .flagsets import FlagSet, flagset
from .fragments import EXPORTERS, HF_BATCH_NOTE, fragment_batch_notes, lookup_notes, render_fragment
from .llamacpp_args import llamacpp_args, measured_llamacpp_args
from .measured import measured_run
from .schedule import Tier, default_load, largest_measured_batch, tiers

__all__ = ["ENGINES", "FORMATS", "NO_SPECULATION", "Export", "export", "export_profile", "export_settings"]

NO_SPECULATION = "profile says: do not speculate (plain decoding was fastest on this hardware)"
FORMATS = ("command", "json", "flags")
SCHEDULE_ENGINES = ("vllm", "trtllm")
# vLLM: a schedule downgrades full CUDA graphs to PIECEWISE (vllm/config/vllm.py
# _maybe_override_dynamic_sd_cudagraph_mode), so its K = 0 tier costs more than no speculation
K0_COSTS_MORE = {"vllm": True, "trtllm": False}


@dataclass
class Export:
    engine: str
    version: str
    source: str  # where the flag set was read from
    settings: Any  # the engine's speculative settings: a dict (hf, vllm, trtllm) or an argv list
    text: str  # what to paste: a command, a snippet, or the fragment; "" when nothing exported
    warnings: list[str] = field(default_factory=list)
    exported: Result | None = None  # the measured config handed over
    fallback: bool = False  # True when that is not the profile's best config
    lost: list[str] = field(default_factory=list)  # why the best could not be exported
    nothing: str = ""  # one line: why nothing was exported
    fmt: str = "command"
    target: str = ""  # the target as the engine loads it
    load: int | None = None  # the batch size the batch settings were sized for
    schedule: list[list[int]] = field(default_factory=list)  # [start, end, K] tiers handed over
    argv: list[str] = field(default_factory=list)  # the shell command (llamacpp, vllm, sglang)
    lead: int = 0  # argv entries before the checked flags (program, positional target)

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
            "target": self.target or None,
            "load": self.load,
            "schedule": self.schedule,
            "settings": self.settings,
            "command": self.argv or None,
            "text": self.text or None,
            "warnings": self.warnings,
            "nothing": self.nothing or None,
        }


def export(
    profile: Profile,
    to: str,
    version: str | None = None,
    model_path: Callable[[str], str] | None = None,
    *,
    fmt: str = "command",
    batch_size: int | None = None,
    schedule: bool = True,
    target: str | None = None,
) -> Export:
    """The best config `to` can run as measured, as a deployment for engine `version` (None: current).

    `model_path` turns a stored model reference into what the engine should load (app passes the
    resolver of the profile's portable references); `target` is the target as the engine loads it
    (app passes it resolved as `check` resolves it; default: `model_path` of the stored path).
    `batch_size` names the load to size the server for (default: the largest measured batch size
    where speculation won; HF always 1, see `_load`); `schedule=False` emits the single best
    operating point for that load instead of a batch-size schedule.
    """
    if fmt not in FORMATS:
        raise SpecDecError(f"unknown --format {fmt!r}: choose one of {', '.join(FORMATS)}")
    e = engine_info(to)
    fs = flagset(e.key, version)
    resolve = model_path or (lambda ref: ref)
    out = Export(e.key, fs.version, fs.source, None, "", fmt=fmt)
    if profile.best.config.draft.kind == "none":
        out.nothing = NO_SPECULATION
        return out
    if fmt == "flags" and e.key != "trtllm":
        return _fragment(profile, e.key, fs, resolve, out)
    load = _load(profile, e.key, batch_size)
    per_load = profile.batch_table and load is not None and (e.key not in SCHEDULE_ENGINES or not schedule)
    chosen = _take(out, choose_at_load(profile, e.key, load) if per_load else choose(profile, e.key))
    if chosen is None:
        return out
    run = measured_run(profile, e.key, chosen, schedule) if fmt != "flags" else None
    if run is not None:  # measured inside this engine: the command that ran, not one rebuilt
        out.argv, out.lead, out.schedule = run.argv, run.lead, run.schedule
        out.settings, out.exported, out.text = run.argv[run.lead :], chosen, shlex.join(run.argv)
        out.target = target if target is not None else resolve(profile.target.path)
        out.warnings += run.notes
        return out
    d = chosen.config.draft
    path = resolve(d.path) if d.path else ""
    if e.key == "llamacpp":
        stored = measured_llamacpp_args(
            getattr(profile, "backend", None), getattr(chosen, "backend_args", None)
        )
        settings, notes = llamacpp_args(chosen.config, fs, path, measured=stored)
        if d.kind != "model":
            notes = _lookup_note(chosen.config, "latest") + notes
    else:
        settings, notes = EXPORTERS[e.key](profile, chosen.config, fs, path)
    out.target = target if target is not None else resolve(profile.target.path)
    out.load = load
    batch, more = _batch(profile, e.key, chosen, settings, out, schedule and not per_load)
    notes += more + _load_notes(profile, e.key, batch_size) + context_notes(profile, chosen)
    if e.key == "llamacpp":
        threads, more = measured_threads(getattr(profile, "backend", None))
        batch, notes = batch + threads, notes + more
    _check(fs, settings, batch)
    out.settings, out.exported = settings, chosen
    out.warnings += notes
    if fmt == "flags":  # TensorRT-LLM has no round-2 fragment: its speculative_config as JSON
        out.text = render_fragment(e.key, settings)
    elif e.key in ("hf", "trtllm"):
        mnt, temp = profile.workload.max_new_tokens, profile.workload.temperature
        out.text = python_snippet(e.key, out.target, settings, mnt, temp)
    else:
        out.argv, out.lead = command_argv(e.key, out.target, settings, batch)
        out.text = shlex.join(out.argv)
        if e.key == "llamacpp" and not out.target.endswith(".gguf"):
            out.warnings.append(
                f"llama-server loads GGUF files: convert the target ({out.target}) with "
                "convert_hf_to_gguf.py and pass the .gguf path to -m"
            )
    return out


def _load(profile: Profile, engine: str, batch_size: int | None) -> int | None:
    """The batch size the export is sized for: 1 for HF, whose generate() serves one sequence per
    call whatever the server's load (HF_BATCH_NOTE); else `batch_size`, by default the largest
    measured batch size where speculation won."""
    if engine == "hf":
        return 1
    return batch_size if batch_size is not None else default_load(profile)


def _load_notes(profile: Profile, engine: str, batch_size: int | None) -> list[str]:
    """What the export says about a --batch-size it does not follow or that was never measured."""
    if batch_size is None or batch_size == 1:
        return []
    if engine == "hf":
        return [
            f"--batch-size {batch_size} does not change the HF export: it runs one sequence per "
            "generate() call, so the batch size 1 measurement is exported"
        ]
    measured = largest_measured_batch(profile)
    if batch_size <= measured:
        return []
    return [
        f"--batch-size {batch_size} is beyond what was measured: this config was measured at batch size "
        f"{measured} at most, so its speedup at {batch_size} is not known (`specdec-tune run "
        f"--batch-sizes` with {batch_size} measures it)"
    ]


def _check(fs: FlagSet, settings: Any, batch: list[str]) -> None:
    given = settings + batch if isinstance(settings, list) else settings
    bad = problems(fs, given) + (problems(fs, batch) if not isinstance(settings, list) else [])
    if bad:  # a bug in this module, not the user's input
        raise RuntimeError(f"export to {fs.engine} {fs.version} emitted options it refuses: {'; '.join(bad)}")


def measured_threads(backend: object) -> tuple[list[str], list[str]]:
    """(-t/-tb flags, notes) of a llamacpp-backend profile measured with a set thread count: the
    threads are part of what ran (on 2 cores one thread sharing a busy core took SmolLM2 from 165 to
    0.8 tokens/s), so the command runs with them, not with llama.cpp's own default."""
    threads = backend.get("threads") if isinstance(backend, dict) else getattr(backend, "threads", None)
    name = backend.get("name") if isinstance(backend, dict) else getattr(backend, "name", None)
    if name != "llamacpp" or not isinstance(threads, int) or threads < 1:
        return [], []
    t = str(threads)
    return ["-t", t, "-tb", t], [f"-t {t} -tb {t}: the CPU threads every config was measured with"]


def _take(out: Export, choice: Choice) -> Result | None:
    """Record the choice on `out` (what was lost, the fallback said, why nothing) and return it."""
    out.lost, out.nothing, out.fallback = choice.lost, choice.nothing, bool(choice.fallback)
    out.warnings += [choice.fallback] if choice.fallback else []
    return choice.result


def _lookup_note(cfg: Config, match: str) -> list[str]:
    return lookup_notes("llamacpp", "llama.cpp", cfg, match)


def _batch(
    profile: Profile, engine: str, chosen: Result, settings: Any, out: Export, schedule: bool
) -> tuple[list[str], list[str]]:
    """(batch flags for the command, notes): the schedule goes into `settings` for vLLM and
    TensorRT-LLM; -np / --max-running-requests size llama.cpp and SGLang for the load."""
    load, b_star = out.load, profile.b_star
    star = f"speculation stopped paying at B* = {b_star} here" if b_star else ""
    if engine == "hf":
        return [], [HF_BATCH_NOTE + (f"; {star}" if star else "")] if profile.batch_table else []
    if engine in ("llamacpp", "sglang"):
        if load is None:
            return [], []
        flag = "-np" if engine == "llamacpp" else "--max-running-requests"
        why = f"{flag} {load}: " + (
            "the load asked for (--batch-size)"
            if load != default_load(profile)
            else "the largest measured batch size where speculation won here"
        )
        notes = [why + (f"; {star}, so do not raise it to {b_star} or more" if star else "")]
        if engine == "sglang":
            notes.append(
                "SGLang's --speculative-adaptive adapts the number of steps at run time from the acceptance; "
                "it was not measured here, so it is not emitted (the steps are fixed at the measured γ)"
            )
        return [flag, str(load)], notes
    if not profile.batch_table or not schedule:
        if profile.batch_table:
            return [], [f"no schedule (--no-schedule): the operating point measured for a load of {load}"]
        return [], []
    c = chosen.config
    found, notes = tiers(profile, c.draft.name, c.gamma, c.threshold, K0_COSTS_MORE[engine])
    if engine == "vllm":
        return [], notes + _vllm_schedule(found, settings, out, b_star)
    return [], notes + _trtllm_schedule(found, settings, out, b_star)


def _vllm_schedule(found: list[Tier], settings: dict[str, Any], out: Export, b_star: int | None) -> list[str]:
    notes = []
    if b_star and all(t.k for t in found):
        notes.append(
            f"speculation stopped paying at B* = {b_star} here; vLLM's K = 0 tier runs with PIECEWISE CUDA "
            "graphs and users measured it 7-17 % slower than no speculation, so none is emitted: above "
            f"{b_star - 1} concurrent requests serve from an instance without speculation"
        )
    if len(found) < 2:
        return [
            *notes,
            "one γ for every batch size: no schedule emitted (a schedule would only cost CUDA graphs)",
        ]
    out.schedule = [[t.start, t.end, t.k] for t in found]
    settings["num_speculative_tokens_per_batch_size"] = out.schedule
    settings["num_speculative_tokens"] = max(t.k for t in found)
    notes.append(
        "with num_speculative_tokens_per_batch_size set, vLLM's V1 model runner downgrades full CUDA graphs "
        "to PIECEWISE (_maybe_override_dynamic_sd_cudagraph_mode) and drops the schedule with data "
        "parallelism > 1 (_maybe_disable_dynamic_sd_for_data_parallel)"
    )
    if any(t.k == 0 for t in found):
        notes.append(
            "K = 0 tier: the profile measured that drafting 0 tokens pays there; vLLM still runs it with "
            "PIECEWISE CUDA graphs"
        )
    return notes


def _trtllm_schedule(
    found: list[Tier], settings: dict[str, Any], out: Export, b_star: int | None
) -> list[str]:
    spec = settings["speculative_config"]
    while found and found[-1].k == 0:  # above the largest key TensorRT-LLM drafts 0: implicit
        found = found[:-1]
    if len(found) == 1 and found[0].end >= found[0].start and not b_star:
        return ["one γ for every measured batch size: no draft_len_schedule emitted"]
    first = found[0].k
    spec["max_draft_len"] = first
    spec["draft_len_schedule"] = {t.end: min(t.k, first) for t in found}
    out.schedule = [[t.start, t.end, min(t.k, first)] for t in found]
    notes = [
        f"draft_len_schedule: batch sizes up to each key draft its value; above {found[-1].end} TensorRT-LLM "
        "drafts 0 tokens (speculation off, the implicit last tier)"
    ]
    if any(t.k > first for t in found):
        notes.append(
            f"TensorRT-LLM caps every draft length at max_draft_len = {first} (the batch size 1 tier)"
        )
    if b_star:
        notes.append(
            f"K = 0 from batch size {found[-1].end + 1} on, as this profile measured plain decoding fastest "
            f"from B* = {b_star}: TensorRT-LLM switches speculation off there; what its K = 0 iteration costs "
            "against a server without speculation was not measured here"
        )
    return notes


def _fragment(
    profile: Profile, engine: str, fs: FlagSet, resolve: Callable[[str], str], out: Export
) -> Export:
    """The round-2 output, unchanged: the fragment of the best expressible config."""
    chosen = _take(out, choose(profile, engine))
    if chosen is None:
        return out
    d = chosen.config.draft
    settings, notes = EXPORTERS[engine](profile, chosen.config, fs, resolve(d.path) if d.path else "")
    if profile.batch_table:
        notes += fragment_batch_notes(profile, engine, chosen, settings)
    notes += context_notes(profile, chosen)
    if problems(fs, settings):
        raise RuntimeError(
            f"export to {engine} {fs.version} emitted options it refuses: {problems(fs, settings)}"
        )
    out.settings, out.exported = settings, chosen
    out.warnings += notes
    out.text = render_fragment(engine, settings)
    return out


def export_settings(profile: Profile, to: str, version: str | None = None) -> tuple[Any, list[str]]:
    """(settings, warnings) of `export`; settings None when nothing is exported."""
    r = export(profile, to, version)
    return r.settings, r.warnings + ([r.nothing] if r.nothing else [])


def export_profile(
    profile: Profile, to: str, version: str | None = None, fmt: str = "command"
) -> tuple[str, list[str]]:
    """(text for stdout, warnings) of `export`; text "" when nothing is exported."""
    r = export(profile, to, version, fmt=fmt)
    return r.text, r.warnings + ([r.nothing] if r.nothing else [])
