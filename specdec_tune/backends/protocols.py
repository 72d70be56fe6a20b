"""The measuring session, one small Protocol per concern, in the manner of transformers'
`CandidateGenerator` (two verbs) and llama.cpp's begin / draft / accept: what a session measures
(`Measures`, over `measure.seam.MeasuringBackend`, whose `screens` declares whether a trial can stop
after its first prompts), how it starts and stops (`Lifecycle`), how `check` judges it (`Judged`),
what it says about itself and puts in a profile (`Reports`), what `bench` and `profile` ask beside
measuring (`Benches`), and the search's hooks (`SearchHooks`). A use case asks for the ones it
needs; `MeasuringSession` is all of them, what a backend that runs every use case implements.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..checkpolicy import CheckPolicy
from ..domain import Anchors, Config, Costs, DraftSpec, Noise
from ..measure.seam import Case, MeasuringBackend
from ..measurement import Measurement
from ..search.budget import TrialShape
from ..search.space import TuneSettings
from ..store.build import EngineFields
from ..store.schema import Profile

if TYPE_CHECKING:
    from ..runtime.workloads import Workload
    from ..search.costmodel import CostModel
    from ..search.results import TuneResult
    from .acceptance import GivenAcceptance


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


class Measures(MeasuringBackend, Protocol):
    """What a session measures: configs against the engine's own plain decoding (`measure`), a plain
    pass, the machine's noise and anchors, and the cost profile."""

    specs: list[DraftSpec]  # the drafts it measures
    workload: Workload
    case: Case  # what one pass sends (the backend's own type)
    device: str  # for measure.hardware.hardware_info
    prompt_tokens: int  # the mean length of the prompts it sends, in the target's tokens
    threads: int | None  # the engine's threads (its busy rule; check's fresh processes run as many)

    def pass_seconds(self, batch_size: int) -> float:
        """Seconds one plain pass over the workload takes at `batch_size` (untimed warm-up first)."""
        ...

    def noise_and_anchors(self) -> tuple[Noise, Anchors]:
        """Plain passes at batch size 1 timed while watching the OS: the machine's noise and anchors."""
        ...

    def costs(
        self, max_gamma: int, repeats: int, progress: Progress, batch_sizes: list[int] | None = None,
        carry: Costs | None = None,
    ) -> Costs:  # fmt: skip
        """The engine's costs profile (T_target, C_ver(γ), T_draft, acceptance where known).
        `carry`: the costs of an envelope's first length; what does not change with the context
        may be taken from it instead of measured again."""
        ...

    def use_costs(self, costs: Costs) -> None:
        """Costs measured earlier (`run --costs-from`), or a one-line refusal."""
        ...


class Lifecycle(Protocol):
    """How a session starts and stops: a context manager whose `close` stops whatever it started
    (servers, workers); an engine failure it can explain is one line, not a traceback."""

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> bool | None: ...

    def close(self) -> None:
        """Stop what the session started."""
        ...

    def failure_hint(self, exc: BaseException, os_info: dict[str, Any]) -> str | None:
        """For an error while `check` measured: why, when the engine failed under load ("" when
        the machine was quiet: an error of the setup); None when it is not the engine's failure."""
        ...


class Judged(Protocol):
    """What `check` reads of the engine beside its measurements: the thresholds it is judged by,
    how a doubtful drop is confirmed, what counts as busy here, and its target's weights."""

    policy: CheckPolicy  # check's thresholds for this engine
    # A doubtful drop of a profile with a fresh-process reference is confirmed in fresh processes
    # (app.reference; `run` records that reference too): an engine in this process, whose absolute
    # rate differs from one process to the next. False: in this session (a server per config is a
    # fresh process already).
    fresh_reference: bool
    # `check` measures on the check slice (measure.narrow: one engine thread on the core other
    # processes use least), against a reference `run` measured there in fresh processes: a load on
    # the other cores then cannot reach the verdict. False: an engine that places its own threads
    # (vLLM's CPU worker binds itself to its cores).
    slices: bool
    busy_rule: Callable[[dict[str, Any]], bool] | None  # what counts as busy here (None: the OS rule)
    run_command: str  # the command that makes its profiles (for messages)
    # Seconds the engine's processes keep a core busy after their last request, waited before the
    # machine anchors are measured (vLLM's workers poll their queue for a second: 0.5 s after a
    # request the matmul anchor read 16.8 GFLOP/s against 199). 0: the engine lets go at once.
    settle_s: float

    def renew(self) -> bool:
        """Before a doubtful drop is measured again in this session: stop the engine's processes
        so that the confirmation runs in new ones, where one process's speed differs from
        another's by more than a verdict absorbs (vLLM's servers: the same config read 3.15x and
        3.45x in two fresh server pairs against 3.23x stored). Returns whether it did; False (in
        this process, or an engine whose confirmation stays in its processes) changes nothing."""
        ...

    def content_hash(self, like: str = "") -> str:
        """The target's weights, hashed (in the format of a stored hash `like`, where it has one):
        a profile written over another target's is refused, a changed target fails `check`."""
        ...


