"""The seam between the use cases (`app`) and the engines that measure: a backend opens a
**measuring session** over (target, drafts, workload, threads or device), and `tune`, `bench`,
`profile` and `check` call only the session. A third backend (vLLM, SGLang on a GPU box) is one
new module implementing `MeasuringSession`, registered by name in `BACKENDS`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..checkpolicy import CheckPolicy
from ..domain import Anchors, Config, Costs, DraftSpec, Noise
from ..errors import SpecDecError
from ..measure.seam import MeasuringBackend
from ..search.budget import TrialShape
from ..search.space import TuneSettings
from ..store.build import EngineFields

if TYPE_CHECKING:  # a name for annotations only: the modes module loads torch
    from ..runtime.caches.modes import EngineMode


@dataclass
class Models:
    """What a measuring use case loads: target, drafts, workload and decoding settings.

    `drafts` are `--draft` strings (a model folder, HF id or demo name, `prompt-lookup[:MIN-MAX]`,
    `layer-skip:K`; an engine's own kinds for an engine backend); None means the backend's default
    drafts. `prompts` takes that many prompts round-robin over the workload's categories.
    """

    target: str | None = None
    drafts: list[Any] | None = None
    workload: str = "demo-code"
    prompt: str | None = None
    prompts: int | None = None
    max_new_tokens: int = 64
    temperature: float = 0.0
    device: str = "auto"
    dtype: str = "auto"
    engine_mode: EngineMode = "auto"  # `--engine`: auto, eager, static or compiled (runtime.caches.modes)
    backend: str = "native"  # where configs are measured: a name in BACKENDS
    llama_server: str | None = None  # an engine backend's server binary (default: its extra's)
    threads: int | None = None  # engine threads (default: every core)
    # `run --context-lengths`: each prompt fitted to about this many target tokens with real text
    # before its request (runtime.contexts); None: the workload's prompts as written.
    context_length: int | None = None

    def open(self, lazy_drafts: bool = True, allow_random: bool = False) -> Any:
        """Load the models and the workload in this process (runtime.session); shapes (random
        weights) only with `allow_random`."""
        from ..runtime.session import load_models

        return load_models(
            self.target,
            self.drafts,
            self.workload,
            self.max_new_tokens,
            self.temperature,
            self.device,
            self.dtype,
            self.prompts,
            self.prompt,
            lazy_drafts=lazy_drafts,
            engine_mode=self.engine_mode,
            allow_random=allow_random,
            context_length=self.context_length,
        )


class Progress:
    """Callbacks a long use case reports through; the CLI draws a progress bar, the default is silent."""

    def stage(self, label: str, fraction: float) -> None:
        """Profiling: `label` starts, `fraction` of the work is done."""

    def trial(self, done: int, total: int, best: float | None) -> None:
        """Search: `done` of `total` trials finished, best speedup so far."""

    def final(self, labels: list[str]) -> None:
        """The final round starts, re-measuring these configs."""

    def note(self, text: str) -> None:
        """Something the user should know that does not stop the work (e.g. a draft skipped)."""


@dataclass
class Purpose:
    """What a session is opened for: `tune` (a search), `bench` (one config), `costs` (`profile`)."""

    name: str = "tune"
    layer_skip: tuple[int, ...] = ()  # tune: extra layer-skip drafts
    batch_size: int = 1  # the first batch size it measures at
    allow_random: bool = False  # costs: shapes (random weights) allowed


class MeasuringSession(MeasuringBackend, Protocol):
    """An engine opened for measuring: its target, drafts and workload, and everything the use
    cases ask of it beside `measure` and `info` (measure.seam.MeasuringBackend). Use as a
    context manager: `close` stops whatever it started."""

    name: str  # the backend's name (BACKENDS)
    specs: list[DraftSpec]  # the drafts it measures
    workload: Any  # runtime.workloads.Workload
    case: Any  # what one pass sends (the backend's own type)
    device: str  # for measure.hardware.hardware_info
    policy: CheckPolicy  # check's thresholds for this engine
    trial_shape: TrialShape  # what a trial costs beside its passes (search.budget)
    fits_costs_from_trials: bool  # its cost model's acceptance comes from the search's first trials
    busy_rule: Callable[[dict[str, Any]], bool] | None  # what counts as busy here (None: the native rule)
    fresh_reference: bool  # `run` ends with check's reference measured in fresh processes (app.reference)

    run_command: str  # the command that makes its profiles (for messages)
    threads: int | None  # the engine's threads, for its busy rule (None: not the engine's to say)
    screens: bool  # a trial can stop after its first prompts (measure.seam.Screen, search.pruning)
    prompt_tokens: int  # the mean length of the prompts it sends, in the target's tokens

    def __enter__(self) -> MeasuringSession: ...

    def __exit__(self, *exc: Any) -> None: ...

    def close(self) -> None:
        """Stop what the session started (servers, workers)."""

    def failure_hint(self, exc: BaseException, os_info: dict[str, Any]) -> str | None:
        """For an error while `check` measured: why, when the engine failed under load ("" when
        the machine was quiet: an error of the setup); None when it is not the engine's failure."""

    # -- what the search needs
    def settings_for(self, settings: TuneSettings, progress: Progress) -> TuneSettings:
        """`settings` as this engine can run them (an engine that drafts a fixed number of tokens
        refuses other gamma policies; `run --for` restricts the drafts)."""

    def content_hash(self) -> str:
        """The target's weights, hashed: a profile written over another target's is refused."""

    def profile_path(self, hardware_slug: str, target_arg: str | None) -> Path:
        """Where its profile goes by default."""

    def study_key(self, hardware_slug: str, settings: TuneSettings, batch_size: int) -> dict[str, Any]:
        """What the study's identity holds beside the space: target, workload, engine, ..."""

    def pass_seconds(self, batch_size: int) -> float:
        """Seconds one plain pass over the workload takes at `batch_size` (untimed warm-up first)."""

    def noise_and_anchors(self) -> tuple[Noise, Anchors]:
        """Plain passes at batch size 1 timed while watching the OS: the machine's noise and anchors."""

    def costs(
        self, max_gamma: int, repeats: int, progress: Progress, batch_sizes: list[int] | None = None,
        carry: Costs | None = None,
    ) -> Costs:  # fmt: skip
        """The engine's costs profile (T_target, C_ver(γ), T_draft, acceptance where known).
        `carry`: the costs of an envelope's first length; what does not change with the context
        may be taken from it instead of measured again."""

    def with_trial_acceptance(self, costs: Costs, result: Any, max_gamma: int) -> Costs:
        """`costs` with each draft's acceptance from the trials of `result` (search.results.TuneResult)."""

    def first_trials(self, max_gamma: int) -> list[dict[str, Any]]:
        """Trial params the search tries first (each draft once, where the costs need it)."""

    def predictor(self) -> Any:
        """A cost model fitted from the trials as they come in (`predict`, `observe`, `rank`,
        `explain`), or None: the closed-form model over the costs profile predicts."""

    def default_configs(self) -> list[Config]:
        """The engine's own default configs, raced in the final round ([] for none)."""

    def flags(self, config: Config, batch_size: int) -> list[str] | None:
        """The exact command-line flags that measured `config` (None: an in-process engine)."""

    def exactness(self, result: Any, case: Any = None) -> dict[str, Any]:
        """How exact its best speculative config was at T = 0 over `case` (default: the session's
        whole case; a search cut by its budget passes the prompts it measured) ({} when exact by
        construction)."""

    def begin(self, settings: TuneSettings, study_key: dict[str, Any]) -> None:
        """Before measuring: what the study's workers agree on (our engine's `--engine auto`)."""

    def use_costs(self, costs: Costs) -> None:
        """Costs measured earlier (`run --costs-from`), or a one-line refusal."""

    def expected_speedup(self, costs: Costs | None, settings: TuneSettings) -> float | None:
        """The cost model's best predicted speedup at `settings.batch_size`, planned on by the budget."""

    def batch_model(self, costs: Costs | None) -> Any:
        """The cost model (search.costmodel.CostModel) the batch table's predictions come from, or None."""

    def engine_fields(self, result: Any, profile_dir: Path, target_arg: str | None) -> EngineFields:
        """What it puts in the profile: target, versions, engine mode, build, exactness, ..."""

    def portable(self, profile: Any, out: Path, target_arg: str | None) -> Any:
        """The profile (store.schema.Profile) with its models named for a file at `out` (store.refs)."""


# name -> the module that opens its session (`open(models, purpose)`); imported on use, so the CLI's
# --help never loads an engine.
BACKENDS: dict[str, str] = {
    "native": "specdec_tune.backends.native",
    "llamacpp": "specdec_tune.backends.llamacpp",
    "vllm": "specdec_tune.backends.vllm",
}
_REGISTERED: dict[str, Any] = {}


def register(name: str, module: Any) -> None:
    """Add a backend: `module` has `open_session(models, purpose)` and `engine_build(models)` (a
    test's scripted engine, a plugin)."""
    _REGISTERED[name] = module


def known_backends() -> list[str]:
    """The backends' names: the built-in ones, then any registered."""
    return [*BACKENDS, *(n for n in _REGISTERED if n not in BACKENDS)]


def _module(name: str) -> Any:
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name not in BACKENDS:
        known = ", ".join(known_backends())
        raise SpecDecError(f"unknown backend '{name}': choose one of {known}")
    return importlib.import_module(BACKENDS[name])


def open_session(models: Models, purpose: Purpose | None = None) -> MeasuringSession:
    """The session of `models.backend`, opened for `purpose`."""
    return _module(models.backend).open_session(models, purpose or Purpose())


def checks_in_session(name: str) -> bool:
    """Whether `check` of a profile measured by backend `name` re-measures and confirms in one
    measuring session (an engine backend: each config in its own server, fresh already), rather than
    with our engine's fresh reference processes (app.reference). The module's `CHECK_IN_SESSION`."""
    return bool(getattr(_module(name), "CHECK_IN_SESSION", True))


def engine_build(models: Models) -> dict[str, Any]:
    """The build of the engine `models.backend` would start (package, binary hash), without starting
    it: `check` refuses another build before measuring anything ({} for an in-process engine)."""
    return _module(models.backend).engine_build(models)
