"""`specdec-tune gguf cut|demo`: files written, JSON results, and bad input as one red line (exit 2)."""

from __future__ import annotations

import json

import pytest
from helpers import invoke, one_red_line, write_tiny_gguf

# GGUF files need the [llamacpp] extra's gguf package; the README's first command installs only [dev]
gguf = pytest.importorskip("gguf", reason="pip install -e '.[llamacpp]'")


def test_gguf_cut_writes_the_cut_beside_the_source(tmp_path):
    src = write_tiny_gguf(tmp_path / "tiny.gguf", blocks=4)
    r = invoke("gguf", "cut", src, "--layers", "3", "--json")
    assert r.exit_code == 0, r.output
    (info,) = json.loads(r.stdout)
    assert info["path"] == str(tmp_path / "tiny-3l.gguf") and info["blocks"] == 3
    reader = gguf.GGUFReader(tmp_path / "tiny-3l.gguf")
    assert reader.get_field("llama.block_count").contents() == 3
    assert info["size_bytes"] == (tmp_path / "tiny-3l.gguf").stat().st_size


def test_gguf_cut_bad_input_is_one_red_line(tmp_path):
    src = write_tiny_gguf(tmp_path / "tiny.gguf", blocks=4)
    r = invoke("gguf", "cut", src, "--layers", "4", "-o", tmp_path / "out.gguf")
    one_red_line(r)
    assert "--layers must be between 1 and 3" in r.stderr
    assert not (tmp_path / "out.gguf").exists()
    r = invoke("gguf", "cut", tmp_path / "missing.gguf", "--layers", "1")
    one_red_line(r)
    assert "does not exist" in r.stderr


def test_gguf_demo_writes_the_pair(tmp_path):
    r = invoke("gguf", "demo", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r.output
    files = {f["model"]: f for f in json.loads(r.stdout)}
    assert files["demo"]["path"] == str(tmp_path / "out" / "demo-target.gguf")
    assert files["draft-1l"]["path"] == str(tmp_path / "out" / "demo-draft.gguf")
    assert (files["demo"]["blocks"], files["draft-1l"]["blocks"]) == (6, 1)
    r = invoke("gguf", "demo", "-o", tmp_path / "out", "--type", "q4")
    one_red_line(r)
    assert "use f32 or f16" in r.stderr
