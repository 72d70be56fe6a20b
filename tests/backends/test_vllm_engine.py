"""The vLLM backend against a real vLLM server (its CPU build in its own environment, named by
SPECDEC_VLLM_PYTHON; `.ci/run` installs it): configs measured against the plain server, exactness at
T = 0, the flags recorded, and no server left behind, also after Ctrl-C. Skipped where vLLM is absent.

Each server start costs tens of seconds on a CPU (imports and a compile), so one session serves the
module's tests, and the tests are `alone`: vLLM's engine is pinned to a core and times the steps."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specdec_tune.backends.base import Models, Purpose

PYTHON = os.environ.get("SPECDEC_VLLM_PYTHON")
pytestmark = [
    pytest.mark.alone,
    pytest.mark.slow,
    pytest.mark.skipif(
        not PYTHON or not Path(PYTHON).is_file(),
        reason="vLLM is absent: set SPECDEC_VLLM_PYTHON to its Python",
    ),
]


def vllm_processes(parent: int | None = None) -> list[str]:
    """Command lines of vLLM servers running now (their engine cores and workers included)."""
    out = subprocess.run(
        ["pgrep", "-af", "vllm.entrypoints|VLLM::|EngineCore"], capture_output=True, text=True
    )
    return [line for line in out.stdout.splitlines() if "pgrep" not in line]


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    from specdec_tune.backends.vllm import open_session

    models = Models(
        target="demo",
        drafts=["ngram:2-4"],
        workload="demo-code",
        prompts=2,
        max_new_tokens=32,
        backend="vllm",
    )
    s = open_session(models, Purpose())
    with s:
        yield s
    assert vllm_processes() == [], "a vLLM server outlived its session"


def test_a_config_against_the_plain_server_exact_at_t0(session):
    from specdec_tune.domain import Config

    spec = session.specs[0]
    (m,) = session.measure([Config(spec, 4)], session.case, 1, 2)
    assert m.metrics.speedup > 0 and len(m.speedups) == 2
    assert m.metrics.baseline_tokens_per_s > 0 and m.metrics.tokens_per_s > 0
    # the demo target copies code: n-gram lookup drafts and some drafts are accepted
    assert 0 < m.metrics.acceptance_rate <= 1 and m.exactness["drafts"] > 0
    # vLLM is exact at T = 0 here, per prompt, or the measurement says where it parted
    assert m.exactness["prompts"] == 2 and m.mismatches == len(m.exactness["first_divergence"])
    spec_json = json.loads(m.flags[m.flags.index("--speculative-config") + 1])
    assert spec_json == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
    }
    # every B = 1 request's counters, both sides: the engine model is fitted from them
    sides = {q.side for q in m.requests}
    assert sides == {"plain", "spec"} and all(q.predicted_ms > 0 for q in m.requests)
    assert session.info()["build"]["package"].startswith("vllm")


def test_a_server_is_kept_for_all_it_measures(session):
    from specdec_tune.domain import Config

    starts = len(session.backend.start_seconds)
    config = Config(session.specs[0], 4)
    assert session.backend.held(config)
    (m,) = session.measure([config], session.case, 2, 1)  # B = 2: the same server, a closed loop
    assert len(session.backend.start_seconds) == starts and m.metrics.tokens_per_s > 0


def test_ctrl_c_mid_run_leaves_no_vllm_process(tmp_path):
    env = {**os.environ, "SPECDEC_VLLM_PYTHON": PYTHON}
    cmd = [sys.executable, "-m", "specdec_tune.cli", "bench", "--backend", "vllm", "--draft", "ngram:3",
           "-g", "3", "--prompts", "1", "--max-new-tokens", "16"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not vllm_processes():
        time.sleep(0.5)
    assert vllm_processes(), "no vLLM server started"
    time.sleep(5)  # mid start-up: its engine core is being made
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert b"Traceback" not in out
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and vllm_processes():
        time.sleep(0.5)
    assert vllm_processes() == []
