"""vLLM as a measuring session: the target as a model folder, each config in its own vLLM server
against a plain one of the same build (backends.vllm.measuring), the workload through the target's
own chat template (the server's /tokenize), sent as token ids so both sides see the same tokens.
Every server dies with the command that started it; a server that fails outside a trial is one line.

Engine starts dominate here (tens of seconds on a CPU: imports and a compile; on a GPU a compile
and CUDA-graph capture), so the plain server's start is timed at open and becomes the trial's
overhead in the budget (`trial_shape`), and every server is kept for all it can measure.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from ... import __version__
from ...checkpolicy import VLLM_CHECK_POLICY
from ...domain import Config, Costs
from ...errors import SpecDecError
from ...limits import check_context, check_count, check_temperature
from ...measure.hardware import local_cpu_isa
from ...measure.llamacpp.cases import TextCase
from ...measure.llamacpp.closedloop import sent_tokens
from ...measure.servers import ServerError
from ...measure.timing import median
from ...runtime.contexts import workload_as_sent
from ...runtime.workloads import prompt_text
from ...search.budget import TrialShape
from ...search.enginepredictor import EnginePredictor
from ...search.space import TuneSettings
from ...store.build import EngineFields
from ...store.refs import portable_ref, profile_file_slug
from ...store.schema import BackendInfo, Profile, TargetInfo
from ..base import Models, Progress, Purpose
from ..llamacpp_open import engine_context, engine_workload
from ..server_session import ServerSession
from .args import EXAMPLE_MODEL_GAMMA, EXAMPLE_NGRAM, parse_vllm_draft
from .costs import measure_costs
from .measuring import SETTLE_S, VllmBackend
from .models import engine_drafts, resolve_target
from .schedule import measure_schedule, schedule_seconds
from .server import build_info, extra_args, find_python, is_cpu_build, run_dtype

NOISE_PASSES = 3
SERVER_MEMORY_GIB = 2.0  # the CPU build's share of memory a server takes (its KV cache beside the weights)
CONTEXT_ROOM = 64  # tokens beside the longest prompt and reply


class VllmSession(ServerSession):
    """The vLLM session (backends.base.MeasuringSession)."""

    name = "vllm"
    title = "vLLM"
    device = "cpu"
    policy = VLLM_CHECK_POLICY  # llama.cpp's busy rule (a server's every step), a pair's spread
    fits_costs_from_trials = True  # acceptance comes from the search's first trials
    fresh_reference = False  # a server per config is a fresh process already
    slices = False  # vLLM's CPU worker binds its own cores (VLLM_CPU_OMP_THREADS_BIND)
    settle_s = SETTLE_S  # its workers poll a core for a second after a request (backends.vllm.measuring)
    busy_rule = None
    threads = None
    screens = False
    run_command = "specdec-tune run --backend vllm"

    def __init__(self, models: Models, purpose: Purpose) -> None:
        check_count(models.max_new_tokens, "max_new_tokens")
        check_temperature(models.temperature)
        self.models = models
        self.target = resolve_target(models.target)
        python = find_python(models.server, models.launcher)
        build = build_info(python)
        extra = extra_args()
        # a search may resolve vLLM's auto (run_dtype); check measures the profile's own dtype as stored
        self.dtype, self.dtype_note = (models.dtype, None)
        if purpose.name != "check":
            self.dtype, self.dtype_note = run_dtype(build, models.dtype, extra, local_cpu_isa())
        self.target_dtype = self.dtype
        self.specs = engine_drafts(models.drafts, self.target)
        self.workload = engine_workload(models)
        budgets = [p.max_new_tokens or models.max_new_tokens for p in self.workload.prompts]
        if models.context_length is not None:
            check_context(models.context_length, max(budgets), self.target.positions(), self.target.name)
            length = models.context_length + max(budgets) + 2 * CONTEXT_ROOM
        else:
            length = engine_context(workload_as_sent(self.workload, None, len), budgets)
        length = min(length, self.target.positions() or length)
        share = None
        if is_cpu_build(build):  # its --gpu-memory-utilization is a share of the host's memory
            total_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
            share = min(0.3, SERVER_MEMORY_GIB / total_gib)
        self.backend = VllmBackend(
            python, self.target.path, max_model_len=length, build=build,
            dtype=self.dtype if self.dtype != "auto" else None, extra=extra, memory_share=share,
        )  # fmt: skip
        try:
            self.case = self._case(models, budgets)
        except BaseException:
            self.backend.close()
            raise
        self.prompt_tokens = round(sum(len(p) for p in self.case.prompts) / len(self.case.prompts))
        start_s = self.backend.start_seconds[0]
        # a trial's server start (measured: the plain one's) and its untimed first pass; the least
        # search is the baseline, each draft once and the cost model's best (a start is the cost);
        # the finalists race on the servers their trials started (MAX_SERVERS)
        self.trial_shape = TrialShape(
            overhead_s=start_s, warmup_passes=1.0, own_baseline=False, plans_speedup=False, batch_requests=2.0,
            min_trials=len(self.specs) + 2, finalist_overhead_s=0.0,
        )  # fmt: skip
        self._stack: contextlib.ExitStack | None = None

    def _case(self, models: Models, budgets: list[int]) -> TextCase:
        """The workload as token ids: each prompt through the target's chat template, fitted to the
        context length when one is asked for, checked against the server's context."""
        server = self.backend.server(None)
        sent = workload_as_sent(self.workload, models.context_length, lambda t: len(server.tokenize(t)))
        ids = []
        for p in sent.prompts:
            if p.messages is None:
                ids.append(server.tokenize(p.text))
                continue
            try:
                ids.append(server.chat_tokens(p.messages))
            except ServerError as exc:  # a tokenizer without a chat template: the messages joined,
                if "chat template" not in str(exc):  # as our engine sends them (runtime.workloads)
                    raise
                ids.append(server.tokenize(prompt_text(p, None)))
        longest = max(len(x) for x in ids) + max(budgets)
        if longest > self.backend.max_model_len:
            raise SpecDecError(
                f"{models.workload}'s longest prompt is {max(len(x) for x in ids)} tokens, and with its "
                f"{max(budgets)}-token reply it passes the {self.backend.max_model_len} positions vLLM was "
                "started with: fit its prompts with --context-lengths, or pass --prompts/--max-new-tokens"
            )
        return TextCase(ids, budgets, models.temperature)

    def info(self) -> dict[str, Any]:
        """Which engine measured: name, build (package, torch, fingerprint), extra engine arguments,
        and how long its servers took to start."""
        info = self.backend.info()
        if self.backend.start_seconds:
            info["start_s"] = round(median(self.backend.start_seconds), 1)
        return info

    def renew(self) -> bool:
        """A doubtful check is measured again in a new plain server and a new config server: one
        server pair's speedup differs from another's by a few per cent (docs/vllm.md), so the
        confirmation's repeats stand for a second pair, not for the first one's level again."""
        self.backend.close()
        return True

    def failure_hint(self, exc: BaseException, os_info: dict[str, Any]) -> str | None:
        return "" if isinstance(exc, ServerError) else None

    # -- what the search needs
    def predictor(self) -> EnginePredictor:
        """The engine model with a cost per forward of a speculative server (search.enginemodel's
        o): vLLM runs a speculative server's every step without async scheduling."""
        return EnginePredictor(forward_overhead=True)

    def settings_for(self, settings: TuneSettings, progress: Progress) -> TuneSettings:
        if settings.gamma_policies and set(settings.gamma_policies) != {"fixed"}:
            raise SpecDecError("vLLM drafts a fixed number of tokens: --gamma-policies must be fixed")
        if self.dtype_note:
            progress.note(self.dtype_note)
        return replace(settings, serving_engine="vllm")  # no confidence threshold in vLLM's drafts

    def profile_path(self, hardware_slug: str, target_arg: str | None) -> Path:
        slug = profile_file_slug(target_arg or self.target.name)
        return Path("profiles") / hardware_slug / f"{slug}.vllm.yaml"

    def study_backend(self) -> dict[str, Any]:
        """The build as installed (the server's fingerprint, known after a reply, aside) and the dtype
        its servers compute in: a study of bfloat16 servers is not resumed in float32 ones."""
        return {**self.backend.info(), "build": self.backend.build, "dtype": self.dtype}

    def pass_seconds(self, batch_size: int) -> float:
        """One plain pass over the whole workload at `batch_size`, timed over its first two prompts
        and scaled by the tokens a whole pass sends."""
        share = self.case.head(2)
        elapsed = self.backend.plain_pass_s(share, batch_size)
        return elapsed * sent_tokens(self.case, batch_size) / max(1, sent_tokens(share, batch_size))

    def _plain_pass(self, case: TextCase) -> float:
        return self.backend._pass(self.backend.server(None), case, 1, "plain")["tok_s"]

    def costs(
        self, max_gamma: int, repeats: int, progress: Progress, batch_sizes: list[int] | None = None,
        carry: Costs | None = None,
    ) -> Costs:  # fmt: skip
        """T_target and C_ver(γ) measured in the plain vLLM server (acceptance and a draft model's
        T_draft come from the trials: `with_trial_acceptance`, the engine model)."""
        progress.stage("vLLM costs: T_target, C_ver(γ)", 0.0)
        return measure_costs(self.backend, self.case.head(2), self.specs, max_gamma, repeats, batch_sizes)

    def first_trials(self, max_gamma: int) -> list[dict[str, Any]]:
        """Every draft once first (its acceptance in this engine feeds the cost model): vLLM's
        documented example where the draft is the example's (its server then races in the final
        round without another start), other n-gram drafts at three quarters of the range. The model
        tells a step's cost from a drafted token's once a family ran at two lengths: the model's best
        prediction, tried next, is the second."""
        examples = {c.draft.name: c.gamma for c in self.default_configs()}
        out = []
        for d in self.specs:
            gamma = examples.get(d.name) or max(1, max_gamma * 3 // 4)
            out.append({"draft": d.name, "gamma": min(max_gamma, gamma)})
        return out

    def default_configs(self) -> list[Config]:
        """vLLM's documented example configs, raced in the final round: n-gram γ 5 with
        prompt_lookup_max 4 (where the space has n-gram drafts), each draft model at γ 5."""
        out = []
        if any(d.kind == "prompt_lookup" for d in self.specs):
            name, gamma = EXAMPLE_NGRAM
            spec = next((d for d in self.specs if d.name == name), None) or parse_vllm_draft(name)
            out.append(Config(spec, gamma))
        out += [Config(d, EXAMPLE_MODEL_GAMMA) for d in self.specs if d.kind == "model"]
        return out

    def batch_schedule(self, results: dict[int, Any], case: Any, repeats: int) -> dict[str, Any] | None:
        """vLLM's batch-size schedule from the measured rows, measured against each fixed γ it mixes
        (backends.vllm.schedule); None when one γ or plain decoding is the whole answer."""
        return measure_schedule(self.backend, results, case, repeats)

    def schedule_seconds(self, pass_by_b: dict[int, float], repeats: int) -> float:
        """The schedule's measurement, planned on the median server start so far
        (backends.vllm.schedule.schedule_seconds)."""
        return schedule_seconds(median(self.backend.start_seconds), pass_by_b, repeats)

    def engine_fields(self, result: Any, profile_dir: Path, target_arg: str | None) -> EngineFields:
        info = self.info()
        ref = portable_ref(target_arg or self.target.name, profile_dir)
        return EngineFields(
            target=TargetInfo(self.target.name, ref, None, self.target.content_hash, self.dtype, 0),
            versions={"specdec_tune": __version__, **{k: str(v) for k, v in info["build"].items()}},
            backend=BackendInfo(
                info["name"], dict(info["build"]), launcher=info["launcher"],
                measure_only_args=info["measure_only_args"], engine_args=info["engine_args"],
                start_s=info.get("start_s"),
            ),
        )  # fmt: skip

    def portable(self, profile: Profile, out: Path, target_arg: str | None) -> Profile:
        return profile

    def describe(self) -> str:
        return f"vLLM ({self.backend.build['package']})"
