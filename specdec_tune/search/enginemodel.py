"""A cost model of the serving engine, fitted in the engine from the trials' own decode timings
(llama-server's per-request `timings`), so configs never measured are predicted from those that were.

What a request reports (tools/server/server-common.cpp, build 11434): predicted_n tokens, the first
from the prompt's logits, and predicted_ms from that first token to the last; draft_n tokens drafted
and draft_accepted of them accepted. So a request made F = predicted_n - 1 - draft_accepted target
forwards in predicted_ms. How many of them carried a draft (n_draft_verif_steps) is not reported.

The model, per draft (and threshold), per decode token (N' = predicted_n - 1 of them):

    q          share of decode tokens emitted by forwards that carry a draft (fitted: pooled)
    alpha      per-position acceptance: E[acc | L] = alpha (1 - alpha^L) / (1 - alpha)
    L = gamma  tokens per draft (assumed: see below)
    S = q / (1 + E[acc])        drafting forwards      D = L S   drafted tokens
    F = 1 - q + S               target forwards        A = E[acc] S   accepted tokens
    coverage = S / F            share of forwards that carry a draft
    ms = F (t_plain + o) + S c + D k  [+ t_draft (F + D) for a draft model]
    speedup = t_plain / ms      tokens/s = 1000 / ms

t_plain: the interleaved plain server's predicted_ms / (predicted_n - 1), each observation's own
for the fit, pooled for predictions. k (ms per drafted token verified) and c (ms per verification
step beyond a plain forward) are fitted by non-negative least squares over every spec request of a
draft family (n-gram drafts; draft models), on y = predicted_ms - F t_plain, with S = draft_n / gamma;
c only where the family was measured at two draft lengths or more (otherwise it is not told apart
from k, and folds into it). o (ms per forward of a speculative server beyond a plain one's) only
where the engine declares it (`forward_overhead`: vLLM, docs/vllm.md), not in llama.cpp. A draft model also runs one draft forward per target forward and one
per drafted token (common/speculative.cpp draft-simple: it samples after the accepted tokens, then
once per token drafted): t_draft per draft model, fitted with the family's k.

Assumed, and why:
- q does not change with gamma: at temperature 0 every gamma generates the same text, and a lookup
  draft exists where the history matches, so the forwards without a draft (1 - q per token) are the
  same ones at every gamma; a forward that drafts jumps 1 + E[acc] tokens.
- every draft is gamma long. True of ngram-simple (size-m tokens after a match), except a match
  within gamma of the end (shorter) and a request's last tokens (the server caps a draft at
  n_remaining - 1). The other kinds draft a variable length up to gamma (ngram-mod until its pool
  has no continuation, at least n-min; ngram-map-k and -k4v as many as the value's last draft had
  accepted; ngram-cache up to 8 while a candidate passes its thresholds; a draft model until top-1
  p < p-min, at least n-min): their coverage is then a lower bound and alpha an upper one. The fit
  still reproduces drafted and accepted tokens per forward where measured; extrapolation in gamma
  is the weaker for it.
- acceptance is i.i.d. per position (the counters are totals: nothing finer is identified).
- where a draft model's configs cannot tell its k from its t_draft (one draft length and
  coverage), k is the n-gram family's (the same target forward verifies either); a draft model's
  t_draft is its own, or unknown (no prediction). Only B = 1 requests are fitted.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from ..domain import Config
from .enginefit import expected_accepted, fit_alpha, identified, nnls, ranked
from .engineobs import Observation, Totals, observations

__all__ = ["EngineCostModel", "Observation", "Totals", "ms_per_token", "observations"]

MODEL_KINDS = ("model", "layer_skip", "hybrid")  # a draft model runs: t_draft per draft forward
FIXED_LENGTH_KINDS = ("prompt_lookup",)  # ngram-simple: size-m (= gamma) tokens after each match


def family(config: Config) -> str:
    return "model" if config.draft.kind in MODEL_KINDS else "ngram"


@dataclass
class DraftFit:
    """A draft's acceptance in the engine (per threshold): alpha, q, the gammas that measured it."""

    draft: str
    threshold: float
    alpha: float
    token_share: float  # q
    gammas: list[int]
    fixed_length: bool


