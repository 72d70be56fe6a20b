"""A third backend for the tests: a scripted in-memory engine behind the measuring session
(specdec_tune.backends.base), with no model and no server. Its "engine" decodes at a fixed plain
rate and a speculative config's speedup is a known function of its draft and gamma, so a test can
say what `run`, `check` and `bench` must find. It is registered by name (`backends.base.register`),
exactly as a vLLM or SGLang backend would be, and the pipeline has no branch for it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from specdec_tune.backends.base import Models, Progress, Purpose
from specdec_tune.checkpolicy import CHECK_POLICY
from specdec_tune.domain import Anchors, Config, Costs, DraftCosts, DraftSpec, Metrics, Noise
from specdec_tune.limits import check_context
from specdec_tune.measurement import Measurement
from specdec_tune.runtime.contexts import workload_as_sent
from specdec_tune.runtime.workloads import Workload, load_workload, stratified
from specdec_tune.search.budget import TrialShape
from specdec_tune.store.build import EngineFields
from specdec_tune.store.schema import BackendInfo, TargetInfo

NAME = "fake"
PLAIN_TOKENS_PER_S = 100.0
# The scripted engine's truth: speedup = base x gamma-curve, best at gamma 5 for "copy".
DRAFTS = {"copy": 1.8, "guess": 1.1}
BEST_GAMMA = 5
DEFAULT_GAMMA = 12  # the engine's own default, raced in the final round
BUILD = {"package": "fake-engine 1.0", "binary_sha256": "sha256:fake"}
# What a test may change: the build the next session reports, a slowdown of every config.
# "screened": (config label, went on) of every trial screened on its first prompts.
SCRIPT: dict[str, Any] = {
    "build": dict(BUILD),
    "slowdown": 1.0,
    "measured": [],
    "screened": [],
    "carried": [],
    "renews": False,
    "renewed": 0,
}


POSITIONS = 8192  # the scripted target's trained positions: a longer context is left out


def true_speedup(config: Config, batch_size: int = 1, context_length: int = 0) -> float:
    """At context length L, "copy" loses as L grows and "guess" gains: the best draft changes along L."""
    if config.gamma == 0:
        return 1.0
    base = DRAFTS[config.draft.name]
    if context_length and config.draft.name == "copy":
        base *= 1 - context_length / POSITIONS
    elif context_length:
        base += context_length / POSITIONS
    curve = 1.0 - 0.04 * abs(config.gamma - BEST_GAMMA)
    return max(0.3, base * curve / (1 + 0.1 * (batch_size - 1))) / SCRIPT["slowdown"]


@dataclass
class FakeCase:
    prompts: list[str]
    max_new_tokens: list[int]
    temperature: float = 0.0
    context_length: int = 0

    def head(self, n: int) -> FakeCase:
        return FakeCase(self.prompts[:n], self.max_new_tokens[:n], self.temperature, self.context_length)

    def pick(self, indices: list[int], max_new_tokens: int | None = None) -> FakeCase:
        picked = [self.prompts[i] for i in indices]
        cap = max_new_tokens or max(self.max_new_tokens, default=0)
        budgets = [min(self.max_new_tokens[i], cap) for i in indices]
        return FakeCase(picked, budgets, self.temperature, self.context_length)


def count_words(text: str) -> int:
    """The scripted engine's tokenizer: a token per whitespace-separated word."""
    return len(text.split())


