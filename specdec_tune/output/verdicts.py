"""What `check` judges and what it reports: the evidence of one stored config re-measured, one item
per judged or reported metric, and the report of one profile (the judging is output.check and
output.rates; the rendering output.reports and output.junit)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..domain import Result
from ..measurement import Measurement
from .environment import Environment


@dataclass(frozen=True)
class Evidence:
    """What `check` gathered for one stored config: what it stored (`stored`: a search Result, its
    `config` and `metrics`), what it measured now (`measured`: a `Measurement`; `again`: the
    confirmation, None when the first clearly passed) and on what machine (`environment`).

    `judge_rates`: the machine anchors agree, so the plain tokens/s is judged, at `rate_scale`
    (output.anchors.rate_scale_for); `reference`: the profile's fresh-process reference
    (output.check.reference_of, {} for older profiles); `where`: the items' suffix (" @ B=4");
    `same_machine`: absolute rates are judged only then (output.rates.rate_items)."""

    stored: Result
    measured: Measurement
    again: Measurement | None = None
    temperature: float = 0.0
    environment: Environment = field(default_factory=Environment)
    judge_rates: bool = False
    rate_scale: float = 1.0
    reference: dict[str, list[float]] = field(default_factory=dict)
    where: str = ""
    same_machine: bool = (
        True  # the profile's machine itself (measure.hardware.machine_id), not one of its kind
    )
    # The engine's own T = 0 divergence when the profile was measured, as (prompts that parted,
    # prompts compared) from `backend.exactness` for this config ((0, 0): exact, or not known). An
    # engine that is not token-exact here (vLLM's bfloat16 verification) fails `check` only where
    # a larger share of prompts parts now; ours is exact, so any prompt that parts fails.
    stored_divergence: tuple[int, int] = (0, 0)
    looks: int = 1  # the confirmations pooled in `again` (checkpolicy's `confirm_looks`)
    # This machine's matmul anchor over the reference's (None: not compared), which bounds how far
    # another machine can move the speedup (output.elsewhere.machine_floor).
    machine_ratio: float | None = None


@dataclass
class CheckItem:
    metric: str
    stored: float | str | None
    measured: float | str | None
    ok: bool
    note: str = ""
    inconclusive: bool = False  # too noisy to decide (ok stays True: not a regression)
    answer: str = ""  # inconclusive: what would make the check answer ("3 more repeats", "a quiet machine")


@dataclass
class CheckReport:
    profile: str
    config: str
    items: list[CheckItem] = field(default_factory=list)
    seconds: float = 0.0
    noise: dict[str, Any] = field(default_factory=dict)  # what the OS said while re-measuring
    anchors: dict[str, Any] = field(default_factory=dict)  # stored vs measured speed of the machine

    @property
    def passed(self) -> bool:
        return all(i.ok for i in self.items)

    @property
    def inconclusive(self) -> bool:
        """No regression, but some speedup could not be judged on this noisy machine (exit 6)."""
        return self.passed and any(i.inconclusive for i in self.items)

    @property
    def inconclusive_line(self) -> str:
        """The one line of exit 6: what could not be told, and what would make the check answer."""
        vague = [i for i in self.items if i.inconclusive]
        answer = next((i.answer for i in vague if i.answer), "more --repeats or a quiet machine")
        return f"{', '.join(i.metric for i in vague)}: {answer} would answer"

    def as_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "config": self.config,
            "passed": self.passed,
            "inconclusive": self.inconclusive,
            "items": [asdict(i) for i in self.items],
            "seconds": self.seconds,
            "noise": self.noise,
            "anchors": self.anchors,
        }
