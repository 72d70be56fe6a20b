"""Acceptance that is given instead of measured: for drafts timed against random weights (shapes),
from `--acceptance-vector [DRAFT=]A1,A2,...` or copied from an earlier costs file or profile
(`--acceptance-from FILE`).

The vector is per position: A_i = P(draft token i accepted | tokens 1..i-1 accepted), as the
profiler measures it. A vector named for a draft is that draft's; one without a name is every
other draft's whose acceptance is not measured; a file's vectors fill what is left. A file's drafts are matched by name, a shape's
"shape:" left out, so `shape:llama-3.2-1b` takes a measured `llama-3.2-1b` or (when it is the only
one) `llama-3.2-1b-instruct`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..domain import ACCEPTANCE_FROM, Costs, DraftSpec
from ..errors import SpecDecError
from ..limits import MAX_GAMMA
from ..runtime.models.shapes import SHAPE_PREFIX
from ..search.costmodel import expected_tokens
from ..store.yamlio import load_costs

VECTOR_HELP = (
    "--acceptance-vector takes [DRAFT=]A1,A2,... with each A a probability in [0, 1] "
    "(per position, from the first draft token on), e.g. 0.8,0.7,0.6 or shape:llama-3.2-1b=0.8,0.7"
)


@dataclass
class GivenAcceptance:
    """What the user said about acceptance the profiler cannot measure."""

    vectors: dict[str, list[float]] = field(default_factory=dict)  # per draft: its --draft text or name
    default: list[float] | None = None  # for every other draft without measured acceptance
    from_file: Path | None = None  # an earlier costs file or profile with measured acceptance

    @property
    def empty(self) -> bool:
        return not self.vectors and self.default is None and self.from_file is None


def parse_vector(text: str) -> list[float]:
    """ "0.8,0.7,0.6" -> [0.8, 0.7, 0.6]; anything but 1..64 probabilities is a SpecDecError."""
    parts = [p.strip() for p in text.split(",")]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise SpecDecError(f"{VECTOR_HELP}; got {text!r}") from None
    if not values or len(values) > MAX_GAMMA or not all(math.isfinite(v) and 0 <= v <= 1 for v in values):
        raise SpecDecError(f"{VECTOR_HELP} (at most {MAX_GAMMA} values); got {text!r}")
    return values


def parse_given(vectors: Sequence[str] | None, from_file: Path | None = None) -> GivenAcceptance:
    """The `--acceptance-vector` values (repeatable) and `--acceptance-from` as a GivenAcceptance."""
    given = GivenAcceptance(from_file=from_file)
    for text in vectors or []:
        name, _, values = text.rpartition("=")
        name = name.strip()
        if "=" in text and not name:
            raise SpecDecError(f"{VECTOR_HELP}; got {text!r}")
        vector = parse_vector(values)
        if not name:
            if given.default is not None:
                raise SpecDecError("--acceptance-vector without DRAFT= given twice: name the draft of each")
            given.default = vector
        elif name in given.vectors:
            raise SpecDecError(f"--acceptance-vector for '{name}' given twice")
        else:
            given.vectors[name] = vector
    if from_file is not None and not Path(from_file).is_file():
        raise SpecDecError(f"--acceptance-from: no such file {from_file}")
    return given


def _bare(name: str) -> str:
    return name.replace(SHAPE_PREFIX, "")


def _match(name: str, stored: Costs, path: Path) -> list[float] | None:
    """The vector of `name`'s draft in an earlier costs file: same name, a shape's without "shape:",
    or the only one named that plus a suffix ("llama-3.2-1b" -> "llama-3.2-1b-instruct")."""
    known = [d for d in stored.drafts if d.acceptance_known and d.acceptance_vector]
    for candidates in (
        [d for d in known if d.name == name],
        [d for d in known if d.name == _bare(name)],
        [d for d in known if d.name.startswith(_bare(name) + "-")],
    ):
        if len(candidates) == 1:
            return list(candidates[0].acceptance_vector)
        if len(candidates) > 1:
            names = ", ".join(d.name for d in candidates)
            raise SpecDecError(
                f"--acceptance-from {path}: draft '{name}' matches several ({names}); "
                f"pass its vector with --acceptance-vector {name}=A1,A2,..."
            )
    return None


def acceptance_plan(
    given: GivenAcceptance, specs: Iterable[DraftSpec], measured: set[str]
) -> tuple[dict[str, tuple[list[float], str]], list[str]]:
    """Before measuring: which drafts take which given vector (and where it came from), and notes.

    `measured` names the drafts whose acceptance the profiler measures (both models trained); a
    vector named for one of those, or for no draft at all, is a SpecDecError.
    """
    from ..runtime.session import parse_draft

    specs = list(specs)
    names = [s.name for s in specs]
    named: dict[str, list[float]] = {}
    for key, vector in given.vectors.items():
        name = key if key in names else parse_draft(key).name
        if name not in names:
            raise SpecDecError(
                f"--acceptance-vector names '{key}', which is no --draft here (drafts: {', '.join(names)})"
            )
        if name in measured:
            raise SpecDecError(
                f"--acceptance-vector for '{key}': its acceptance is measured here (both models have "
                "trained weights); give vectors only for drafts timed against random weights"
            )
        named[name] = vector
    stored = None
    if given.from_file is not None:
        stored, _ = load_costs(given.from_file)
    plan: dict[str, tuple[list[float], str]] = {}
    notes: list[str] = []
    for name in names:
        if name in measured:
            continue
        if name in named:
            plan[name] = (named[name], "given")
        elif given.default is not None:
            plan[name] = (given.default, "given")
        elif stored is not None and given.from_file is not None:
            vector = _match(name, stored, given.from_file)
            if vector is not None:
                plan[name] = (vector, ACCEPTANCE_FROM + Path(given.from_file).name)
            else:
                known = ", ".join(d.name for d in stored.drafts if d.acceptance_known) or "none"
                notes.append(
                    f"{given.from_file} has no measured acceptance for '{name}' (it has: {known}); "
                    "its acceptance stays unknown"
                )
    unused = given.default is not None or given.from_file is not None
    if unused and not any(n not in measured for n in names):
        notes.append("every draft's acceptance is measured here: the given acceptance is not used")
    return plan, notes


def apply_acceptance(costs: Costs, plan: dict[str, tuple[list[float], str]], max_gamma: int) -> None:
    """After measuring: each planned draft takes its vector, cut or padded (last value repeated) to
    `max_gamma` positions, and α = accepted / proposed draft tokens at γ = max_gamma, as measured."""
    for d in costs.drafts:
        if d.name not in plan or d.acceptance_source != "unknown":
            continue
        vector, source = plan[d.name]
        padded = list(vector[:max_gamma]) + [vector[-1]] * (max_gamma - len(vector))
        d.acceptance_vector = padded
        d.acceptance_rate = (expected_tokens(padded, max_gamma) - 1.0) / max_gamma
        d.acceptance_source = source
