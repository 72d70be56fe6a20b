"""`--engine` end to end: a static-mode run records its mode, `check` re-measures under it (and a
profile claiming an unknown mode is refused), `bench`/`profile` accept every mode, bad modes are
one red line."""

from __future__ import annotations

import json

import pytest
import yaml
from helpers import a_verdict, invoke, one_red_line, tiny_args
from rich.console import Console

from specdec_tune.domain import CompileTime
from specdec_tune.output.tables import render_profile
from specdec_tune.runtime import session as session_mod
from specdec_tune.runtime.caches import slots
from specdec_tune.store.yamlio import load_profile


@pytest.mark.parametrize("command", ["bench", "profile", "run"])
def test_an_unknown_engine_mode_is_one_red_line(tiny_dirs, command):
    one_red_line(invoke(command, *tiny_args(tiny_dirs, "--engine", "turbo")))


@pytest.mark.slow
def test_a_static_run_records_its_mode_and_check_re_measures_under_it(tiny_dirs, tmp_path, monkeypatch):
    out = tmp_path / "static.yaml"
    r = invoke(
        "run",
        *tiny_args(
            tiny_dirs, "--draft", "prompt-lookup", "--engine", "static", "--trials", "2", "--max-gamma", "2",
            "-n", "4", "--repeats", "1", "--finalists", "0", "--no-profile",
            "--storage", f"sqlite:///{tmp_path / 's.db'}", "--out", out,
        ),
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    p = load_profile(out)
    assert p.engine_mode == "static" and p.compile_fallbacks == [] and p.engine_choice is None
    assert p.compile == CompileTime(0, 0.0)  # static: recorded, and nothing was compiled
    seen = []
    real_open = session_mod.load_models

    def spy(*args, **kwargs):
        s = real_open(*args, **kwargs)
        seen.append(s.engine_mode)
        return s

    monkeypatch.setattr(session_mod, "load_models", spy)
    # the anchors are not this test's subject: a quiet CI VM's matmul moved 1.39x between run and check
    c = invoke("check", out, "--json", "--tolerance", "0.9", "--repeats", "1", "--allow-other-hardware")
    a_verdict(c)
    assert seen == ["static"]
    data = yaml.safe_load(out.read_text())
    data["engine_mode"] = "warp"
    out.write_text(yaml.safe_dump(data))
    bad = invoke("check", out)
    assert bad.exit_code == 2 and "engine_mode" in bad.stderr


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["eager", "static"])
def test_bench_and_profile_run_in_every_mode(tiny_dirs, mode):
    b = invoke("bench", *tiny_args(tiny_dirs, "--draft", "prompt-lookup", "-g", "2", "-n", "4", "--repeats", "1",
                                   "--engine", mode, "--json"))  # fmt: skip
    assert b.exit_code == 0, b.output
    assert json.loads(b.stdout)["mismatches"] == 0
    p = invoke("profile", *tiny_args(tiny_dirs, "--draft", "prompt-lookup", "--max-gamma", "2", "--repeats", "1",
                                     "-n", "4", "--engine", mode, "--json"))  # fmt: skip
    assert p.exit_code == 0, p.output
    assert json.loads(p.stdout)["costs"]["engine_mode"] == mode


@pytest.mark.slow
def test_compiled_profile_and_run_record_their_graph_builds_apart(tiny_dirs, tmp_path, monkeypatch):
    # No inductor in a unit test: the compiled caches run their step eagerly, so each new input
    # width's first call is what the context counts and times as a graph build.
    monkeypatch.setattr(slots, "_compile", lambda fn, device: fn)
    p = invoke("profile", *tiny_args(tiny_dirs, "--draft", "prompt-lookup", "--max-gamma", "2", "--repeats", "1",
                                     "-n", "4", "--engine", "compiled", "--json"))  # fmt: skip
    assert p.exit_code == 0, p.output
    built = json.loads(p.stdout)["costs"]["compile"]
    assert built["graphs"] >= 3 and built["compile_s"] > 0  # the target's curve: widths 1..3 at least
    out = tmp_path / "compiled.yaml"
    r = invoke(
        "run",
        *tiny_args(
            tiny_dirs, "--draft", "prompt-lookup", "--engine", "compiled", "--trials", "2", "--max-gamma", "2",
            "-n", "4", "--repeats", "1", "--finalists", "0", "--no-profile",
            "--storage", f"sqlite:///{tmp_path / 's.db'}", "--out", out,
        ),
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    prof = load_profile(out)
    assert prof.engine_mode == "compiled" and prof.compile.graphs >= 2 and prof.compile.compile_s > 0
    console = Console(width=200, record=True)
    render_profile(prof, console)
    shown = [line for line in console.export_text().splitlines() if "graphs built in" in line]
    assert len(shown) == 1 and f"{prof.compile.graphs} graphs built" in shown[0]
