"""Our own engine as a measuring session: the models in this process (runtime.session), each config's
drafter built on first use (backends.native_pool.DrafterPool), timed by measure.bench / measure.batched.
`check` measures through the same `measure` (a stored config at its batch size, the decode anchor
between the passes at batch size 1) and confirms a doubtful drop in fresh processes (`fresh_reference`)."""

from __future__ import annotations

import dataclasses
import json
import platform
import time
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..checkpolicy import CHECK_POLICY
from ..domain import Anchors, Config, Costs, DraftSpec, Noise
from ..errors import SpecDecError
from ..measure.anchors import measure_twice
from ..measure.backends import NativeBackend
from ..measure.decode_anchor import DecodeAnchor, spec_of
from ..measure.noise import measure_noise
from ..measure.seam import Screen
from ..measurement import Measurement
from ..runtime.models.loading import content_hash, content_hash_like, slugify
from ..runtime.models.shapes import SHAPE_CONTEXT_LEN
from ..runtime.workloads import Case
from ..search.budget import TrialShape
from ..search.costmodel import CostModel
from ..search.space import TuneSettings
from ..serving.capabilities import restrict
from ..store.build import EngineFields
from ..store.refs import make_portable, profile_file_slug
from ..store.schema import Profile, TargetInfo
from .acceptance import acceptance_plan, apply_acceptance
from .base import Models, Progress, Purpose
from .native_costs import acceptance_measured, measure_costs
from .native_pool import DrafterPool
from .shared_study import settle_auto

if TYPE_CHECKING:
    from ..search.results import TuneResult
    from .acceptance import GivenAcceptance

DEFAULT_MAX_GAMMA = 8  # `run --max-gamma`'s default in our engine
NOISE_PASSES = 3  # plain passes timed before a search to know the machine's noise (each a share)
TRIAL_OVERHEAD_S = 0.15  # the study's own bookkeeping per trial (sampler, storage writes)


