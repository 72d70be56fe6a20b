"""The vLLM backend against a real vLLM server (its CPU build in its own environment, named by
SPECDEC_VLLM_PYTHON; `.ci/run` installs it): configs measured against the plain server, exactness at
T = 0, the flags recorded, and no server left behind, also after Ctrl-C. Skipped where vLLM is absent.

Each server start costs tens of seconds on a CPU (imports and a compile), so one session serves all
that the first test asks of a session, and only the test that judges speed is `alone`."""

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
    pytest.mark.slow,
    pytest.mark.skipif(
        not PYTHON or not Path(PYTHON).is_file(),
        reason="vLLM is absent: set SPECDEC_VLLM_PYTHON to its Python",
    ),
]


def started_by(parent: int) -> set[int]:
    """The process groups of the vLLM servers `parent` started: each server leads its own group."""
    out = set()
    for line in vllm_processes():
        pid, pgid = (int(x) for x in line.split()[:2])
        try:
            ppid = int((Path("/proc") / str(pid) / "stat").read_text().split(") ", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and pid == pgid:
            out.add(pgid)
    return out


def vllm_processes(groups: set[int] | None = None) -> list[str]:
    """Live vLLM processes (servers, engine cores, workers) as "pid pgid command"; only those of the
    process `groups` when given (each server's group is its own). A zombie is not alive: it waits
    only for PID 1 to reap it."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state, _, pgid = (d / "stat").read_text().split(") ", 1)[1].split()[:3]
        except (OSError, IndexError, ValueError):
            continue
        if state == "Z" or ("vllm.entrypoints" not in cmd and "VLLM::" not in cmd):
            continue
        if groups is None or int(pgid) in groups:
            out.append(f"{d.name} {pgid} {cmd[:200]}")
    return out


def groups_of(processes: list[str]) -> set[int]:
    return {int(p.split()[1]) for p in processes}


# Extra engine arguments pass through to every server and are recorded: here, vLLM's eager mode,
# so a start compiles nothing (the tests judge what the engine computes, not how fast).
EXTRA = "--enforce-eager"


def test_a_config_against_the_plain_server_exact_at_t0_and_its_server_kept(monkeypatch):
    """One session in one test, judged by what vLLM computed, not how fast: it runs beside other
    tests, and the servers it must not leave behind are those this process started (a module-scoped
    session was shared by tests the xdist workers split: each opened its own, and one's teardown
    counted the other's servers as left behind)."""
    from specdec_tune.backends.vllm import open_session
    from specdec_tune.domain import Config

    monkeypatch.setenv("SPECDEC_VLLM_ARGS", EXTRA)
    models = Models(
        target="demo",
        drafts=["ngram:2-4"],
        workload="demo-code",
        prompts=2,
        max_new_tokens=32,
        backend="vllm",
    )
    with open_session(models, Purpose()) as session:
        spec = session.specs[0]
        (m,) = session.measure([Config(spec, 4)], session.case, 1, 2)
        assert m.metrics.speedup > 0 and len(m.speedups) == 2
        assert m.metrics.baseline_tokens_per_s > 0 and m.metrics.tokens_per_s > 0
        # the demo target copies code: n-gram lookup drafts and some drafts are accepted
        assert 0 < m.metrics.acceptance_rate <= 1 and m.exactness["drafts"] > 0
        # vLLM is exact at T = 0 here, per prompt, or the measurement says where it parted
        assert m.exactness["prompts"] == 2 and m.mismatches == len(m.exactness["first_divergence"])
        assert EXTRA in m.flags and session.info()["engine_args"] == [EXTRA]  # passed through, recorded
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

        # a server is kept for all it measures: B = 2 runs a closed loop on the same server
        config = Config(spec, 4)
        starts = len(session.backend.start_seconds)
        assert session.backend.held(config)
        (m2,) = session.measure([config], session.case, 2, 1)
        assert len(session.backend.start_seconds) == starts and m2.metrics.tokens_per_s > 0
        mine = started_by(os.getpid())
        assert len(mine) >= 2  # the plain server and the config's, each its own process group
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and vllm_processes(mine):
        time.sleep(0.5)
    assert vllm_processes(mine) == [], "a vLLM server outlived its session"


def test_ctrl_c_mid_run_leaves_no_vllm_process(tmp_path):
    env = {**os.environ, "SPECDEC_VLLM_PYTHON": PYTHON, "SPECDEC_VLLM_ARGS": EXTRA}
    # 50 repeats: minutes of passes once both servers are up, so the interrupt lands mid-run however
    # late this loop sees an engine core
    cmd = [sys.executable, "-m", "specdec_tune.cli", "bench", "--backend", "vllm", "--draft", "ngram:3",
           "-g", "3", "--prompts", "1", "--max-new-tokens", "16", "--repeats", "50"]  # fmt: skip
    # Ctrl-C as a terminal delivers it: SIGINT at its default in the bench, whatever this test inherited
    # (a background job of a shell without job control ignores it, and an ignored SIGINT survives exec:
    # the bench then ran all its repeats and exited 0)
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    mine: set[int] = set()
    started = time.monotonic()
    deadline = started + 300
    while time.monotonic() < deadline and proc.poll() is None:
        mine = started_by(proc.pid)  # another test's servers, beside this one, are not its
        if any("VLLM::EngineCore" in p for p in vllm_processes(mine)) if mine else False:
            break  # mid start-up: its engine core is being made
        time.sleep(0.1)
    seen_s = time.monotonic() - started
    assert mine, "no vLLM server started"
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    said = out.decode(errors="replace")[-2000:]
    assert proc.returncode == 130, f"exit {proc.returncode}, engine core seen after {seen_s:.1f} s: {said}"
    assert "Traceback" not in said
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and vllm_processes(mine):
        time.sleep(0.5)
    assert vllm_processes(mine) == []


@pytest.mark.alone  # it measures speed: another test's load would only widen what it measured
def test_run_check_export_end_to_end(tmp_path):
    """`run --backend vllm` writes a profile of what vLLM measured; `check` re-measures it in fresh
    vLLM servers and reports on it; `export --to vllm` emits the command that ran."""
    from typer.testing import CliRunner

    from specdec_tune.cli import app
    from specdec_tune.store.yamlio import load_profile

    env = {"SPECDEC_VLLM_PYTHON": PYTHON, "SPECDEC_VLLM_ARGS": EXTRA}
    others = groups_of(vllm_processes())  # a server another test left behind is not this one's to judge

    def left() -> list[str]:
        return [p for p in vllm_processes() if int(p.split()[1]) not in others]

    out = tmp_path / "p.yaml"
    runner = CliRunner(env=env)
    r = runner.invoke(app, [
        "run", "--backend", "vllm", "--target", "demo", "-d", "ngram:2-4", "--workload", "demo-code",
        "--trials", "2", "--max-gamma", "4", "--finalists", "2", "--final-repeats", "2", "--prompts", "2",
        "-n", "24", "--repeats", "2", "--storage", f"sqlite:///{tmp_path / 's.db'}", "--out", str(out),
    ])  # fmt: skip
    assert r.exit_code == 0, r.output
    p = load_profile(out)
    assert p.backend.name == "vllm" and p.backend.build["package"].startswith("vllm")
    assert p.backend.launcher[1:] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert p.backend.engine_args == [EXTRA] and p.backend.start_s and p.backend.start_s > 0
    assert p.costs.engine_mode == "engine" and p.costs.t_target_ms > 0 and len(p.costs.verify_ms) == 4
    # vLLM's auto dtype, resolved where this CPU has no bfloat16 matmul (backends.vllm.server.run_dtype)
    from specdec_tune.measure.hardware import local_cpu_isa, machine_id

    assert p.anchors.machine == machine_id()  # its plain rates came from fresh servers: judged here again

    avx2 = local_cpu_isa() == "avx2"
    assert p.target.dtype == ("float32" if avx2 else "auto")
    assert ("--dtype" in p.best.backend_args) == avx2
    assert p.baseline.tokens_per_s > 0 and p.noise is not None
    assert left() == []
    best = next(x for x in [p.best, *p.alternatives] if x.config.gamma > 0)
    assert best.backend_args[:2] == ["--model", str(Path(best.backend_args[1]))]
    assert "--speculative-config" in best.backend_args and EXTRA in best.backend_args

    # `check` re-measures the stored best in fresh vLLM servers, through the one pipeline. Its
    # verdict on the unchanged profile is not asserted: between fresh server pairs this engine's
    # speedup moved by more than a planted 15 % minus the tolerance (docs/vllm.md: 3.15x and 3.45x
    # for a stored 3.23x); its detection of 15 % is measured by `benchmarks/vllm.sh check`. A
    # speculative side planted 3x slower (measure.planted) is a regression whatever the pair, and
    # its doubt is confirmed in a new server pair (VllmSession.renew) with as many repeats again.
    if p.best.config.gamma > 0:
        planted = CliRunner(env={**env, "SPECDEC_TEST_SLOWER_SPEC": "3.0"})
        c = planted.invoke(app, ["check", str(out), "--repeats", "3", "--json"])
        assert c.exit_code == 1, c.output
        report = json.loads(c.stdout[c.stdout.index("{") :])
        items = {i["metric"]: i for i in report["items"]}
        assert report["config"] == p.best.config.label
        assert items["target weights"]["ok"]  # the same weights, found again in vLLM's model folder
        assert not items["speedup"]["ok"] and "re-measured: 6 repeats" in items["speedup"]["note"]
        assert items["speedup"]["measured"] < items["speedup"]["stored"] / 2
        # T = 0: the same tokens drafted and accepted as in the run, in both server pairs
        assert items["acceptance_rate"]["ok"] and items["greedy exactness"]["ok"], c.output
    else:  # plain decoding won: check re-measures it, and the report names it
        c = runner.invoke(app, ["check", str(out), "--repeats", "3", "--json"])
        assert c.exit_code in (0, 1, 6), c.output
        assert json.loads(c.stdout[c.stdout.index("{") :])["config"] == p.best.config.label
    assert left() == []
    if p.best.config.gamma > 0:
        e = runner.invoke(app, ["export", str(out), "--to", "vllm", "--format", "json"])
        assert e.exit_code == 0, e.output
        argv = json.loads(e.stdout)["command"]
        assert argv[:3] == p.backend.launcher and argv[3:] == p.best.backend_args
    assert left() == []
