"""llama.cpp as a measuring session: the target as a GGUF, each config in its own `llama-server`
against a plain one of the same build (measure.llamacpp.backend), the workload through the target's
own chat template (the server's /apply-template). Every server dies with the command that started
it (`servers_die_with_us`); a server that fails outside a trial is one line (`server_failures`)."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..checkpolicy import LLAMACPP_CHECK_POLICY
from ..domain import FIXED_GAMMA, Config, Costs, DraftSpec
from ..errors import SpecDecError
from ..limits import check_context, check_count, check_temperature
from ..measure.llamacpp.args import ENGINE_MAX_GAMMA, engine_default_configs
from ..measure.llamacpp.backend import LlamaCppBackend, TextCase, warm_up
from ..measure.llamacpp.closedloop import sent_tokens
from ..measure.llamacpp.costs import draft_paths, measure_engine_costs
from ..measure.llamacpp.load import engine_busy, load_hint, oversubscribed_line, server_failures
from ..measure.llamacpp.server import ServerError, build_info, find_server
from ..runtime.contexts import workload_as_sent
from ..search.budget import TrialShape
from ..search.space import TuneSettings
from ..store.build import EngineFields
from ..store.refs import portable_ref, profile_file_slug
from ..store.schema import BackendInfo, Profile, TargetInfo
from .base import Models, Progress, Purpose
from .llamacpp_open import engine_context, engine_drafts, engine_workload, resolve_gguf
from .server_session import ServerSession, open_tied

if TYPE_CHECKING:
    from ..search.results import TuneResult

DEFAULT_MAX_GAMMA = ENGINE_MAX_GAMMA  # `run --max-gamma`'s default: n-gram drafts cost next to nothing
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


class LlamaCppSession(ServerSession):
    """The llama.cpp session (backends.base.MeasuringSession)."""

    name = "llamacpp"
    title = "llama.cpp"
    target_dtype = "gguf"
    device = "cpu"
    policy = CHECK_POLICY
    screens = True  # a config's first prompts are measured first when asked (measure.seam.Screen)
    trial_shape = TRIAL_SHAPE
    fits_costs_from_trials = True  # acceptance in the engine comes from the search's first trials
    fresh_reference = False  # a server per config is a fresh process already
    slices = True  # check measures on the check slice (measure.narrow): `-t 1`, pinned where it is free
    run_command = "specdec-tune run --backend llamacpp"

    def renew(self) -> bool:
        """A doubtful check is measured again in a new server pair (the config's server is new at
        every measurement; the plain one is renewed here): its repeats then stand for a second
        pair's level, not for the first one's again (measure.llamacpp.backend.renew)."""
        self.backend.renew()
        return True

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
        # `check` and the reference it is judged against (app.reference opens a check session)
        # measure each repeat in a new server pair; a search keeps its servers (trials are many).
        self.backend.pair_per_repeat = purpose.name == "check"
        self.threads = self.backend.threads
        cpus = os.cpu_count() or 1
        self.busy_rule = lambda info: engine_busy(info, self.threads, cpus)
        self._stack: contextlib.ExitStack | None = None

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

    def profile_path(self, hardware_slug: str, target_arg: str | None) -> Path:
        slug = profile_file_slug(target_arg or self.target.name)  # a GGUF file by path, not its stem
        return Path("profiles") / hardware_slug / f"{slug}.llamacpp.yaml"

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

    def _plain_pass(self, case: TextCase) -> float:
        return self.backend._pass(self.backend.plain(1), case, 1)["tok_s"]

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

    def first_trials(self, max_gamma: int) -> list[dict[str, Any]]:
        """Every draft once at a middle gamma first (its acceptance in this engine feeds the cost
        model), so no draft is left out of a short search."""
        return [start_params(d, max_gamma) for d in self.specs]

    def default_configs(self) -> list[Config]:
        """llama-server's own default config of each n-gram spec type in the space (`--spec-type X`
        and nothing else: ENGINE_DEFAULTS), raced in the final round."""
        kinds = {d.kind for d in self.specs}
        return [c for c in engine_default_configs() if c.draft.kind in kinds]

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

    def describe(self) -> str:
        return f"llama.cpp ({self.backend.build.get('package') or self.backend.build['binary_sha256']})"


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
    return open_tied(lambda: LlamaCppSession(models, purpose), server_failures(models.threads))


def open_engine(models: Models, batch_size: int = 1) -> LlamaCppSession:
    """The session alone, for benchmarks that drive its backend directly (inside their own
    `servers_die_with_us`)."""
    return LlamaCppSession(models, Purpose(batch_size=batch_size))
