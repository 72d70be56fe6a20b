"""Rendering a profile: rich tables for `show` and `compare`, and the PNG plots of `show --plot`."""

from __future__ import annotations

import sys

import pytest
from helpers import make_sample_profile
from rich.console import Console

from specdec_tune.domain import Costs, DraftCosts
from specdec_tune.errors import SpecDecError
from specdec_tune.output.compare import render_compare
from specdec_tune.output.plots import PLOT_FILES, write_plots
from specdec_tune.output.tables import render_profile
from specdec_tune.output.trials import best_per, read_trials, trials_tables
from specdec_tune.search.costmodel import CostModel

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _render(fn, *args) -> str:
    console = Console(record=True, width=160)
    fn(*args, console)
    return console.export_text()


def _row(text: str, label: str) -> list[str]:
    """The cells of the table row that starts with `label`."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if cells and cells[0] == label:
            return cells
    raise AssertionError(f"no row {label!r} in:\n{text}")


def _assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 1024


def test_predicted_curve_matches_the_formula():
    draft = DraftCosts(name="d", t_draft_ms=1.0, c=0.1, acceptance_rate=0.5, acceptance_vector=[0.5, 0.5])
    costs = Costs(t_target_ms=10.0, t_target_spread=0.0, verify_ms=[10.0, 12.0, 15.0], verify_spread=0.0,
                  context_len=64, drafts=[draft])  # fmt: skip
    curve = CostModel(costs).curve("d")
    # Γ is the shorter of verify_ms and the acceptance vector
    assert [g for g, _ in curve] == [1, 2]
    assert curve[0][1] == pytest.approx(10 * 1.5 / (1 + 10))
    assert curve[1][1] == pytest.approx(10 * 1.75 / (2 + 12))


def test_render_profile_shows_every_section():
    text = _render(render_profile, make_sample_profile())
    for expected in [
        "meta-llama/Llama-3.1-8B-Instruct",
        "nvidia-h200",
        "Best config",
        "llama-3.2-1b γ=4 t=0.30",
        "1.31×",
        "189.9",
        "Alternatives",
        "skip-8l γ=3 t=0.00",
        "lookup γ=4",
        "Baseline",
        "144.9",
        "Hardware",
        "NVIDIA H200",
        "Verification cost C_ver(γ)",
        "7.10",
        "Drafters",
        "0.82 0.78 0.75 0.72",
        "chat-mix",
        "transformers 5.24.0",
    ]:
        assert expected in text, expected
    assert _row(text, "acceptance α")[1] == "0.741"


def test_render_profile_without_costs_or_speculation():
    text = _render(render_profile, make_sample_profile(kind="none", costs=None, alternatives=[]))
    assert "no speculation" in text
    assert "No hardware costs" in text
    assert "Alternatives" not in text


def test_render_compare_marks_the_better_profile():
    a = make_sample_profile()
    b = make_sample_profile(
        kind="prompt_lookup", hardware={"slug": "cpu-x86-64", "cpu_model": "AMD EPYC 9654"}
    )
    b.best.metrics.speedup = 1.08
    b.best.metrics.tokens_per_s = 21.4
    b.best.metrics.acceptance_rate = 0.41
    text = _render(render_compare, a, b)
    assert "A: nvidia-h200" in text and "B: cpu-x86-64" in text
    assert _row(text, "device")[1:] == ["NVIDIA H200", "AMD EPYC 9654", "differs"]
    assert _row(text, "best config")[1:3] == ["llama-3.2-1b γ=4 t=0.30", "lookup γ=4 t=0.30"]
    assert _row(text, "speedup")[1:] == ["1.31×", "1.08×", "A"]
    assert _row(text, "tokens/s")[-1] == "A"
    assert _row(text, "acceptance α")[1:] == ["0.741", "0.410", "A"]
    assert _row(text, "baseline tokens/s")[-1] == "≈"
    b.best.metrics.speedup = 1.5
    assert _row(_render(render_compare, a, b), "speedup")[-1] == "B"


def test_render_compare_warns_when_targets_differ():
    b = make_sample_profile()
    b.target.content_hash = "ffffffffffffffff"
    assert "not comparable" in _render(render_compare, make_sample_profile(), b)


def _with_batch_table(prof):
    import dataclasses

    from specdec_tune.domain import Config, Metrics, Result
    from specdec_tune.store.schema import BatchRow

    plain = dataclasses.replace(prof.baseline)
    none = Result(
        Config(dataclasses.replace(prof.best.config.draft, kind="none", name="none", path=None), 0), plain
    )
    prof.batch_table = [
        BatchRow(1, prof.best, [prof.best, *prof.alternatives[:1]], 1.9),
        BatchRow(8, prof.alternatives[0], [prof.alternatives[0]], 1.2),
        BatchRow(32, none, [], 0.9),
    ]
    prof.b_star, prof.predicted_b_star = 32, 32
    assert isinstance(plain, Metrics)
    return prof


def test_batch_table_is_shown_with_b_star():
    text = _render(render_profile, _with_batch_table(make_sample_profile()))
    assert "Batch sizes" in text and "B* = 32" in text and "the cost model predicts B* = 32" in text
    assert _row(text, "32")[1] == "no speculation"


def _with_envelope(prof):
    """The sample profile's best at L 256 and 2048, plain decoding at 6144: L* = 6144."""
    import dataclasses

    from specdec_tune.domain import Config, Result
    from specdec_tune.store.build import with_envelope
    from specdec_tune.store.schema import ContextRow

    none = Result(
        Config(dataclasses.replace(prof.best.config.draft, kind="none", name="none", path=None), 0),
        prof.baseline,
    )
    rows = [
        ContextRow(256, 1, prof.best, 250, [prof.best], 8.0, 1.4),
        ContextRow(2048, 1, prof.alternatives[0], 2040, [prof.alternatives[0]], 20.0, 1.1),
        ContextRow(6144, 1, none, 6100, [], 31.5, 0.9),
    ]
    return with_envelope(prof, rows)