class Reports(Protocol):
    """What a session says about itself and puts in a profile."""

    def target_name(self) -> str:
        """The target as the user named it."""
        ...

    def describe(self) -> str:
        """Where it measures, for `bench`'s output (a device, an engine build)."""
        ...

    def profile_path(self, hardware_slug: str, target_arg: str | None) -> Path:
        """Where its profile goes by default."""
        ...

    def flags(self, config: Config, batch_size: int) -> list[str] | None:
        """The exact command-line flags that measured `config` (None: an in-process engine)."""
        ...

    def exactness(self, result: TuneResult, case: Case | None = None) -> dict[str, Any]:
        """How exact its best speculative config was at T = 0 over `case` (default: the session's
        whole case) ({} when exact by construction)."""
        ...

    def engine_fields(self, result: TuneResult, profile_dir: Path, target_arg: str | None) -> EngineFields:
        """What it puts in the profile: target, versions, engine mode, `BackendInfo`, ..."""
        ...

    def portable(self, profile: Profile, out: Path, target_arg: str | None) -> Profile:
        """The profile (store.schema.Profile) with its models named for a file at `out` (store.refs)."""
        ...


class Benches(Protocol):
    """What `bench` and `profile` ask beside measuring (a refusal is a SpecDecError)."""

    def check_bench(self, spec: DraftSpec, *, compare_hf: bool, save_outputs: bool) -> None:
        """Refuse what this engine cannot do for `bench` before anything is measured."""
        ...

    def compare_hf(self, config: Config, repeats: int) -> dict[str, Any]:
        """transformers' assisted generation of the same config, timed alike."""
        ...

    def outputs_jsonl(self, m: Measurement) -> str:
        """The speculative tokens of measurement `m`, one JSON line per prompt."""
        ...

    def profile_costs(
        self,
        max_gamma: int,
        repeats: int,
        progress: Progress,
        *,
        context_len: int | None,
        acceptance: GivenAcceptance,
    ) -> tuple[Costs, list[int] | None, dict[str, Any]]:
        """`profile`: the costs, the workload's reply budgets and the target's description."""
        ...


class SearchHooks(Protocol):
    """What the search asks of the engine beside measuring: its settings, the study's identity,
    the first trials, a fitted cost model, its own defaults, what a trial costs."""

    trial_shape: TrialShape  # what a trial costs beside its passes (search.budget)
    fits_costs_from_trials: bool  # its cost model's acceptance comes from the search's first trials

    def settings_for(self, settings: TuneSettings, progress: Progress) -> TuneSettings:
        """`settings` as this engine can run them (an engine that drafts a fixed number of tokens
        refuses other gamma policies; `run --for` restricts the drafts)."""
        ...

    def study_key(self, hardware_slug: str, settings: TuneSettings, batch_size: int) -> dict[str, Any]:
        """What the study's identity holds beside the space: target, workload, engine, ..."""
        ...

    def begin(self, settings: TuneSettings, study_key: dict[str, Any]) -> None:
        """Before measuring: what the study's workers agree on (our engine's `--engine auto`)."""
        ...

    def with_trial_acceptance(self, costs: Costs, result: TuneResult, max_gamma: int) -> Costs:
        """`costs` with each draft's acceptance from the trials of `result` (search.results.TuneResult)."""
        ...

    def first_trials(self, max_gamma: int) -> list[dict[str, Any]]:
        """Trial params the search tries first (each draft once, where the costs need it)."""
        ...

    def predictor(self) -> Any:
        """A cost model fitted from the trials as they come in (`predict`, `observe`, `rank`,
        `explain`), or None: the closed-form model over the costs profile predicts."""
        ...

    def default_configs(self) -> list[Config]:
        """The engine's own default configs, raced in the final round ([] for none)."""
        ...

    def expected_speedup(self, costs: Costs | None, settings: TuneSettings) -> float | None:
        """The cost model's best predicted speedup at `settings.batch_size`, planned on by the budget."""
        ...

    def batch_model(self, costs: Costs | None) -> CostModel | None:
        """The cost model (search.costmodel.CostModel) the batch table's predictions come from, or None."""
        ...


class CheckSession(Measures, Lifecycle, Judged, Protocol):
    """What `check` needs of a session: measuring, its lifecycle and how it is judged."""


class MeasuringSession(Measures, Lifecycle, Judged, Reports, Benches, SearchHooks, Protocol):
    """An engine opened for every use case: `tune`, `bench`, `profile` and `check`."""


@runtime_checkable
class Schedules(Protocol):
    """An engine whose answer over batch sizes is a schedule it runs itself (vLLM's
    `num_speculative_tokens_per_batch_size`): a session that implements it writes the schedule from
    the measured rows and measures it as a config of its own; others leave the rows as the answer."""

    def batch_schedule(
        self, results: dict[int, TuneResult], case: Case, repeats: int
    ) -> dict[str, Any] | None:
        """The schedule and its measured rows (BackendInfo.schedule), or None: nothing to schedule."""
        ...

    def schedule_seconds(self, pass_by_b: dict[int, float], repeats: int) -> float:
        """About how long `batch_schedule` takes, planned before the search from one plain pass's
        seconds at each batch size: the budget keeps it (app.session_plan)."""
        ...