class FakeSession:
    name = NAME
    device = "cpu"
    policy = CHECK_POLICY
    trial_shape = TrialShape(overhead_s=0.0, warmup_passes=0.0)
    fits_costs_from_trials = False
    fresh_reference = False
    slices = False
    settle_s = 0.0
    busy_rule = None
    run_command = "specdec-tune run --backend fake"
    threads = None
    screens = True  # a trial's first prompts are reported before the rest (measure.seam.Screen)

    def renew(self) -> bool:  # "renews": an engine confirming in new processes (vLLM's servers)
        SCRIPT["renewed"] += SCRIPT["renews"]
        return SCRIPT["renews"]

    def __init__(self, models: Models, purpose: Purpose) -> None:
        given = models.drafts if models.drafts is not None else list(DRAFTS)
        self.specs = [
            d
            if isinstance(d, DraftSpec)
            else DraftSpec(name=d, kind="prompt_lookup", ngram_min=1, ngram_max=3)
            for d in given
        ]
        wl: Workload = load_workload(models.workload)
        wl.prompts = stratified(wl.prompts, models.prompts or 4)
        self.workload = wl
        if models.context_length is not None:
            check_context(models.context_length, models.max_new_tokens, POSITIONS, "the fake target")
        sent = workload_as_sent(wl, models.context_length, count_words)
        texts = [p.text for p in sent.prompts]
        self.case = FakeCase(texts, [models.max_new_tokens] * len(texts), 0.0, models.context_length or 0)
        self.prompt_tokens = round(sum(count_words(t) for t in texts) / len(texts))
        self.build = dict(SCRIPT["build"])
        self.closed = False

    def __enter__(self) -> FakeSession:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self.closed = True

    def info(self) -> dict[str, Any]:
        return {"name": NAME, "build": dict(self.build)}

    def failure_hint(self, exc: BaseException, os_info: dict[str, Any]) -> str | None:
        return None

    def settings_for(self, settings: Any, progress: Progress) -> Any:
        return settings

    def content_hash(self, like: str = "") -> str:
        return "sha256:fakeweights00000"

    def profile_path(self, hardware_slug: str, target_arg: str | None) -> Path:
        return Path("profiles") / hardware_slug / "fake.fake.yaml"

    def study_key(self, hardware_slug: str, settings: Any, batch_size: int) -> dict[str, Any]:
        return {
            "backend": NAME,
            "hardware": hardware_slug,
            "batch_size": batch_size,
            "repeats": settings.repeats,
        }

    def begin(self, settings: Any, study_key: dict[str, Any]) -> None:
        pass

    def measure(
        self, configs, case, batch_size=1, repeats=3, seed=0, on_repeat=None, screen=None
    ) -> list[Any]:
        out = []
        for c in configs:
            s = true_speedup(c, batch_size, case.context_length)
            if screen is not None and c.gamma > 0:
                SCRIPT["screened"].append([c.label, False])
                screen.report(screen.prompts, s)  # the pruner may stop it here
                SCRIPT["screened"][-1][1] = True
            # a deterministic wobble of 0.5 % per repeat, so intervals have a width
            speedups = [s * (1 + 0.005 * ((r % 3) - 1)) for r in range(repeats)]
            for r, x in enumerate(speedups):
                if on_repeat is not None:
                    on_repeat(r, x)
            plain = PLAIN_TOKENS_PER_S  # a slowdown is the speculative side's: a regression
            metrics = Metrics(
                tokens_per_s=plain * s, baseline_tokens_per_s=plain, speedup=s, speedup_spread=0.01,
                acceptance_rate=0.0 if c.gamma == 0 else 0.7, mean_accepted_len=1.0 + (0.7 * c.gamma if c.gamma else 0),
                repeats=repeats,
            )  # fmt: skip
            SCRIPT["measured"].append((c.label, batch_size))
            SCRIPT["budgets"].append(list(case.max_new_tokens))
            out.append(Measurement(metrics, tokens=0, mismatches=0, speedups=speedups))
        return out

    def pass_seconds(self, batch_size: int) -> float:
        return 0.01

    def noise_and_anchors(self) -> tuple[Noise, Anchors]:
        return Noise(0.01, 0.002, 3, 2), Anchors(PLAIN_TOKENS_PER_S, None, None)

    def costs(
        self, max_gamma: int, repeats: int, progress: Progress, batch_sizes: list[int] | None = None,
        carry: Costs | None = None,
    ) -> Costs:  # fmt: skip
        # which length's costs each session was handed (the envelope carries its first length's)
        SCRIPT["carried"].append((self.case.context_length, carry.context_len if carry else None))
        costs = Costs(
            10.0, 0.01, [10.0 + 0.5 * g for g in range(1, max_gamma + 1)], 0.01,
            self.case.context_length or 64, engine_mode="eager",
        )  # fmt: skip
        for name in DRAFTS:
            costs.drafts.append(
                DraftCosts(name, 0.0, 0.0, 0.7, [0.7] * max_gamma, acceptance_source="measured")
            )
        return costs

    def use_costs(self, costs: Costs) -> None:
        pass

    def with_trial_acceptance(self, costs: Costs, result: Any, max_gamma: int) -> Costs:
        return costs

    def first_trials(self, max_gamma: int) -> list[dict[str, Any]]:
        return []

    def predictor(self) -> Any:
        return None

    def default_configs(self) -> list[Config]:
        """The scripted engine's own default: `copy` at gamma 12, slower than the best."""
        copy = next((d for d in self.specs if d.name == "copy"), None)
        return [Config(copy, DEFAULT_GAMMA)] if copy is not None else []

    def flags(self, config: Config, batch_size: int) -> list[str] | None:
        return (
            ["fake-server", "--draft", config.draft.name, "--n", str(config.gamma)]
            if config.gamma
            else ["fake-server"]
        )

    def exactness(self, result: Any, case: Any = None) -> dict[str, Any]:
        return {"token_exact": True}

    def expected_speedup(self, costs: Costs | None, settings: Any) -> float | None:
        return None

    def batch_model(self, costs: Costs | None) -> Any:
        return None

    def engine_fields(self, result: Any, profile_dir: Path, target_arg: str | None) -> EngineFields:
        return EngineFields(
            target=TargetInfo("fake", "fake", None, self.content_hash(), "fake", 0),
            versions={"fake-engine": "1.0"},
            backend=BackendInfo(NAME, dict(self.build)),
        )

    def portable(self, profile: Any, out: Path, target_arg: str | None) -> Any:
        return profile

    def check_bench(self, spec: DraftSpec, *, compare_hf: bool, save_outputs: bool) -> None:
        pass

    def compare_hf(self, config: Config, repeats: int) -> dict[str, Any]:
        raise NotImplementedError

    def outputs_jsonl(self, m: Any) -> str:
        return ""

    def target_name(self) -> str:
        return "fake"

    def describe(self) -> str:
        return "fake engine"

    def profile_costs(
        self, max_gamma: int, repeats: int, progress: Progress, *, context_len: int | None, acceptance: Any
    ) -> tuple[Costs, list[int] | None, dict[str, Any]]:
        costs = self.costs(max_gamma, repeats, progress)
        return costs, list(self.case.max_new_tokens), {"name": "fake", "dtype": "fake", "num_params": 0}


class FakeModule:
    """What `backends.base.register` takes: the backend's two entry points."""

    sessions: ClassVar[list[FakeSession]] = []
    DEFAULT_MAX_GAMMA = 8  # `run --max-gamma`'s default here

    @classmethod
    def open_session(cls, models: Models, purpose: Purpose) -> FakeSession:
        s = FakeSession(models, purpose)
        cls.sessions.append(s)
        return s

    @staticmethod
    def engine_build(models: Models) -> dict[str, Any]:
        return dict(SCRIPT["build"])