def test_show_prints_the_envelope_with_l_star_and_kind_changes():
    prof = _with_envelope(make_sample_profile())
    text = _render(render_profile, prof)
    assert "Context lengths" in text and "L* = 6144" in text
    assert "does not pay" in text and "speculation pays" in text
    # each speculative config measured in a cell against its own prediction: the error is in the
    # caption; the plain cell's 1.00x is no prediction of anything
    measured = [r.metrics for row in prof.context_table for r in row.per_draft]
    assert len(measured) == 2 and all(m.predicted_speedup for m in measured)
    errs = sorted(abs(m.predicted_speedup / m.speedup - 1) for m in measured)
    words = f"cost model error over 2 configs in 2 cells: median {(errs[0] + errs[1]) / 2:.0%}, worst {errs[1]:.0%}"
    assert words in " ".join(text.split())


@pytest.mark.slow  # matplotlib renders every plot
def test_write_plots_writes_all_pngs(tmp_path):
    trials = tmp_path / "trials.csv"
    trials.write_text(
        "number,draft,gamma,threshold,speedup,state\n"
        "0,llama-3.2-1b,2,0.1,1.21,COMPLETE\n"
        "1,llama-3.2-1b,6,0.0,1.12,COMPLETE\n"
        "2,lookup,3,0.0,0.93,COMPLETE\n"
        "3,skip-8l,5,0.0,,FAIL\n"
        "4,lookup,7,0.0,0.5,PRUNED\n",
        encoding="utf-8",
    )
    paths = write_plots(
        _with_envelope(_with_batch_table(make_sample_profile())), tmp_path / "plots", trials_csv=trials
    )
    assert sorted(p.name for p in paths) == sorted(PLOT_FILES.values())
    for path in paths:
        _assert_png(path)
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == sorted(PLOT_FILES.values())


def test_write_plots_skips_plots_without_data(tmp_path):
    p = make_sample_profile(costs=None)
    for r in [p.best, *p.alternatives]:
        r.metrics.predicted_speedup = None
    paths = write_plots(p, tmp_path)
    # no costs: no cost curve; no predictions: no scatter; best + alternatives still give speedup vs γ
    assert sorted(x.name for x in paths) == [PLOT_FILES["acceptance"], PLOT_FILES["speedup"]]
    assert sorted(x.name for x in tmp_path.iterdir()) == sorted(x.name for x in paths)
    for path in paths:
        _assert_png(path)


def test_write_plots_bad_trials_csv(tmp_path):
    bad = tmp_path / "trials.csv"
    bad.write_text("number,value\n0,1.2\n", encoding="utf-8")
    with pytest.raises(SpecDecError, match="lacks column"):
        write_plots(make_sample_profile(), tmp_path / "plots", trials_csv=bad)
    with pytest.raises(SpecDecError, match="not found"):
        write_plots(make_sample_profile(), tmp_path / "plots", trials_csv=tmp_path / "missing.csv")