class NativeSession:
    """The native engine's session (backends.base.MeasuringSession)."""

    name = "native"
    policy = CHECK_POLICY
    fits_costs_from_trials = False  # the costs profile measures acceptance itself
    busy_rule = None
    run_command = "specdec-tune run"
    fresh_reference = True  # check's reference and confirmations: fresh processes (app.reference)
    slices = True  # check measures on the check slice (measure.narrow)
    settle_s = 0.0  # in this process: nothing runs once a pass returns
    screens = False  # prompts are interleaved inside each repeat: a trial is measured whole

    def renew(self) -> bool:
        return False  # backends.protocols.Judged: a confirmation goes to fresh processes (app.reference)

    def __init__(self, models: Models, purpose: Purpose) -> None:
        import torch

        self.models = models
        self.purpose = purpose
        if models.threads is not None:  # `--threads`, a worker's share, a check's fresh process
            torch.set_num_threads(models.threads)
        self.threads = torch.get_num_threads()  # the hardware slug names them
        # `auto` is resolved once per study (`begin`), not by each worker on its own.
        self.auto = models.engine_mode == "auto" and purpose.name == "tune"
        opened = dataclasses.replace(models, engine_mode="eager") if self.auto else models
        if purpose.name == "check":
            self.s = open_stored(opened)
        elif purpose.name == "bench":
            self.s = opened.open(lazy_drafts=False)
        else:
            self.s = opened.open(allow_random=purpose.allow_random)
        layer = [DraftSpec(name=f"layer-skip-{k}", kind="layer_skip", layers=k) for k in purpose.layer_skip]
        self.specs: list[DraftSpec] = list(self.s.specs) + layer
        self.workload, self.case, self.device = self.s.workload, self.s.case, self.s.device
        lengths = [len(p) for p in self.case.prompts] if self.case else [0]
        self.prompt_tokens = round(sum(lengths) / len(lengths))
        self.trial_shape = TrialShape(
            TRIAL_OVERHEAD_S, 2 / max(1, len(self.case.prompts) if self.case else 1)
        )
        self._pool: DrafterPool | None = None
        self._hash: str | None = None
        anchor = purpose.decode_anchor
        self._anchor = DecodeAnchor(anchor, self.device) if anchor is not None else None

    # -- lifecycle
    def __enter__(self) -> NativeSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.free_device_memory()

    def info(self) -> dict[str, Any]:
        return {"name": self.name}

    def failure_hint(self, exc: BaseException, os_info: dict[str, Any]) -> str | None:
        return None  # an error in this process is the error

    # -- the engine's parts
    @property
    def session(self) -> Any:
        """The runtime session (runtime.session.Session): target, drafts, workload, context."""
        return self.s

    @property
    def pool(self) -> DrafterPool:
        if self._pool is None:  # after `begin`: the engine mode decides how drafters are built
            self._pool = DrafterPool(self.specs, self.s.target.model, self.s.draft_model, self.s.ctx)
            self._pool.costs = self.purpose.costs  # a stored config's gamma policy reads them
        return self._pool

    @property
    def backend(self) -> NativeBackend:
        return NativeBackend(self.pool, self._anchor)

    def content_hash(self, like: str = "") -> str:
        if like:  # a stored hash of an older format is compared in its own format
            return content_hash_like(like, self.s.target.path)
        if self._hash is None:
            self._hash = content_hash(self.s.target.path)
        return self._hash

    def settings_for(self, settings: TuneSettings, progress: Progress) -> TuneSettings:
        if settings.serving_engine is not None:  # `run --for`: what that engine runs, with its policies
            specs, notes = restrict(self.specs, settings.serving_engine)
            self.specs = specs
            self.s.specs = [x for x in specs if x.kind != "layer_skip"]  # the drafts the costs measure
            for n in notes:
                progress.note(n)
        return settings

    def profile_path(self, hardware_slug: str, target_arg: str | None) -> Path:
        return Path("profiles") / hardware_slug / f"{profile_file_slug(self.s.target.name)}.yaml"

    def study_key(self, hardware_slug: str, settings: TuneSettings, batch_size: int) -> dict[str, Any]:
        key = {
            "specdec_tune": __version__,
            "hardware": hardware_slug,
            "target_slug": slugify(self.s.target.name),
            "target": self.content_hash(),
            "workload": self.workload.sha256,
            "prompts": len(self.case.prompts),
            "max_new_tokens": self.case.max_new_tokens,
            "temperature": self.case.temperature,
            "dtype": self.s.target.dtype,
            "repeats": settings.repeats,
            "engine_mode": "auto" if self.auto else self.s.engine_mode,
        }
        return key if batch_size == 1 else {**key, "batch_size": batch_size}

    def begin(self, settings: TuneSettings, study_key: dict[str, Any]) -> None:
        """`--engine auto` on a shared study: the mode an earlier worker recorded, else resolved here."""
        if self.auto:
            settle_auto(self.s, self.specs, settings, study_key)

    # -- measuring
    def measure(self, configs: list[Config], case: Case, batch_size: int = 1, repeats: int = 3, seed: int = 0,
                on_repeat: Callable[[int, float], None] | None = None, screen: Screen | None = None) -> list[Measurement]:  # fmt: skip
        return self.backend.measure(configs, case, batch_size, repeats, seed, on_repeat, screen)

    def pass_seconds(self, batch_size: int) -> float:
        from ..measure.bench import run_pass
        from ..runtime.batch import batch_generate

        t0 = time.monotonic()
        if batch_size == 1:
            run_pass(self.s.target.model, None, 0, 0.0, self.case, ctx=self.s.ctx)
        else:
            batch_generate(self.s.target.model, None, self.case, batch_size, 0, ctx=self.s.ctx)
        return time.monotonic() - t0

    def noise_and_anchors(self) -> tuple[Noise, Anchors]:
        """Plain passes (batch size 1) timed while watching the OS: the machine's noise, and its
        anchors (plain tokens/s; copy bandwidth and a small matmul rate, measure.anchors). Each pass
        (and an untimed warm-up) covers 1/NOISE_PASSES of the prompts, so all cost about 1.3 full
        passes; `plain_pass_s` is scaled up to the whole workload."""
        from ..measure.bench import run_pass

        s = self.s
        share = s.case.head(max(1, -(-len(s.case.prompts) // NOISE_PASSES)))
        tokens = []

        def plain_pass() -> float:
            t0 = time.perf_counter()
            out, _ = run_pass(s.target.model, None, 0, 0.0, share, ctx=s.ctx)
            tokens.append(sum(map(len, out)))
            return time.perf_counter() - t0

        # Warm-up on the same prompts, untimed: a static engine captures a graph per new shape there.
        run_pass(s.target.model, None, 0, 0.0, share, ctx=s.ctx)
        # The machine anchors (copy, matmul) before and after the passes, as `check` measures them.
        machine, noise = measure_twice(s.device, lambda: measure_noise(plain_pass, NOISE_PASSES))
        rate = tokens[0] / noise.plain_pass_s
        full_s = noise.plain_pass_s * sum(s.case.max_new_tokens) / max(1, sum(share.max_new_tokens))
        noise = dataclasses.replace(noise, plain_pass_s=round(full_s, 5))
        anchors = Anchors(round(rate, 3), machine.copy_bandwidth_gbps, machine.matmul_gflops)
        anchors.decode_anchor = spec_of(s.target.model)  # its reference: the fresh processes'
        return noise, anchors

    def costs(
        self, max_gamma: int, repeats: int, progress: Progress, batch_sizes: list[int] | None = None,
        context_len: int | None = None, carry: Costs | None = None,
    ) -> Costs:  # fmt: skip
        costs = measure_costs(
            self.s, self.pool, max_gamma, repeats, progress, batch_sizes, context_len, carry
        )
        self.pool.costs = costs  # the costmodel gamma policy looks its gamma up in them
        return costs

    def use_costs(self, costs: Costs) -> None:
        """Costs measured earlier (`run --costs-from`), for the gamma policies."""
        self.pool.costs = costs

    def with_trial_acceptance(self, costs: Costs, result: TuneResult, max_gamma: int) -> Costs:
        return costs

    def first_trials(self, max_gamma: int) -> list[dict[str, Any]]:
        return []

    def predictor(self) -> Any:
        return None  # the closed-form cost model, on the costs profile

    def default_configs(self) -> list[Config]:
        return []  # our engine has no defaults of its own to beat

    def flags(self, config: Config, batch_size: int) -> list[str] | None:
        return None

    def exactness(self, result: TuneResult, case: Case | None = None) -> dict[str, Any]:
        return {}  # greedy output equals the target's own by construction (and by test)

    def expected_speedup(self, costs: Costs | None, settings: TuneSettings) -> float | None:
        """The cost model's best predicted speedup at `settings.batch_size` (None: no costs there)."""
        if costs is None:
            return None
        model = CostModel(costs, self.case.max_new_tokens)
        ranked = model.rank(settings.max_gamma, batch_size=settings.batch_size)
        return ranked[0][2] if ranked else None

    def batch_model(self, costs: Costs | None) -> CostModel | None:
        """The cost model the batch table's predictions come from (None: no costs)."""
        return CostModel(costs, self.case.max_new_tokens) if costs is not None else None

    def engine_fields(self, result: TuneResult, profile_dir: Path, target_arg: str | None) -> EngineFields:
        versions = {"specdec_tune": __version__, "python": platform.python_version()}
        for pkg in ("torch", "transformers", "optuna"):
            try:
                versions[pkg] = version(pkg)
            except PackageNotFoundError:
                versions[pkg] = "unknown"
        t, ctx = self.s.target, self.s.ctx
        target = TargetInfo(t.name, t.path, t.revision, self.content_hash(), t.dtype, t.num_params)
        return EngineFields(
            target=target,
            versions=versions,
            engine_mode=self.s.engine_mode,
            compile_fallbacks=list(ctx.fallbacks),
            engine_choice=ctx.auto.summary() if ctx.auto else None,
            compile=ctx.compile_time(),  # the whole run's graph builds, apart from the timings
        )

    def portable(self, profile: Profile, out: Path, target_arg: str | None) -> Profile:
        """Models named so the profile works from any folder and machine (store.refs)."""
        return make_portable(profile, out, target_arg or self.s.target.name)

    # -- bench and profile
    def check_bench(self, spec: DraftSpec, *, compare_hf: bool, save_outputs: bool) -> None:
        if compare_hf and spec.kind == "hybrid":
            raise SpecDecError("--compare-hf: transformers has no hybrid drafter to compare with")

    def compare_hf(self, config: Config, repeats: int) -> dict[str, Any]:
        """transformers' assisted generation of the same config, timed alike (measure.hfcompare)."""
        from ..measure.hfcompare import HFConfig, measure_hf

        spec = config.draft
        dm = self.s.drafts[spec.name].model if spec.kind == "model" else None
        cfg = HFConfig(spec.kind, config.gamma, config.threshold, dm, spec.ngram_max or 3, spec.layers)
        return measure_hf(self.s.target.model, self.case, cfg, repeats=repeats, ctx=self.s.ctx)

    def outputs_jsonl(self, m: Measurement) -> str:
        """The speculative tokens of measurement `m`, one JSON line per prompt."""
        tok = self.s.target.tokenizer
        lines = [
            json.dumps({"prompt": p.text, "token_ids": ids, "text": tok.decode(ids)})
            for p, ids in zip(self.workload.prompts, m.outputs, strict=True)
        ]
        return "\n".join(lines) + "\n"

    def target_name(self) -> str:
        return self.s.target.name

    def describe(self) -> str:
        return self.device

    def profile_costs(self, max_gamma: int, repeats: int, progress: Progress, *, context_len: int | None,
                      acceptance: GivenAcceptance) -> tuple[Costs, list[int] | None, dict[str, Any]]:  # fmt: skip
        """`profile`: the costs (acceptance measured where both models are trained, else given by
        `acceptance`, backends.acceptance), the workload's budgets and the target's description."""
        measured = {spec.name for spec in self.specs if acceptance_measured(self.s, spec)}
        plan, notes = acceptance_plan(acceptance, self.specs, measured)
        if context_len is None and self.case is None:
            context_len = SHAPE_CONTEXT_LEN
        costs = self.costs(max_gamma, repeats, progress, context_len=context_len)
        apply_acceptance(costs, plan, max_gamma)
        for note in notes:
            progress.note(note)
        t = self.s.target
        target = {"name": t.name, "dtype": t.dtype, "num_params": t.num_params, "weights": t.weights}
        if t.shape:
            target["shape"] = t.shape
        return costs, self.case.max_new_tokens if self.case is not None else None, target


def open_stored(models: Models) -> Any:
    """What a stored profile names, loaded for `check`. Whatever the loaders raise for a folder the
    profile points at (a broken config.json, a tokenizer that will not build) is the profile's
    problem: exit 2."""
    try:
        return models.open(lazy_drafts=False)
    except (SpecDecError, MemoryError):
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise SpecDecError(
            f"could not load the models or workload the profile names ({type(exc).__name__}: {first})"
        ) from None


def engine_build(models: Models) -> dict[str, Any]:
    return {}  # the versions in the profile say which software measured


def open_session(models: Models, purpose: Purpose) -> NativeSession:
    return NativeSession(models, purpose)
