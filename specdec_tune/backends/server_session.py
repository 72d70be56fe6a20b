"""What every engine that runs as servers does alike as a measuring session (llama.cpp, vLLM): its
lifecycle (servers tied to the command), the study's identity, the machine's noise over plain
passes, acceptance and exactness from what the trials measured, and the refusals of what only our
own engine does. A server engine's session subclasses `ServerSession` and says how it starts its
servers, sends a plain pass, measures its costs and what it puts in a profile.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, TypeVar

from ..domain import Anchors, Config, Costs, DraftSpec, Noise
from ..errors import SpecDecError
from ..measure.anchors import measure_twice
from ..measure.llamacpp.costs import with_acceptance
from ..measure.noise import measure_noise
from ..measure.servers import servers_die_with_us
from ..measure.timing import median
from ..measurement import Measurement
from ..search.enginepredictor import EnginePredictor
from ..search.results import TuneResult
from ..search.space import TuneSettings
from .protocols import Progress

NOISE_PASSES = 3
COMPARE_HF = "--compare-hf compares our own engine with transformers"
SAVE_OUTPUTS = "--save-outputs writes our own engine's tokens"
S = TypeVar("S", bound="ServerSession")


class ServerSession:
    """The part of a server engine's session (backends.protocols.MeasuringSession) that does not
    depend on the engine. A subclass sets `name`, `title`, `backend` (what measures: `measure`,
    `info`, `flags`, `exactness`, `close`), `target` (`name`, `content_hash`), `workload`, `case`, and
    implements `_plain_pass(case)`: one untimed-or-timed plain pass at B = 1, its tokens/s."""

    name: str
    title: str  # the engine as people write it, for messages ("llama.cpp", "vLLM")
    target_dtype: str  # the target's weights as `profile` describes them
    specs: list[DraftSpec]
    backend: Any
    target: Any
    workload: Any
    case: Any
    _stack: contextlib.ExitStack | None = None
    settle_s: float = 0.0  # backends.protocols.Judged: the engine's, where its processes poll on

    # -- lifecycle
    def __enter__(self: S) -> S:
        return self

    def __exit__(self, *exc: object) -> Any:
        self.close()
        stack, self._stack = self._stack, None
        return stack.__exit__(*exc) if stack is not None else None

    def close(self) -> None:
        self.backend.close()

    def renew(self) -> bool:
        return False  # backends.protocols.Judged: an engine's servers are kept by default

    def info(self) -> dict[str, Any]:
        """Which engine measured: its name, build and settings."""
        return self.backend.info()

    # -- what the search needs
    def content_hash(self, like: str = "") -> str:
        return self.target.content_hash

    def study_key(self, hardware_slug: str, settings: TuneSettings, batch_size: int) -> dict[str, Any]:
        return {
            "backend": self.study_backend(),
            "hardware": hardware_slug,
            "target": self.target.content_hash,
            "workload": self.workload.sha256,
            "prompts": len(self.case.prompts),
            "max_new_tokens": max(self.case.max_new_tokens),
            "temperature": self.case.temperature,
            "repeats": settings.repeats,
            "batch_size": batch_size,
        }

    def study_backend(self) -> dict[str, Any]:
        """What of the engine a study's identity holds (what changes the answer)."""
        return self.backend.info()

    def begin(self, settings: TuneSettings, study_key: dict[str, Any]) -> None:
        """Nothing to agree on with other workers: each server is started with its flags."""

    def use_costs(self, costs: Costs) -> None:
        raise SpecDecError(f"--costs-from holds costs of our own engine; {self.title} measures its own")

    def predictor(self) -> EnginePredictor:
        """The engine's cost model (search.enginemodel), fitted from the trials' own decode timings
        as they come in."""
        return EnginePredictor()

    def expected_speedup(self, costs: Costs | None, settings: TuneSettings) -> float | None:
        return None  # planned as plain until trials fit the model (trial_shape.plans_speedup)

    def batch_model(self, costs: Costs | None) -> Any:
        return None  # the cost surface over B is not measured in the engine

    # -- measuring
    def measure(self, configs: list[Config], case: Any, batch_size: int = 1, repeats: int = 3, seed: int = 0,
                on_repeat: Callable[[int, float], None] | None = None, screen: Any = None) -> list[Measurement]:  # fmt: skip
        return self.backend.measure(configs, case, batch_size, repeats, seed, on_repeat, screen)

    def _plain_pass(self, case: Any) -> float:
        raise NotImplementedError

    def costs(
        self, max_gamma: int, repeats: int, progress: Progress, batch_sizes: list[int] | None = None,
        carry: Costs | None = None,
    ) -> Costs:  # fmt: skip
        raise NotImplementedError

    def first_trials(self, max_gamma: int) -> list[dict[str, Any]]:
        raise NotImplementedError

    def noise_and_anchors(self) -> tuple[Noise, Anchors]:
        """The plain server's passes (batch size 1) timed while watching the OS: the machine's
        noise, and its anchors (the server's plain decode tokens/s; copy bandwidth and a small
        matmul rate, measure.anchors, as `check` measures them). Each pass covers 1/NOISE_PASSES of
        the prompts, two at most (the least a trial measures: at a long context each prompt more is
        a prefill more), after an untimed one that fills the server's prompt cache; `plain_pass_s`
        is scaled up to the whole workload. The server is a child of this process, so the OS's
        "other processes" never count it."""
        share = self.case.head(min(2, max(1, -(-len(self.case.prompts) // NOISE_PASSES))))
        self._plain_pass(share)
        rates: list[float] = []

        def plain_pass() -> float:
            t0 = time.perf_counter()
            rates.append(self._plain_pass(share))
            return time.perf_counter() - t0

        work = lambda: measure_noise(plain_pass, NOISE_PASSES)  # noqa: E731
        machine, noise = measure_twice("cpu", work, settle_s=self.settle_s)
        full_s = noise.plain_pass_s * sum(self.case.max_new_tokens) / max(1, sum(share.max_new_tokens))
        noise = replace(noise, plain_pass_s=round(full_s, 5))
        return noise, Anchors(round(median(rates), 3), machine.copy_bandwidth_gbps, machine.matmul_gflops)

    # -- what the trials measured
    def with_trial_acceptance(self, costs: Costs, result: TuneResult, max_gamma: int) -> Costs:
        return with_acceptance(costs, trial_acceptance(result), max_gamma)

    def flags(self, config: Config, batch_size: int) -> list[str] | None:
        return self.backend.flags(config, batch_size)

    def exactness(self, result: TuneResult, case: Any = None) -> dict[str, Any]:
        """At T = 0: the best speculative config's tokens against the plain server's, per prompt of
        `case` (the prompts the search measured: its first pass checked them already, so this
        costs no request; the whole workload's would cost a prefill each at a long context)."""
        case = case or self.case
        best = next((r for r in result.results if r.config.gamma > 0), None)
        if best is None or case.temperature != 0:
            return {}
        e = self.backend.exactness(best.config, case)
        out = {
            "config": best.config.label,
            "prompts": e["prompts"],
            "identical": e["prompts"] - e["mismatches"],
        }
        if "near_ties" in e:
            out["near_ties"] = e["near_ties"]
        return {**out, "first_divergence": e["first_divergence"], "token_exact": e["mismatches"] == 0}

    # -- bench: what only our own engine does
    def _ours_only(self, what: str) -> SpecDecError:
        return SpecDecError(f"{what}: drop --backend {self.name}")

    def check_bench(self, spec: DraftSpec, *, compare_hf: bool, save_outputs: bool) -> None:
        if compare_hf:
            raise self._ours_only(COMPARE_HF)
        if save_outputs:
            raise self._ours_only(SAVE_OUTPUTS)

    def compare_hf(self, config: Config, repeats: int) -> dict[str, Any]:
        raise self._ours_only(COMPARE_HF)

    def outputs_jsonl(self, m: Measurement) -> str:
        raise self._ours_only(SAVE_OUTPUTS)

    def target_name(self) -> str:
        return self.target.name

    def profile_costs(
        self, max_gamma: int, repeats: int, progress: Progress, *, context_len: int | None, acceptance: Any
    ) -> tuple[Costs, list[int] | None, dict[str, Any]]:
        """`profile --backend X`: the engine's costs (`costs`), and each draft's acceptance from one
        pass at its first trial's γ (`first_trials`)."""
        costs = self.costs(max_gamma, repeats, progress)
        measured = {}
        for i, params in enumerate(self.first_trials(max_gamma)):
            spec = next(d for d in self.specs if d.name == params["draft"])
            progress.stage(f"acceptance of {spec.name}", (i + 1) / (len(self.specs) + 1))
            config = Config(spec, params["gamma"], params.get("threshold", 0.0))
            (m,) = self.backend.measure([config], self.case, 1, 1)
            if m.metrics.acceptance_rate > 0:
                measured[spec.name] = (
                    m.metrics.acceptance_rate,
                    m.metrics.mean_accepted_len,
                    m.metrics.tokens_per_s,
                )
        costs = with_acceptance(costs, measured, max_gamma)
        target = {"name": self.target.name, "dtype": self.target_dtype, "num_params": 0, "weights": "trained"}
        target["backend"] = self.info()
        return costs, list(self.case.max_new_tokens), target


def trial_acceptance(result: TuneResult) -> dict[str, tuple[float, float, float]]:
    """Each draft's measured (alpha, tau, tokens/s) in its best trial so far."""
    out: dict[str, tuple[float, float, float]] = {}
    for r in result.results:
        m = r.metrics
        if r.config.gamma > 0 and r.config.draft.name not in out and m.acceptance_rate > 0:
            out[r.config.draft.name] = (m.acceptance_rate, m.mean_accepted_len, m.tokens_per_s)
    return out


def open_tied(make: Callable[[], S], *contexts: contextlib.AbstractContextManager[Any]) -> S:
    """`make()`'s session with its servers tied to this command (stopped on exit, Ctrl-C and SIGTERM)
    and the engine's own `contexts` (a server failure outside a trial as one line) entered for its
    whole life."""
    stack = contextlib.ExitStack()
    stack.enter_context(servers_die_with_us())
    for c in contexts:
        stack.enter_context(c)
    try:
        session = make()
    except BaseException:
        if not stack.__exit__(*sys.exc_info()):
            raise
        raise
    session._stack = stack
    return session


@contextlib.contextmanager
def failures_as_one_line(error: type[BaseException], hint: Callable[[], str] = lambda: "") -> Iterator[None]:
    """An engine `error` outside a trial ends the command with one line (SpecDecError), with `hint()`."""
    try:
        yield
    except error as exc:
        more = hint()
        raise SpecDecError(f"{exc}" + (f"; {more}" if more else "")) from None