def test_write_plots_without_matplotlib_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # makes the import fail
    with pytest.raises(SpecDecError, match=r"pip install 'specdec-tune\[plot\]'"):
        write_plots(make_sample_profile(), tmp_path)


def test_trials_analysis_best_per_draft_and_per_gamma(tmp_path):
    csv = tmp_path / "t.trials.csv"
    csv.write_text(
        "number,state,draft,gamma,threshold,speedup\n"
        "0,COMPLETE,none,0,0.0,1.0\n"
        "1,COMPLETE,a,2,0.0,1.4\n"
        "2,COMPLETE,a,3,0.25,1.6\n"
        "3,COMPLETE,b,2,0.0,1.2\n"
        "4,PRUNED,b,3,0.0,\n"
        "5,FAIL,a,4,0.0,\n"
        ",FINAL,a,3,0.25,1.5\n",
        encoding="utf-8",
    )
    df = read_trials(csv)
    per_draft = best_per(df, "draft")
    assert list(per_draft["draft"]) == ["a", "b", "none"]
    a = per_draft.iloc[0]
    assert (a.gamma, a.threshold, a.speedup, a.median_speedup, a.trials) == (3, 0.25, 1.6, 1.5, 2)
    per_gamma = best_per(df, "gamma")
    assert list(per_gamma["gamma"]) == [3, 2, 0] and list(per_gamma["trials"]) == [1, 2, 1]
    console = Console(record=True, width=120)
    for table in trials_tables(df):
        console.print(table)
    text = console.export_text()
    assert "best per draft" in text and "a γ=3 t=0.25" in text and "1.60×" in text


def test_show_prints_intervals_the_verdict_and_brackets_search_trial_numbers():
    p = make_sample_profile()
    p.best.metrics.speedup_interval = [1.2741, 1.3388]
    p.best.metrics.speedup_samples = [1.28, 1.30, 1.31, 1.32, 1.33]
    p.alternatives[0].metrics.search_speedup = 1.30  # re-measured in the final round
    p.alternatives[0].metrics.speedup_interval = [1.25, 1.31]
    p.search.final_verdict = "resolved"
    p.search.final_margin = [1.018, 1.004, 1.031]
    p.search.outliers = ["skip-8l γ=6 t=0.00"]
    text = _render(render_profile, p)
    assert "[1.274, 1.339]×" in text and "search trial" in text
    assert "resolved: best / runner-up 1.018× [1.004, 1.031]" in text and "skip-8l γ=6 t=0.00" in text
    final_row = _row(text, "1")
    assert final_row[2] == "1.29×" and final_row[3] == "[1.25, 1.31]×" and final_row[-1].startswith("final")
    search_row = _row(text, "2")  # measured only in the search: bracketed, no interval
    assert search_row[2] == "(1.25×)" and search_row[3] == "—" and search_row[-1] == "search trial only"


def test_run_summary_shows_a_raced_engine_default_as_a_final_round_number():
    """An engine default raced in the final round has no search trial (no search_speedup); it won
    there, so its speedup and interval are the final round's and its trial column is empty (it was
    shown as a trial's number, its speedup a dash). A config beyond the finalists keeps a dash."""
    from dataclasses import replace

    from specdec_tune.output.reports import run_summary

    p = make_sample_profile("prompt_lookup", 12, 0.0)
    p.best.metrics.search_speedup = None  # raced, never a trial
    p.best.metrics.speedup_interval = [1.2, 1.4]
    p.search.finalists = 1
    runner = replace(p.best, metrics=replace(p.best.metrics, speedup=1.1, speedup_interval=[1.0, 1.2]))
    p.alternatives = [runner]
    console = Console(record=True, width=160)
    run_summary(console, p, None)
    text = console.export_text()
    best = next(line for line in text.splitlines() if line.strip().startswith("best"))
    runner_up = next(line for line in text.splitlines() if line.strip().startswith("runner-up"))
    assert "1.310×" in best and "1.20–1.40" in best and "1.31×" not in best  # not as a trial's
    assert "1.100×" not in runner_up and "—" in runner_up and "1.10×" in runner_up  # its trial column
