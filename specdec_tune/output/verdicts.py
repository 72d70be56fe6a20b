"""What `check` reports: one item per judged or reported metric, and the report of one profile
(the judging is output.check and output.rates; the rendering output.reports and output.junit)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class CheckItem:
    metric: str
    stored: float | str | None
    measured: float | str | None
    ok: bool
    note: str = ""
    inconclusive: bool = False  # too noisy to decide (ok stays True: not a regression)


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
