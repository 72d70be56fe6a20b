"""The use cases, as the Python API: `bench`, `profile_costs`, `tune`, `check`, `export`, `show`.

Each takes typed settings and returns a result dataclass; none prints. The CLI only parses its
arguments, calls one of these and renders the result. Heavy imports happen inside the functions,
so importing this module (and the CLI) stays instant.

    from specdec_tune import app
    outcome = app.tune(app.Models(prompts=4), app.TuneSettings(trials=8), envelope=app.Envelope([1, 4]))
    print(outcome.profile.best.config.label, outcome.profile.best.metrics.speedup)
"""

from __future__ import annotations

from ..backends.acceptance import GivenAcceptance
from ..search.space import TuneSettings
from .check_plan import CheckPlan, plan_check
from .checking import check
from .common import Models, Progress
from .files import ExportResult, IndexResult, ShowResult, export, index_profiles, show
from .measuring import BenchResult, CostsResult, bench, profile_costs
from .run_options import Envelope, RunLimits, SearchInputs
from .tuning import TuneOutcome, tune

__all__ = [
    "BenchResult",
    "CheckPlan",
    "CostsResult",
    "Envelope",
    "ExportResult",
    "GivenAcceptance",
    "IndexResult",
    "Models",
    "Progress",
    "RunLimits",
    "SearchInputs",
    "ShowResult",
    "TuneOutcome",
    "TuneSettings",
    "bench",
    "check",
    "export",
    "index_profiles",
    "plan_check",
    "profile_costs",
    "show",
    "tune",
]
