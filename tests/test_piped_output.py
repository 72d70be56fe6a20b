"""Output that survives a pipe: with stdout a file or a pipe (no terminal, no COLUMNS), the tables of
`run`, `show` and `check` are drawn at their full width, never cut with an ellipsis: every config
name is printed whole (rich alone draws such output 80 columns wide and prints
`hybrid:prompt-lookup+draft-1l γ7 t=0…` and a `spe…` header). On a narrow terminal a config name
folds onto the next line, and is still never cut."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import invoke

from specdec_tune.cli.terminal import _console_class, console
from specdec_tune.output.reports import check_table, run_summary
from specdec_tune.store.yamlio import load_profile

ROOT = Path(__file__).resolve().parents[1]
FIXED = ROOT / "tests" / "data" / "profiles" / "cpu-amd-epyc-2t" / "demo.yaml"
# A draft whose config label alone fills most of an 80-column line.
LONG = "prompt-lookup-over-the-whole-request-history"


def labels(profile) -> set[str]:
    """Every config name `show` prints: the best, the alternatives, each batch size's best, and each
    draft at its best γ there (printed as `draft γN`)."""
    out = {profile.best.config.label, *(a.config.label for a in profile.alternatives)}
    for row in profile.batch_table:
        out.add(row.best.config.label)
        out |= {f"{r.config.draft.name} γ{r.config.gamma}" for r in row.per_draft}
    return out


@pytest.fixture
def no_terminal_width(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture
def long_named_engine(fake_engine, monkeypatch):
    """The scripted engine of tests/fake_backend.py with its best draft given a long name."""
    monkeypatch.setattr(fake_engine, "DRAFTS", {LONG: 1.8, "guess": 1.1})
    return fake_engine


@pytest.mark.slow  # the CLI end to end (a scripted engine: seconds): run, then check
def test_run_piped_prints_every_config_name_whole(tmp_path, long_named_engine, no_terminal_width):
    out = tmp_path / "fake.yaml"
    r = invoke(
        "run", "--backend", "fake", "--workload", "demo-code", "--prompts", "4", "--trials", "6",
        "--storage", f"sqlite:///{tmp_path / 's.db'}", "--out", out, "--reference-processes", "0",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    p = load_profile(out)
    assert p.best.config.draft.name == LONG
    shown = [p.best.config.label, *(a.config.label for a in p.alternatives[:1])]  # the run's table
    for label in shown:
        assert any(label in line for line in r.stdout.splitlines()), (label, r.stdout)
    assert "…" not in r.stdout, r.stdout
    header = next(line for line in r.stdout.splitlines() if "config" in line and "speedup" in line)
    assert header.split() == ["config", "speedup", "95%", "CI", "trial", "tok/s", "α", "τ", "pred."]

    c = invoke("check", out, "--repeats", "3")  # its table, piped too
    assert c.exit_code == 0, c.output
    assert any(p.best.config.label in line for line in c.stdout.splitlines()), c.stdout
    assert "…" not in c.stdout, c.stdout


def test_show_piped_prints_every_config_name_whole():
    """A real pipe: `show` in a child process whose stdout is a pipe, no COLUMNS in its environment."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    r = subprocess.run(
        [sys.executable, "-m", "specdec_tune.cli", "show", str(FIXED)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    names = labels(load_profile(FIXED))
    assert any(len(n) > 30 for n in names), names  # long enough that 80 columns cut them before
    lines = r.stdout.splitlines()
    for name in names:
        assert any(name in line for line in lines), (name, r.stdout)
    assert "…" not in r.stdout, r.stdout


def test_check_table_piped_is_drawn_whole(capsys, no_terminal_width):
    """stdout captured (not a terminal): `check`'s table keeps a long note and the config whole."""
    from specdec_tune.output.verdicts import CheckItem, CheckReport

    note = "the 95 % interval [0.93, 1.02] of (speedup now / stored) crosses the floor 0.90; " * 3
    report = CheckReport(
        profile="profiles/cpu-amd-epyc-2t/demo.yaml",
        config=f"{LONG} γ5",
        items=[CheckItem("speedup", "1.800×", "1.790×", True, note.strip())],
    )
    console().print(check_table(report))
    out = capsys.readouterr().out
    assert note.strip() in out and f"{LONG} γ5" in out and "…" not in out, out


def test_a_narrow_terminal_folds_a_config_name_and_never_cuts_it():
    """On an 80-column terminal the run's table keeps its numbers whole and folds the name."""
    p = load_profile(FIXED)
    buf = io.StringIO()
    narrow = _console_class()(file=buf, width=80, force_terminal=True, color_system=None, highlight=False)
    run_summary(narrow, p, None)
    text = buf.getvalue()
    assert "…" not in text, text
    m = p.best.metrics
    lines = text.splitlines()
    header = next(line for line in lines if "speedup" in line and "pred." in line)
    assert header.split() == ["config", "speedup", "95%", "CI", "trial", "tok/s", "α", "τ", "pred."], text
    first = next(i for i, line in enumerate(lines) if line.split()[:1] == ["best"])
    speedup = f"{m.speedup:.3f}×"
    assert speedup in lines[first] and f"{m.tokens_per_s:.1f}" in lines[first], text
    # the name, read down its column: the first line up to the speedup, then the lines below it
    start = header.index("config")
    row = [lines[first][start : lines[first].index(speedup)]]
    row += [line[start:] for line in lines[first + 1 :] if line[:start].strip() == "" and line.strip()][:3]
    assert len(row) > 1, text  # 80 columns are too few for it on one line: it folded
    assert "".join("".join(row).split()).startswith("".join(p.best.config.label.split())), (row, text)
