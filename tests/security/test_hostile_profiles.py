"""The hostile-profile corpus (tests/security/corpus.py) against `show` and `check`: every file
ends with exit 2 and one line, quickly and in bounded memory, without a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from corpus import PROFILES
from helpers import invoke

REPO = Path(__file__).resolve().parents[2]


def _one_line_exit_2(result) -> None:
    # CliRunner catches what escapes the command into result.exception: only SystemExit is allowed
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code in (2, 3), (result.exit_code, result.output)
    err = result.stderr.strip()
    assert err.startswith("error:") and "\n" not in err, err
    assert len(err) < 2500
    assert "Traceback" not in result.output


@pytest.mark.parametrize("case", sorted(PROFILES))
def test_show_refuses_crafted_profile(tmp_path, case):
    path = PROFILES[case](tmp_path)
    started = time.monotonic()
    result = invoke("show", path, "--json")
    assert time.monotonic() - started < 5.0
    _one_line_exit_2(result)
    assert result.stdout == ""  # nothing half-printed before the error


@pytest.mark.parametrize("case", ["alias-bomb-hardware", "max-new-tokens-1e30", "deep-nesting-top"])
def test_check_and_export_refuse_crafted_profile(tmp_path, case):
    path = PROFILES[case](tmp_path)
    for args in (["check", path, "--device", "cpu"], ["export", path, "--to", "vllm"]):
        _one_line_exit_2(invoke(*args))


# Real processes: CliRunner hides what a real interpreter would print; memory is capped with
# RLIMIT_AS so an expansion bomb would die instead of passing slowly.
@pytest.mark.parametrize(
    "case",
    ["alias-bomb-hardware", "alias-bomb-space", "huge-int-hardware", "deep-nesting-top", "over-size-cap"],
)
def test_crafted_profile_in_a_real_process(tmp_path, case):
    path = PROFILES[case](tmp_path)
    code = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1500 << 20, 1500 << 20)); "
        "from specdec_tune.cli import app; sys.argv = ['specdec-tune', 'show', sys.argv[1]]; app()"
    )
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60, env=env, cwd=REPO
    )
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip()
    assert err.startswith("error:") and "\n" not in err and "Traceback" not in err, err
    assert proc.stdout == ""
    assert time.monotonic() - started < 30  # interpreter start included; the parse itself is < 5 s


def test_demo_profiles_of_earlier_versions_still_load():
    """Fixed copies of profiles shipped before (schema 1 and 2); tests/test_committed_profiles.py
    checks the ones shipped now."""
    from specdec_tune.store.yamlio import load_profile

    paths = sorted((REPO / "tests" / "data" / "profiles").glob("*/demo.yaml"))
    assert len(paths) == 2
    for path in paths:
        assert load_profile(path).target.name == "demo"


def test_trials_csv_with_inf_and_nan_is_not_an_internal_error(tmp_path):
    from helpers import make_sample_profile

    from specdec_tune.store.yamlio import save_profile

    path = save_profile(make_sample_profile(), tmp_path / "p.yaml")
    csv = tmp_path / "t.csv"
    csv.write_text(
        "number,draft,gamma,threshold,speedup,state\n"
        "0,lookup,inf,0.0,1.2,COMPLETE\n1,lookup,nan,0.0,1.1,COMPLETE\n2,lookup,3,nan,inf,COMPLETE\n"
        "3,lookup,99999999999999999999999,0.0,1.0,COMPLETE\n4,lookup,2,0.1,1.05,COMPLETE\n"
    )
    result = invoke("show", path, "--trials", csv)
    assert isinstance(result.exception, SystemExit) or result.exception is None, repr(result.exception)
    assert result.exit_code == 0, result.output
