"""The tuner's predictor over the engine cost model (search.enginemodel), and its carry along an
envelope's context lengths.

A length that is raced, not searched (app.envelope: a confirming length), runs no trial, so a model
fitted from its own trials has nothing to say there. It is given the first length's fitted model,
carried to this length by what the cost pass measured at both (`carried_model`):

- T_target is the plain decode time the cost pass measured at this length (not the first length's
  scaled by a ratio of two cost passes: the first cost pass of a run measured 11.5 ms where its
  trials' plain side measured 9.1, and every carried prediction inherited that 26 %);
- the cost per drafted token verified (k) grows by what the slope of prompt processing grew: the
  raw slope of C_ver(γ) (γ + 1 tokens after the length's own prompt, cached, `Costs.verify_raw_ms`)
  at this length minus the first's. That slope tracks the server's own k closely (fitted from
  trials at 272 / 2 069 / 6 096 tokens: 4.8 / 9.1 / 21.6 ms; raw slopes 3.9 / 8.6 / 19.0 ms), and a
  difference does not multiply the first length's noise: scaled by the ratio of the anchored
  slopes, a short length's slope measured 25 % low made k 3.4x at 2 048 tokens where the trials
  there fitted 2.4x, and the carried predictions 10-24 % low. Without raw curves (older costs), k
  scales as the anchored slope did;
- the cost per verification step (c) and a draft model's cost per forward scale as T_target and
  T_draft did;
- acceptance (q, α per draft) stays the first length's: how it moves with the context is what the
  race there measures, and what the prediction's error then shows.

The final round is never fed to the model, so a carried prediction is out of sample.

A batch size above one is predicted from the same model (`BatchedPredictor`): B rows decode in one
forward a step, so a row-forward costs the plain pass's wall ms per token at B (t_B, its own
baseline trial's, measured before anything speculative at B). Coverage, acceptance and the drafted
length per emitted token are the B = 1 model's (at T = 0 a slot generates the same text as one
request alone):

    ms per token = F t_B + S c + D k_B      speedup = t_B / ms

k_B, a drafted token verified at B, is the B = 1 fit's k plus what the engine's own C_ver(B, γ)
says one more drafted token costs a row at B beyond what it costs at B = 1 (`verify_extra_ms`: the
slope of C_ver(B, γ) over γ, per row, minus the slope of C_ver(1, γ); both raw, as the engine
measured them, so a path the prefill takes and a decode step does not cancels out; a difference, as
along L, so that a B = 1 fit of k = 0 still grows). Where the costs have no C_ver at B, k_B is k: a
forward over more tokens is compute on a CPU, and batching the rows did not make a token cheaper
in llama.cpp (plain decoding at B = 4 made 122 tokens/s against 111 at B = 1 with 256 tokens of
context, and fewer at 2 048).

What the forward explains in vLLM is little. SmolLM2 on a 2-core AVX-512 CPU in bfloat16 (stop
66): C_ver(16, γ) rose 22.5 ms a γ (1.4 ms a drafted token a row), C_ver(4, γ) 2.2 ms, C_ver(1, γ)
not at all (k fitted 0); `ngram:4` γ 5 measured 1.06x at B = 4 and 1.01x at B = 16 where this
predicted 2.02x and 1.63x. Two things the model does not have: vLLM accepted fewer of the same
draft's tokens there (0.76 of those proposed at B = 4 and 16, 0.92 at B = 1; τ 2.13 against 3.88),
and a speculative batch step at B = 4 (8.5 tokens at 11.2 ms) cost about 48 ms more than a plain
one (4 tokens at 11.8 ms), of which the forward (C_ver(4, 5) - C_ver(4, 0)) is about 10: the rest
is per step on the host (no async scheduling in a speculative server, the proposer, the rejection
sampler), which no cost pass here measures yet.

No speculative measurement at B is fed to it, so its predictions there are out of sample. On a GPU,
where a batched verification is memory-bound until it is not, k_B departs from k both ways: what
the measured C_ver(B, γ) is for.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Protocol

from ..domain import Config, Costs
from ..measurement import Measurement
from .enginefit import ranked
from .enginemodel import EngineCostModel, Observation, ms_per_token


class EnginePredictor:
    """`search.tuner`'s predictor over the engine cost model: it predicts a config from every trial
    measured so far and observes each measurement (their per-request counters) after; before its
    first speculative trial, from a model carried from another context length (`carry_from`), if
    given."""

    def __init__(self, *, forward_overhead: bool = False) -> None:
        self.model = EngineCostModel(forward_overhead=forward_overhead)
        self.carried: EngineCostModel | None = None

    def carry_from(self, other: EnginePredictor, costs_from: Costs, costs_to: Costs) -> None:
        """Predict with `other`'s model (fitted at `costs_from`'s length), carried to `costs_to`'s,
        until this predictor observes a trial of its own."""
        if other.model.observations:
            self.carried = carried_model(other.model.fit(), costs_from, costs_to)

    def _current(self) -> EngineCostModel | None:
        """Its own model once a speculative trial was observed here; before that the carried one (a
        raced length still measures its baseline as a trial: plain timings alone predict nothing)."""
        if self.carried is None or any(o.config.gamma > 0 for o in self.model.observations):
            return self.model.fit() if self.model.observations else None
        return self.carried

    def observe(self, config: Config, m: Measurement) -> None:
        if m.requests:
            self.model.add(Observation.from_measurement(config, m))

    def predict(self, config: Config) -> float | None:
        model = self._current()
        return model.predict(config) if model is not None else None

    def rank(self, configs: list[Config]) -> list[tuple[Config, float]]:
        model = self._current()
        return model.rank(configs) if model is not None else []

    def explain(self, config: Config) -> str:
        model = self._current()
        if model is None:
            return ""
        text = model.explain(config)
        if model is self.carried:
            text += f" (fitted at L={model.carried_from}, carried to this length's costs)"
        return text


def carried_model(model: EngineCostModel, costs_from: Costs, costs_to: Costs) -> EngineCostModel:
    """A copy of fitted `model` with its times scaled from `costs_from`'s context to `costs_to`'s
    (module docstring); it never refits (it holds no observations)."""
    t_to = costs_to.t_target_ms if costs_to.t_target_ms and costs_to.t_target_ms > 0 else None
    t_scale = _ratio(t_to, model.t_plain_ms) or _ratio(costs_to.t_target_ms, costs_from.t_target_ms) or 1.0
    k_scale = _ratio(_slope(costs_to.verify_ms), _slope(costs_from.verify_ms)) or t_scale
    raw_to, raw_from = _slope(costs_to.verify_raw_ms or []), _slope(costs_from.verify_raw_ms or [])
    out = EngineCostModel(forward_overhead=model.forward_overhead)
    out.t_plain_ms = t_to if t_to is not None and model.t_plain_ms is not None else None
    if out.t_plain_ms is None and model.t_plain_ms is not None:
        out.t_plain_ms = model.t_plain_ms * t_scale
    out.drafts = dict(model.drafts)
    out.verify = {}
    for fam, v in model.verify.items():
        v = copy.copy(v)
        if raw_to is not None and raw_from is not None:
            v.ms_per_token = max(0.0, v.ms_per_token + raw_to - raw_from)
        else:
            v.ms_per_token *= k_scale
        v.ms_per_step *= t_scale
        v.ms_per_forward *= t_scale
        out.verify[fam] = v
    t_draft_from = {d.name: d.t_draft_ms for d in costs_from.drafts}
    t_draft_to = {d.name: d.t_draft_ms for d in costs_to.drafts}
    out.t_draft_ms = {
        name: ms * (_ratio(t_draft_to.get(name), t_draft_from.get(name)) or t_scale)
        for name, ms in model.t_draft_ms.items()
    }
    out._fitted = True
    out.carried_from = costs_from.context_len
    return out


def _slope(curve: list[float]) -> float | None:
    """ms per extra token verified over a C_ver(γ) curve (γ = 1 .. len)."""
    if len(curve) < 2:
        return None
    return (curve[-1] - curve[0]) / (len(curve) - 1)


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or a <= 0 or b <= 0:
        return None
    return a / b


class BatchedPredictor:
    """Predicts at `batch_size` > 1 from a B = 1 `EnginePredictor` (its current model, own or
    carried), the plain wall ms per token measured at this batch size, and, where `costs` hold
    C_ver at this batch size and at B = 1 raw, what a drafted token's verification costs here
    against B = 1 (module docstring). It observes plain measurements only; `rank` and `explain` as
    EnginePredictor's."""

    def __init__(self, single: EnginePredictor, batch_size: int, costs: Costs | None = None) -> None:
        self.single = single
        self.batch_size = batch_size
        self.t_batch_ms: float | None = None  # plain wall ms per token at this batch size
        self.k_extra_ms = verify_extra_ms(costs, batch_size)  # None: a drafted token verified as at B = 1

    def observe(self, config: Config, m: Measurement) -> None:
        if config.gamma == 0 and m.metrics.tokens_per_s > 0:
            self.t_batch_ms = 1000.0 / m.metrics.tokens_per_s

    def _breakdown(self, config: Config) -> tuple[float, float] | None:
        """(speedup, ms per token) at this batch size, or None."""
        model = self.single._current()
        p = model.breakdown(config) if model is not None and self.t_batch_ms is not None else None
        if p is None or p.fit is None or p.verify is None:
            return None
        t = self.t_batch_ms
        verify = p.verify
        if self.k_extra_ms is not None:
            verify = replace(verify, ms_per_token=max(0.0, verify.ms_per_token + self.k_extra_ms))
        ms = ms_per_token(
            p.fit.token_share, p.accepted_per_draft, p.drafted_per_draft, t, verify, p.t_draft_ms
        )
        return t / ms, ms

    def predict(self, config: Config) -> float | None:
        if config.gamma == 0:
            return 1.0 if self.t_batch_ms is not None else None
        out = self._breakdown(config)
        return out[0] if out else None

    def rank(self, configs: list[Config]) -> list[tuple[Config, float]]:
        return ranked(configs, self.predict)

    def explain(self, config: Config) -> str:
        out = self._breakdown(config)
        if out is None:
            return f"{config.label}: no prediction at B={self.batch_size}"
        return (
            f"{config.label}: {out[0]:.2f}x predicted at B={self.batch_size} (plain {self.t_batch_ms:.1f} ms "
            f"a token there, "
            + (
                "verification as at B=1)"
                if self.k_extra_ms is None
                else f"a drafted token verified at {self.k_extra_ms:+.2f} ms against B=1, C_ver(B, γ) measured)"
            )
        )


def verify_extra_ms(costs: Costs | None, batch_size: int) -> float | None:
    """What one more drafted token verified costs a row at `batch_size` beyond B = 1, from the
    engine's raw C_ver curves (`Costs.batch` at B, `Costs.verify_raw_ms` at 1): slope at B / B minus
    slope at 1, each at least 0 (a flat or falling curve costs a drafted token nothing). None where
    either curve is missing."""
    at_b = costs.at_batch(batch_size) if costs is not None and batch_size > 1 else None
    if at_b is None or costs is None or not costs.verify_raw_ms:
        return None
    slope_b, slope_1 = _slope(at_b.verify_ms), _slope(costs.verify_raw_ms)
    if slope_b is None or slope_1 is None:
        return None
    return max(0.0, slope_b) / batch_size - max(0.0, slope_1)


class Predictor(Protocol):
    """What the tuner asks of an engine's fitted cost model (`EnginePredictor`, `BatchedPredictor`):
    a prediction before a trial is measured, the measurement after."""

    def observe(self, config: Config, m: Measurement) -> None: ...
    def predict(self, config: Config) -> float | None: ...
    def rank(self, configs: list[Config]) -> list[tuple[Config, float]]: ...
    def explain(self, config: Config) -> str: ...
