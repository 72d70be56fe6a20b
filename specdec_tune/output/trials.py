"""The trials CSV that `run` writes beside a profile, read back with pandas: the finished trials
for the plots, and the analyses `show --trials` prints as tables (best per draft, best per gamma).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table

from ..errors import SpecDecError
from ..limits import MAX_GAMMA
from .fmt import times

if TYPE_CHECKING:
    import pandas as pd

REQUIRED = ("draft", "gamma", "speedup")
MAX_CSV_BYTES = 64 * 1024 * 1024  # a million trials fit; a crafted file must not fill memory


def read_trials(path: str | Path) -> Any:
    """The CSV as a pandas DataFrame; a missing file or column is a SpecDecError."""
    import pandas as pd

    path = Path(path)
    try:
        if path.is_file() and path.stat().st_size > MAX_CSV_BYTES:
            raise SpecDecError(f"trials CSV {path} is larger than {MAX_CSV_BYTES >> 20} MiB")
        df = pd.read_csv(path)
    except FileNotFoundError:
        raise SpecDecError(f"trials CSV not found: {path}") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise SpecDecError(f"cannot read trials CSV {path}: {str(e).splitlines()[0]}") from None
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise SpecDecError(
            f"trials CSV {path} lacks column(s) {', '.join(missing)} "
            "(needs draft, gamma, threshold, speedup, state)"
        )
    return df


def completed_trials(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Search trials that finished with a speedup: [{draft, gamma, threshold, speedup}] (final-round
    rows and failed or pruned trials are left out)."""
    return _completed(df).to_dict("records")


def _completed(df: pd.DataFrame) -> pd.DataFrame:
    import pandas as pd

    if "state" in df.columns:
        # Optuna writes "COMPLETE"; str(TrialState.COMPLETE) would be "TrialState.COMPLETE"
        df = df[df["state"].astype(str).str.rsplit(".", n=1).str[-1] == "COMPLETE"]
    threshold = df["threshold"] if "threshold" in df.columns else 0.0
    out = pd.DataFrame(
        {
            "draft": df["draft"].astype(str),
            "gamma": pd.to_numeric(df["gamma"], errors="coerce"),
            "threshold": pd.to_numeric(threshold, errors="coerce"),
            "speedup": pd.to_numeric(df["speedup"], errors="coerce"),
        }
    )
    # a hand-edited or crafted CSV: inf, NaN or a gamma outside the range is no trial
    finite = (out["speedup"].abs() < float("inf")) & out["gamma"].between(0, MAX_GAMMA)
    finite &= out["threshold"].isna() | out["threshold"].between(0.0, 1.0)
    out = out[finite].dropna(subset=["gamma", "speedup"])
    return out.fillna({"threshold": 0.0}).astype({"gamma": int})


def best_per(df: pd.DataFrame, by: str) -> pd.DataFrame:
    """Per value of `by` ("draft" or "gamma"): the best completed search trial (its config and
    speedup), the median speedup and the number of trials; best first."""
    done = _completed(df)
    if done.empty:
        return done
    grouped = done.groupby(by)["speedup"]
    best = done.loc[grouped.idxmax()].set_index(by)
    best["median_speedup"] = grouped.median()
    best["trials"] = grouped.size()
    return best.sort_values("speedup", ascending=False).reset_index()


def trials_tables(trials: pd.DataFrame) -> list[Table]:
    """The search's trials (a DataFrame of the trials CSV): the best trial per draft and per γ."""
    tables = []
    for by, title in (("draft", "Trials: best per draft"), ("gamma", "Trials: best per γ")):
        df = best_per(trials, by)
        if df.empty:
            continue
        t = Table(title=title, title_justify="left")
        for col in (by if by == "draft" else "γ", "best config", "best speedup", "median", "trials"):
            t.add_column(col, justify="left" if col in ("draft", "best config") else "right")
        for row in df.itertuples(index=False):
            config = f"{row.draft} γ={row.gamma}" + (f" t={row.threshold:.2f}" if row.threshold else "")
            if row.gamma == 0:
                config = "no speculation"
            key = str(row.draft) if by == "draft" else str(row.gamma)
            t.add_row(key, config, times(row.speedup), times(row.median_speedup), str(row.trials))
        tables.append(t)
    return tables
