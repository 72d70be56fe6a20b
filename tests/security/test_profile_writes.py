"""`run` never silently replaces another target's profile: one red line, exit 2, before anything is
measured, the file untouched; `--force` replaces it, and the pair it writes matches. Default
names of GGUF targets (the llama.cpp backend) keep their folder apart too."""

from __future__ import annotations

import hashlib

import pytest
from helpers import invoke, make_sample_profile, one_red_line, tiny_args

from specdec_tune.store.refs import profile_file_slug
from specdec_tune.store.runfiles import trials_beside, trials_path
from specdec_tune.store.yamlio import load_profile, save_profile

SMALL = ["--draft", "prompt-lookup", "--trials", "2", "--max-gamma", "2", "-n", "4", "--repeats", "1"]
SMALL += ["--finalists", "0", "--no-profile", "--engine", "eager", "--budget", "0"]


def test_run_refuses_to_replace_another_targets_profile(tiny_dirs, tmp_path):
    out = tmp_path / "p.yaml"
    save_profile(make_sample_profile(), out)  # meta-llama/Llama-3.1-8B-Instruct's profile
    (tmp_path / "p.trials.csv").write_text("theirs\n")
    before = out.read_bytes()
    storage = f"sqlite:///{tmp_path / 's.db'}"
    r = invoke("run", *tiny_args(tiny_dirs, *SMALL, "--storage", storage, "--out", out))
    one_red_line(r)
    assert "another target" in r.stderr and "--force" in r.stderr
    assert out.read_bytes() == before and (tmp_path / "p.trials.csv").read_text() == "theirs\n"
    assert not (tmp_path / "s.db").exists()  # refused before anything was measured or stored


def test_run_refuses_to_replace_a_file_that_is_no_profile(tiny_dirs, tmp_path):
    out = tmp_path / "notes.yaml"
    out.write_text("- not a profile\n")
    r = invoke(
        "run", *tiny_args(tiny_dirs, *SMALL, "--storage", f"sqlite:///{tmp_path / 's.db'}", "--out", out)
    )
    one_red_line(r)
    assert "not a readable profile" in r.stderr and out.read_text() == "- not a profile\n"


@pytest.mark.slow  # two runs end to end
def test_run_force_replaces_it_and_writes_a_matching_pair(tiny_dirs, tmp_path):
    out = tmp_path / "p.yaml"
    save_profile(make_sample_profile(), out)
    storage = f"sqlite:///{tmp_path / 's.db'}"
    r = invoke("run", *tiny_args(tiny_dirs, *SMALL, "--storage", storage, "--out", out, "--force", "--json"))
    assert r.exit_code == 0 and r.exception is None, r.output
    p = load_profile(out)
    assert p.target.content_hash != make_sample_profile().target.content_hash
    csv = trials_path(out)
    assert p.trials_sha256 == hashlib.sha256(csv.read_bytes()).hexdigest()
    assert trials_beside(p, out) == (csv, None)
    # the same target again needs no --force: its own profile is replaced
    again = invoke("run", *tiny_args(tiny_dirs, *SMALL, "--storage", storage, "--out", out, "--json"))
    assert again.exit_code == 0 and again.exception is None, again.output


def test_default_names_of_gguf_targets_keep_their_folder(tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "model.gguf").write_bytes(b"GGUF")
    a, b = (profile_file_slug(str(tmp_path / f / "model.gguf")) for f in ("a", "b"))
    assert a != b and a.startswith("model.gguf-") and b.startswith("model.gguf-"), (a, b)
    # names that are no path keep their plain slug (no hash of the folder they were typed in)
    assert profile_file_slug("smollm2-135m") == "smollm2-135m" and profile_file_slug("gpt2") == "gpt2"
