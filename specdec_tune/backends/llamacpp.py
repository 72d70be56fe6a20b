"""llama.cpp as a measuring session: the target as a GGUF, each config in its own `llama-server`
against a plain one of the same build (measure.llamacpp.backend), the workload through the target's
own chat template (the server's /apply-template). Every server dies with the command that started
it (`servers_die_with_us`); a server that fails outside a trial is one line (`server_failures`)."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..checkpolicy import LLAMACPP_CHECK_POLICY
from ..domain import FIXED_GAMMA, Anchors, Config, Costs, DraftSpec, Noise
from ..errors import SpecDecError
from ..limits import check_context, check_count, check_temperature
from ..measure.anchors import measure_twice
from ..measure.llamacpp.args import ENGINE_MAX_GAMMA, engine_default_configs
from ..measure.llamacpp.backend import LlamaCppBackend, TextCase, warm_up
from ..measure.llamacpp.closedloop import sent_tokens
from ..measure.llamacpp.costs import draft_paths, measure_engine_costs, with_acceptance
from ..measure.llamacpp.load import engine_busy, load_hint, oversubscribed_line, server_failures
from ..measure.llamacpp.server import ServerError, build_info, find_server, servers_die_with_us
from ..measure.noise import measure_noise
from ..measure.seam import Screen
from ..measure.timing import median
from ..measurement import Measurement
from ..runtime.contexts import workload_as_sent
from ..search.budget import TrialShape
from ..search.enginepredictor import EnginePredictor
from ..search.space import TuneSettings
from ..store.build import EngineFields
from ..store.refs import portable_ref, profile_file_slug
from ..store.schema import BackendInfo, Profile, TargetInfo
from .base import Models, Progress, Purpose
from .llamacpp_open import engine_context, engine_drafts, engine_workload, resolve_gguf

if TYPE_CHECKING:
    from ..search.results import TuneResult
    from .acceptance import GivenAcceptance

DEFAULT_MAX_GAMMA = ENGINE_MAX_GAMMA  # `run --max-gamma`'s default: n-gram drafts cost next to nothing
NOISE_PASSES = 3
# `check` judges llama-server's speedup, acceptance and exactness; its absolute tokens/s are reported,
# not judged (no fresh-process reference: each server is one process's rate).
CHECK_POLICY = replace(LLAMACPP_CHECK_POLICY, judged_rates=())
FITTED_TEMPLATE_ROOM = 128  # tokens beside a prompt fitted to L: its chat template, a draft's tail
# A trial's server start-up and its warm-up request; its first pass over the workload (the
# exactness check) is untimed.
# The finalists share one plain side (measure.llamacpp.backend): no own baseline.
TRIAL_SHAPE = TrialShape(
    overhead_s=1.5, warmup_passes=1.0, own_baseline=False, plans_speedup=False, batch_requests=2.0
)  # batch_requests: measure.llamacpp.backend._closed_loop's 2 x B requests at the least


class LlamaCppSession:
    """The llama.cpp session (backends.base.MeasuringSession)."""

    name = "llamacpp"
    device = "cpu"
    policy = CHECK_POLICY
    screens = True  # a config's first prompts are measured first when asked (measure.seam.Screen)
    trial_shape = TRIAL_SHAPE
    fits_costs_from_trials = True  # acceptance in the engine comes from the search's first trials
    fresh_reference = False  # a server per config is a fresh process already
    run_command = "specdec-tune run --backend llamacpp"

    def __init__(self, models: Models, purpose: Purpose, cache_dir: Path | None = None) -> None:
        check_count(models.max_new_tokens, "max_new_tokens")
        check_temperature(models.temperature)
        self.models = models
        self.target = resolve_gguf(models.target, cache_dir)
        self.specs, paths = engine_drafts(models, self.target, cache_dir, purpose.layer_skip)
        self.workload = engine_workload(models)
        budgets = [p.max_new_tokens or models.max_new_tokens for p in self.workload.prompts]
        if models.context_length is not None:
            # Room for the prompts fitted to L (the chat template's tokens on top) and the longest
            # reply, not for the workload as written: a slot's KV cache is allocated, and cleared,
            # at every server start. Sized for long-code-edit's whole modules, a -np 4 server at
            # L = 2 048 held 76 800 cells and took 2.5-4.4 s to start, against 0.4 s at 9 216.
            context = -(-(models.context_length + max(budgets) + FITTED_TEMPLATE_ROOM) // 256) * 256
        else:
            context = engine_context(workload_as_sent(self.workload, None, len), budgets)
        self.backend = LlamaCppBackend(
            self.target.path,
            binary=models.server,
            threads=models.threads or os.cpu_count(),
            context=context,
            draft_paths=paths,
        )
        try:
            server = self.backend.plain(purpose.batch_size)
            if models.context_length is not None:
                positions = server.trained_positions()
                check_context(models.context_length, max(budgets), positions, self.target.name)
            count = lambda text: len(server.tokenize(text))  # noqa: E731
            sent = workload_as_sent(self.workload, models.context_length, count)
            texts = []
            for p in sent.prompts:
                if p.messages is None:
                    texts.append(p.text)
                else:
                    texts.append(server.post("/apply-template", {"messages": p.messages})["prompt"])
            lengths = [len(server.tokenize(t)) for t in texts]
            self.prompt_tokens = round(sum(lengths) / len(lengths))
            positions = server.trained_positions()
            if positions and max(lengths) + max(budgets) > positions:
                raise SpecDecError(
                    f"{models.workload}'s longest prompt is {max(lengths)} tokens, and with its "
                    f"{max(budgets)}-token reply it passes {self.target.name}'s {positions} positions: "
                    "fit its prompts with --context-lengths, or pass --prompts/--max-new-tokens"
                )
        except BaseException:
            self.backend.close()
            raise
        self.case = TextCase(texts, budgets, models.temperature)
        self.threads = self.backend.threads
        cpus = os.cpu_count() or 1
        self.busy_rule = lambda info: engine_busy(info, self.threads, cpus)
        self._stack: contextlib.ExitStack | None = None

    # -- lifecycle
    def __enter__(self) -> LlamaCppSession:
        return self

    def __exit__(self, *exc: object) -> Any:
        self.close()
        stack, self._stack = self._stack, None
        return stack.__exit__(*exc) if stack is not None else None

    def close(self) -> None:
        self.backend.close()

    def info(self) -> dict[str, Any]:
        """Which engine measured: name, build (package, binary hash), threads."""
        return self.backend.info()

    def failure_hint(self, exc: BaseException, os_info: dict[str, Any]) -> str | None:
        """A server that stopped answering (`ServerError`): why, when the OS saw a busy machine
        meanwhile (`os_info`: measure.noise.os_since; "" on a quiet one); None for any other error."""
        if not isinstance(exc, ServerError):
            return None
        return load_hint(os_info, self.threads, os.cpu_count() or 1)

    # -- what the search needs
    def settings_for(self, settings: TuneSettings, progress: Progress) -> TuneSettings:
        if settings.gamma_policies and set(settings.gamma_policies) != {"fixed"}:
            raise SpecDecError("llama.cpp drafts a fixed number of tokens: --gamma-policies must be fixed")
        line = oversubscribed_line(self.threads)  # llama.cpp crawls when its cores are taken
        if line:
            progress.note(line)
        return replace(settings, serving_engine="llamacpp")  # its threshold semantics (p-min after top-k 10)

    def content_hash(self, like: str = "") -> str:
        return self.target.content_hash

    def profile_path(self, hardware_slug: str, target_arg: str | None) -> Path:
        slug = profile_file_slug(target_arg or self.target.name)  # a GGUF file by path, not its stem
        return Path("profiles") / hardware_slug / f"{slug}.llamacpp.yaml"

    def study_key(self, hardware_slug: str, settings: TuneSettings, batch_size: int) -> dict[str, Any]:
        return {
            "backend": self.backend.info(),
            "hardware": hardware_slug,
            "target": self.target.content_hash,
            "workload": self.workload.sha256,
            "prompts": len(self.case.prompts),
            "max_new_tokens": max(self.case.max_new_tokens),
            "temperature": self.case.temperature,
            "repeats": settings.repeats,
            "batch_size": batch_size,
        }

    def begin(self, settings: TuneSettings, study_key: dict[str, Any]) -> None:
        """Nothing to agree on with other workers: each server is started with its flags."""

    # -- measuring
    def measure(self, configs: list[Config], case: TextCase, batch_size: int = 1, repeats: int = 3, seed: int = 0,
                on_repeat: Callable[[int, float], None] | None = None, screen: Screen | None = None) -> list[Measurement]:  # fmt: skip
        return self.backend.measure(configs, case, batch_size, repeats, seed, on_repeat, screen)

    def pass_seconds(self, batch_size: int) -> float:
        """One plain pass over the whole workload at `batch_size`: timed over its first two prompts
        (the least a trial measures; the workload's order is stratified) after an untimed pass that
        puts them in the slots, as a config's first pass does (at B > 1 `warm_up`'s few tokens a
        request), and scaled by the tokens a whole pass
        sends. A B > 1 pass processes each prompt it meets once for its slot layout: timing the
        whole workload processed every prompt (7 of 6 144 tokens, about 5 minutes, at B = 4)."""
        plain = self.backend.plain(batch_size)
        share = self.case.head(2)
        self.backend._pass(plain, warm_up(share) if batch_size > 1 else share, batch_size)
        t0 = time.monotonic()
        self.backend._pass(plain, share, batch_size)
        elapsed = time.monotonic() - t0
        return elapsed * sent_tokens(self.case, batch_size) / max(1, sent_tokens(share, batch_size))

    def noise_and_anchors(self) -> tuple[Noise, Anchors]:
        """The plain server's passes (batch size 1) timed while watching the OS: the machine's
        noise, and its anchors (the server's plain decode tokens/s; copy bandwidth and a small
        matmul rate, measure.anchors, as `check` measures them). Each pass covers 1/NOISE_PASSES of
        the prompts, two at most (the least a trial measures: at a long context each prompt more is
        a prefill more), after an untimed one that fills the server's prompt cache; `plain_pass_s`
        is scaled up to the whole workload. The server is a child of this process, so the OS's
        "other processes" never count it."""
        share = self.case.head(min(2, max(1, -(-len(self.case.prompts) // NOISE_PASSES))))
        plain = self.backend.plain(1)
        self.backend._pass(plain, share, 1)
        rates: list[float] = []

        def plain_pass() -> float:
            t0 = time.perf_counter()
            rates.append(self.backend._pass(plain, share, 1)["tok_s"])
            return time.perf_counter() - t0

        machine, noise = measure_twice("cpu", lambda: measure_noise(plain_pass, NOISE_PASSES))
        full_s = noise.plain_pass_s * sum(self.case.max_new_tokens) / max(1, sum(share.max_new_tokens))
        noise = replace(noise, plain_pass_s=round(full_s, 5))
        return noise, Anchors(round(median(rates), 3), machine.copy_bandwidth_gbps, machine.matmul_gflops)

    def costs(
        self, max_gamma: int, repeats: int, progress: Progress, batch_sizes: list[int] | None = None,
        carry: Costs | None = None,
    ) -> Costs:  # fmt: skip
        """T_target, C_ver(γ) and T_draft measured in llama-server (the cost surface over B is not
        measured in the engine); acceptance comes from trials (`with_trial_acceptance`). Every
        term measured here changes with the context, so `carry` (an envelope's first length's
        costs) is not taken over: it only says this length's costs carry that length's model, so
        C_ver is measured at a few γ (`measure_engine_costs`' `carried`)."""
        progress.stage("llama.cpp costs: T_target, C_ver(γ), T_draft", 0.0)
        return measure_engine_costs(
            self.backend, self.case.head(2), draft_paths(self.backend, self.specs), max_gamma, repeats,
            carried=carry is not None,
        )  # fmt: skip

    def use_costs(self, costs: Costs) -> None:
        raise SpecDecError("--costs-from holds costs of our own engine; llama.cpp measures its own")

    def with_trial_acceptance(self, costs: Costs, result: TuneResult, max_gamma: int) -> Costs:
        return with_acceptance(costs, _acceptance(result), max_gamma)

    def first_trials(self, max_gamma: int) -> list[dict[str, Any]]:
        """Every draft once at a middle gamma first (its acceptance in this engine feeds the cost
        model), so no draft is left out of a short search."""
        return [start_params(d, max_gamma) for d in self.specs]

    def predictor(self) -> EnginePredictor:
        """The engine's cost model (search.enginemodel), fitted from the trials' own decode timings
        as they come in."""
        return EnginePredictor()

    def default_configs(self) -> list[Config]:
        """llama-server's own default config of each n-gram spec type in the space (`--spec-type X`
        and nothing else: ENGINE_DEFAULTS), raced in the final round."""
        kinds = {d.kind for d in self.specs}
        return [c for c in engine_default_configs() if c.draft.kind in kinds]

    def flags(self, config: Config, batch_size: int) -> list[str] | None:
        return self.backend.flags(config, batch_size)

    def exactness(self, result: TuneResult, case: TextCase | None = None) -> dict[str, Any]:
        """At T = 0: the best speculative config's tokens against the plain server's, per prompt of
        `case` (the prompts the search measured: its first pass checked them already, so this
        costs no request; the whole workload's would cost a prefill each at a long context)."""
        case = case or self.case
        best = next((r for r in result.results if r.config.gamma > 0), None)
        if best is None or case.temperature != 0:
            return {}
        e = self.backend.exactness(best.config, case)
        return {
            "config": best.config.label,
            "prompts": e["prompts"],
            "identical": e["prompts"] - e["mismatches"],
            "near_ties": e["near_ties"],
            "first_divergence": e["first_divergence"],
            "token_exact": e["mismatches"] == 0,
        }

    def expected_speedup(self, costs: Costs | None, settings: TuneSettings) -> float | None:
        return None  # planned as plain until trials fit the model (TRIAL_SHAPE.plans_speedup)

    def batch_model(self, costs: Costs | None) -> Any:
        return None  # the cost surface over B is not measured in the engine

    def engine_fields(self, result: TuneResult, profile_dir: Path, target_arg: str | None) -> EngineFields:
        info = self.backend.info()
        # a built-in GGUF by its name (its file lies in a package, at another path on every
        # machine), a file relative to the profile's folder (store.refs)
        ref = portable_ref(target_arg or self.target.name, profile_dir)
        return EngineFields(
            target=TargetInfo(self.target.name, ref, None, self.target.content_hash, "gguf", 0),
            versions={"specdec_tune": __version__, **{k: str(v) for k, v in info["build"].items()}},
            backend=BackendInfo(info["name"], dict(info["build"]), info.get("threads")),
        )

    def portable(self, profile: Profile, out: Path, target_arg: str | None) -> Profile:
        return profile  # the target is named portably in `engine_fields`; draft GGUFs as given

    # -- bench and profile
    def check_bench(self, spec: DraftSpec, *, compare_hf: bool, save_outputs: bool) -> None:
        if compare_hf:
            raise SpecDecError(
                "--compare-hf compares our own engine with transformers: drop --backend llamacpp"
            )
        if save_outputs:
            raise SpecDecError("--save-outputs writes our own engine's tokens: drop --backend llamacpp")

    def compare_hf(self, config: Config, repeats: int) -> dict[str, Any]:
        raise SpecDecError("--compare-hf compares our own engine with transformers: drop --backend llamacpp")

    def outputs_jsonl(self, m: Measurement) -> str:
        raise SpecDecError("--save-outputs writes our own engine's tokens: drop --backend llamacpp")

    def target_name(self) -> str:
        return self.target.name

    def describe(self) -> str:
        return f"llama.cpp ({self.backend.build.get('package') or self.backend.build['binary_sha256']})"

    def profile_costs(self, max_gamma: int, repeats: int, progress: Progress, *, context_len: int | None,
                      acceptance: GivenAcceptance) -> tuple[Costs, list[int] | None, dict[str, Any]]:  # fmt: skip
        """`profile --backend llamacpp`: T_target, C_ver(γ) and T_draft measured in llama-server, and
        each draft's acceptance from one pass at a middle γ."""
        costs = self.costs(max_gamma, repeats, progress)
        measured = {}
        for i, spec in enumerate(self.specs):
            progress.stage(f"acceptance of {spec.name}", (i + 1) / (len(self.specs) + 1))
            params = start_params(spec, max_gamma)
            config = Config(spec, params["gamma"], params.get("threshold", 0.0))
            (m,) = self.backend.measure([config], self.case, 1, 1)
            if m.metrics.acceptance_rate > 0:
                measured[spec.name] = (
                    m.metrics.acceptance_rate,
                    m.metrics.mean_accepted_len,
                    m.metrics.tokens_per_s,
                )
        costs = with_acceptance(costs, measured, max_gamma)
        target = {"name": self.target.name, "dtype": "gguf", "num_params": 0, "weights": "trained"}
        target["backend"] = self.backend.info()
        return costs, list(self.case.max_new_tokens), target


def _acceptance(result: TuneResult) -> dict[str, tuple[float, float, float]]:
    """Each draft's measured (alpha, tau, tokens/s) in its best trial so far."""
    out: dict[str, tuple[float, float, float]] = {}
    for r in result.results:
        m = r.metrics
        if r.config.gamma > 0 and r.config.draft.name not in out and m.acceptance_rate > 0:
            out[r.config.draft.name] = (m.acceptance_rate, m.mean_accepted_len, m.tokens_per_s)
    return out


def start_params(draft: DraftSpec, max_gamma: int) -> dict[str, Any]:
    """A draft's first trial: a model draft at gamma 4; an n-gram draft (next to free per drafted
    token) at three quarters of the range, at least 6."""
    gamma = (
        min(max_gamma, 4) if draft.kind in ("model", "layer_skip", "hybrid") else max(6, max_gamma * 3 // 4)
    )
    params: dict[str, Any] = {
        "draft": draft.name,
        "gamma": FIXED_GAMMA.get(draft.kind) or min(max_gamma, gamma),
    }
    if draft.has_threshold:
        params["threshold"] = 0.0
    return params


def engine_build(models: Models) -> dict[str, Any]:
    """The llama-server build `models` would start: its package version and binary hash."""
    return build_info(find_server(models.server))


def open_session(models: Models, purpose: Purpose) -> LlamaCppSession:
    """The session, its servers tied to this command: any that outlives it is stopped, and a server
    failure outside a trial ends the command with one line."""
    stack = contextlib.ExitStack()
    stack.enter_context(servers_die_with_us())
    stack.enter_context(server_failures(models.threads))
    try:
        session = LlamaCppSession(models, purpose)
    except BaseException:
        if not stack.__exit__(*sys.exc_info()):
            raise
        raise
    session._stack = stack
    return session


def open_engine(models: Models, batch_size: int = 1) -> LlamaCppSession:
    """The session alone, for benchmarks that drive its backend directly (inside their own
    `servers_die_with_us`)."""
    return LlamaCppSession(models, Purpose(batch_size=batch_size))