@dataclass
class VerifyFit:
    """A family's verification cost: ms per drafted token (k) and per verification step (c)."""

    ms_per_token: float
    ms_per_step: float = 0.0
    step_identified: bool = False
    borrowed_from: str | None = None  # the family k came from, where this one's was not identified
    ms_per_forward: float = 0.0  # o: every forward of a speculative server beyond a plain one's


@dataclass
class EnginePrediction:
    """What the model says of one config, per decode token and per forward."""

    config: Config
    speedup: float
    tokens_per_s: float
    coverage: float
    accepted_per_draft: float
    drafted_per_draft: int
    verify: VerifyFit | None
    t_plain_ms: float
    t_draft_ms: float = 0.0
    fit: DraftFit | None = None


@dataclass
class PredictionErrors:
    """|predicted - measured| / measured over measured configs."""

    count: int
    median: float | None
    worst: float | None
    worst_config: str | None


class EngineCostModel:
    """The engine's cost model: `add` observations, then `predict`, `explain`, `rank`, `errors`.
    Fits lazily (again after every `add`)."""

    def __init__(self, observations: Iterable[Observation] = (), *, forward_overhead: bool = False) -> None:
        self.observations: list[Observation] = list(observations)
        self.forward_overhead = forward_overhead  # fit o (module docstring): the engine says it has one
        self.t_plain_ms: float | None = None  # pooled over every observation's plain requests
        self.drafts: dict[tuple[str, float], DraftFit] = {}  # (draft, threshold) -> its fit
        self.verify: dict[str, VerifyFit] = {}  # family -> its verification cost
        self.t_draft_ms: dict[str, float] = {}  # draft model -> ms per draft forward
        self.carried_from: int | None = None  # the context length fitted at, when carried to another
        self._fitted = False

    def add(self, observation: Observation) -> None:
        self.observations.append(observation)
        self._fitted = False

    # -- fitting
    def fit(self) -> EngineCostModel:
        plain = Totals.of(r for o in self.observations for r in o.plain)
        self.t_plain_ms = plain.ms_per_token
        self.drafts, self.verify, self.t_draft_ms = {}, {}, {}
        self._fitted = True
        if self.t_plain_ms is None:
            return self
        spec = [o for o in self.observations if _speculates(o.config) and Totals.of(o.spec).tokens > 0]
        groups: dict[tuple[str, float], list[Observation]] = {}
        for o in spec:
            groups.setdefault(_group(o.config), []).append(o)
        for key, obs in groups.items():
            self.drafts[key] = self._fit_draft(key, obs)
        for fam in ("ngram", "model"):
            rows = [o for o in spec if family(o.config) == fam]
            if rows:
                self._fit_family(fam, rows)
        return self

    def _fit_draft(self, key: tuple[str, float], obs: list[Observation]) -> DraftFit:
        points, emitted, tokens = [], 0.0, 0
        for o in obs:
            t = Totals.of(o.spec)
            steps = t.drafted / o.config.gamma  # drafting forwards, each draft gamma long
            if steps > 0:
                points.append((o.config.gamma, t.accepted / steps, steps))
            emitted += t.accepted + steps
            tokens += t.tokens
        fixed = obs[0].config.draft.kind in FIXED_LENGTH_KINDS
        gammas = sorted({o.config.gamma for o in obs})
        q = min(1.0, emitted / tokens) if tokens else 0.0
        return DraftFit(key[0], key[1], fit_alpha(points), q, gammas, fixed)

    def _fit_family(self, fam: str, obs: list[Observation]) -> None:
        """NNLS of y = predicted_ms - F t_plain, one row per spec request, on F + D per draft model
        (t_draft), D (k), S (c) and the n-gram family's F (o; a draft model's folds into t_draft).
        An unidentified column is not fitted: c folds into k; a draft model's k may be the n-gram's."""
        names = sorted({o.config.draft.name for o in obs}) if fam == "model" else []
        own_o = self.forward_overhead and fam == "ngram"
        cols: list[list[float]] = [[] for _ in range(len(names) + 2 + own_o)]
        ik, ic = len(names), len(names) + 1  # k's and c's columns; o's last, where fitted
        y: list[float] = []
        for o in obs:
            t_plain = Totals.of(o.plain).ms_per_token or self.t_plain_ms
            for r in o.spec:
                forwards = max(0, r.predicted_n - 1 - r.draft_accepted)
                y.append(r.predicted_ms - forwards * t_plain)
                for j, name in enumerate(names):
                    cols[j].append(forwards + r.draft_n if o.config.draft.name == name else 0.0)
                cols[ik].append(float(r.draft_n))
                cols[ic].append(r.draft_n / o.config.gamma)
                if own_o:
                    cols[-1].append(float(forwards))
        ok = identified(cols)
        ok[ic] = ok[ic] and ok[ik]  # S is D / gamma: without k, no c either
        k_from = self.verify.get("ngram") if fam == "model" and not ok[ik] else None
        if k_from is not None:
            y = [t - k_from.ms_per_token * d for t, d in zip(y, cols[ik], strict=True)]
        use = [j for j in range(len(cols)) if ok[j]]
        coef = dict(zip(use, nnls([cols[j] for j in use], y), strict=True))
        k = k_from.ms_per_token if k_from else coef.get(ik, 0.0)
        c = coef.get(ic, 0.0)
        o_ms = coef.get(len(cols) - 1, 0.0) if own_o else 0.0
        self.verify[fam] = VerifyFit(k, c, ok[ic], "ngram" if k_from else None, o_ms)
        for j, name in enumerate(names):
            self.t_draft_ms[name] = coef.get(j, 0.0)

    def _ready(self) -> None:
        if not self._fitted:
            self.fit()

    # -- predicting
    def breakdown(self, config: Config) -> EnginePrediction | None:
        """The prediction and its terms; None where the model has nothing to say: no plain
        timings yet, a draft never measured (or a draft model whose t_draft is unknown), a gamma
        policy other than fixed (llama.cpp has none)."""
        self._ready()
        t_plain = self.t_plain_ms
        if t_plain is None:
            return None
        if not _speculates(config):
            return EnginePrediction(config, 1.0, 1000.0 / t_plain, 0.0, 0.0, 0, None, t_plain)
        fit = self._draft_fit(config)
        verify = self.verify.get(family(config))
        t_draft = self.t_draft_ms.get(config.draft.name, 0.0 if family(config) == "ngram" else None)
        if config.gamma_policy != "fixed" or fit is None or verify is None or t_draft is None:
            return None
        gamma = config.gamma
        acc = expected_accepted(fit.alpha, gamma)
        steps = fit.token_share / (1.0 + acc)
        forwards = 1.0 - fit.token_share + steps
        ms = ms_per_token(fit.token_share, acc, gamma, t_plain, verify, t_draft)
        return EnginePrediction(
            config, t_plain / ms, 1000.0 / ms, steps / forwards, acc, gamma, verify, t_plain, t_draft, fit
        )

    def predict(self, config: Config) -> float | None:
        """Predicted speedup over plain decoding in this engine (B = 1), or None (see breakdown)."""
        p = self.breakdown(config)
        return p.speedup if p else None

    def tokens_per_s(self, config: Config) -> float | None:
        """Predicted decode tokens/s (the first token, from the prompt, not counted), or None."""
        p = self.breakdown(config)
        return p.tokens_per_s if p else None

    def _draft_fit(self, config: Config) -> DraftFit | None:
        """The draft's fit at this threshold, else at its nearest measured threshold."""
        name, threshold = _group(config)
        if (name, threshold) in self.drafts:
            return self.drafts[(name, threshold)]
        same = [f for (n, _), f in self.drafts.items() if n == name]
        return min(same, key=lambda f: abs(f.threshold - threshold), default=None)

    def rank(self, configs: Iterable[Config]) -> list[tuple[Config, float]]:
        """(config, predicted speedup), best first (`ranked`)."""
        return ranked(configs, self.predict)

    def explain(self, config: Config) -> str:
        """One line: the prediction and why (coverage, accepted per draft, verification cost)."""
        p = self.breakdown(config)
        if p is None:
            why = self._why_not(config)
            return f"{config.label}: no prediction ({why})"
        if p.fit is None:
            return f"{config.label}: plain decoding, T_target {p.t_plain_ms:.1f} ms per token"
        v, f = p.verify, p.fit
        at_most = "" if f.fixed_length else "≥ "
        of = f"{p.drafted_per_draft}" if f.fixed_length else f"≤ {p.drafted_per_draft}"
        text = (
            f"{config.label}: {p.speedup:.2f}x predicted; drafts on {at_most}{100 * p.coverage:.0f} % "
            f"of forwards, {p.accepted_per_draft:.1f} accepted of {of}, verify {v.ms_per_token:.2f} ms "
            f"per drafted token"
        )
        if v.ms_per_step > 0:
            text += f" + {v.ms_per_step:.2f} ms per draft"
        if v.ms_per_forward > 0:
            text += f" + {v.ms_per_forward:.2f} ms per forward of a speculative server"
        text += f" against T_target {p.t_plain_ms:.1f} ms"
        if family(config) == "model":
            text += f", draft model {p.t_draft_ms:.2f} ms per forward"
        notes = []
        if v.borrowed_from:
            notes.append(f"verification cost from the {v.borrowed_from} drafts")
        if config.gamma not in f.gammas:
            notes.append("measured at γ " + ", ".join(map(str, f.gammas)))
        if _group(config)[1] != f.threshold:
            notes.append(f"acceptance from t={f.threshold:.2f}")
        return text + (f" ({'; '.join(notes)})" if notes else "")

    def _why_not(self, config: Config) -> str:
        self._ready()
        if self.t_plain_ms is None:
            return "no plain timings yet"
        if config.gamma_policy != "fixed":
            return f"the engine has no '{config.gamma_policy}' gamma policy"
        if self._draft_fit(config) is None:
            return f"{config.draft.name} never measured in the engine"
        if family(config) == "model" and config.draft.name not in self.t_draft_ms:
            return f"{config.draft.name}'s draft cost unknown"
        return "no verification cost fitted"

    def errors(
        self, measured: Iterable[Observation | tuple[Config, float]] | None = None
    ) -> PredictionErrors:
        """Median and worst relative error of the predicted speedup over measured configs: the
        model's own observations by default (in-sample), or (config, measured speedup) pairs."""
        rows: list[tuple[Config, float]] = []
        for m in self.observations if measured is None else measured:
            config, value = (m.config, m.measured_speedup) if isinstance(m, Observation) else m
            if value:
                rows.append((config, value))
        errs = []
        for config, value in rows:
            predicted = self.predict(config)
            if predicted is not None:
                errs.append((abs(predicted - value) / value, config.label))
        if not errs:
            return PredictionErrors(0, None, None, None)
        worst = max(errs)
        return PredictionErrors(len(errs), statistics.median(e for e, _ in errs), worst[0], worst[1])


def ms_per_token(
    q: float, accepted: float, gamma: int, t_forward: float, verify: VerifyFit, t_draft: float = 0.0
) -> float:
    """ms per decode token (module docstring): a share q of tokens comes from forwards that carry a
    gamma-token draft with `accepted` of it accepted; a forward costs `t_forward` (and o in a
    speculative server, `verify`), each drafting step c and each drafted token k, a draft model
    `t_draft` per forward and drafted token."""
    steps = q / (1.0 + accepted)
    forwards = 1.0 - q + steps
    drafted = gamma * steps
    ms = (
        forwards * (t_forward + verify.ms_per_forward)
        + steps * verify.ms_per_step
        + drafted * verify.ms_per_token
    )
    return ms + t_draft * (forwards + drafted)


def _speculates(config: Config) -> bool:
    return config.draft.kind != "none" and config.gamma > 0


def _group(config: Config) -> tuple[str, float]:
    """Acceptance is a draft's at a threshold (a draft model's p-min changes both q and alpha)."""
    return config.draft.name, round(config.threshold, 4) if config.draft.has_threshold else 0.0
