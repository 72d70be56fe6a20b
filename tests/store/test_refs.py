"""Profiles are portable: models by demo name, HF id or a folder relative to the profile; the
storage URL without password or home; a content hash over whole weight files (old hashes still
compared the old way); a profile written in one folder is checked from another folder and cwd."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from helpers import invoke, make_sample_profile

from specdec_tune.runtime.models.loading import (
    HASH_PREFIX,
    content_hash,
    content_hash_like,
    content_hash_v1,
    demo_path,
)
from specdec_tune.store.refs import (
    engine_path,
    make_portable,
    portable_ref,
    resolve_ref,
    storage_for_record,
    target_ref,
)
from specdec_tune.store.yamlio import load_profile

DEMO_PROFILE = Path(__file__).parents[1] / "data" / "profiles" / "cpu-intel-xeon-2t" / "demo.yaml"


def test_references_are_demo_names_hf_ids_or_relative_folders(tmp_path):
    models, profiles = tmp_path / "models" / "m", tmp_path / "profiles" / "hw"
    models.mkdir(parents=True)
    profiles.mkdir(parents=True)
    assert portable_ref("demo", profiles) == "demo"
    assert portable_ref("draft-1l", profiles) == "draft-1l"
    assert portable_ref("meta-llama/Llama-3.2-1B", profiles) == "meta-llama/Llama-3.2-1B"
    ref = portable_ref(str(models), profiles)
    assert ref == "../../models/m"
    assert Path(resolve_ref(ref, profiles)) == models.resolve()
    assert portable_ref(str(profiles), profiles) == "./."
    assert resolve_ref("org/model", profiles) == "org/model"


def test_engine_path_of_a_demo_draft_exists_in_the_installed_package(tmp_path):
    assert Path(engine_path("draft-1l", tmp_path)) == demo_path("draft-1l")
    assert Path(engine_path("draft-1l", tmp_path)).is_dir()


def test_make_portable_leaves_no_absolute_path(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    p = make_sample_profile()
    p.best.config.draft.path = str(folder)
    out = make_portable(p, tmp_path / "profiles" / "x.yaml", str(folder))
    assert out.target.path == out.target.name == "../m"
    assert out.best.config.draft.path == "../m"
    assert out.alternatives[0].config.draft.path == "/models/Llama-3.2-1B-Instruct"  # an HF-like id stays


def test_storage_url_has_no_password_and_no_home():
    home = str(Path.home())
    assert storage_for_record("postgresql://tuner:s3cret@db.example:5432/studies") == (
        "postgresql://tuner:***@db.example:5432/studies"
    )
    assert storage_for_record(f"sqlite:///{home}/.cache/specdec-tune/studies.db") == (
        "sqlite:///~/.cache/specdec-tune/studies.db"
    )


def _weights(folder: Path, middle: bytes) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"\0" * (1 << 20) + middle + b"\0" * 100)


def test_content_hash_covers_whole_weight_files(tmp_path):
    _weights(tmp_path / "a", b"fine-tune 1")
    _weights(tmp_path / "b", b"fine-tune 2")  # same shapes, same first MiB, other weights
    assert content_hash_v1(tmp_path / "a") == content_hash_v1(tmp_path / "b")  # the old blind spot
    assert content_hash(tmp_path / "a") != content_hash(tmp_path / "b")
    assert content_hash(tmp_path / "a").startswith(HASH_PREFIX)
    # an old profile's bare hash is compared with the old algorithm, a new one with the new
    assert content_hash_like("0fa3e1553678f828", tmp_path / "a") == content_hash_v1(tmp_path / "a")
    assert content_hash_like("sha256:0123", tmp_path / "a") == content_hash(tmp_path / "a")


def test_content_hash_reuses_the_hf_cache_blob_name(tmp_path):
    import hashlib

    data = b"weights" * 1000
    sha = hashlib.sha256(data).hexdigest()
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / "abc"
    blobs.mkdir()
    snap.mkdir(parents=True)
    (blobs / sha).write_bytes(b"not read: the name is the hash")
    (snap / "model.safetensors").symlink_to(blobs / sha)
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "model.safetensors").write_bytes(data)
    assert content_hash(snap) == content_hash(plain)


def test_committed_demo_profile_still_loads_and_matches_the_demo_weights():
    p = load_profile(DEMO_PROFILE)
    assert target_ref(p) == "demo"  # its path is another machine's folder: the name is used
    assert content_hash_like(p.target.content_hash, demo_path("demo")) == p.target.content_hash


@pytest.mark.slow
def test_profile_written_in_one_folder_is_checked_from_another(tiny_dirs, tmp_path, monkeypatch):
    """`run --for vllm` in repo/ with relative model folders; the repo moves; check runs from elsewhere."""
    repo = tmp_path / "repo"
    for name in ("target", "draft"):
        shutil.copytree(tiny_dirs[name], repo / "models" / name)
    monkeypatch.chdir(repo)
    out = Path("profiles") / "tiny.yaml"
    r = invoke(
        "run", "--target", "models/target", "--draft", "models/draft", "--draft", "prompt-lookup",
        "--layer-skip", "1", "--workload", tiny_dirs["workload"], "--device", "cpu", "--for", "vllm",
        "--trials", "5", "--max-gamma", "3", "-n", "8", "--repeats", "1", "--finalists", "0",
        "--no-profile", "--storage", f"sqlite:///{tmp_path / 'db.sqlite'}", "--out", out,
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = yaml.safe_load(out.read_text())
    assert doc["target"]["path"] == doc["target"]["name"] == "../models/target"
    # no absolute path of this machine, except the storage URL the user chose
    assert str(tmp_path) not in out.read_text().replace(f"sqlite:///{tmp_path / 'db.sqlite'}", "")
    assert doc["target"]["content_hash"].startswith(HASH_PREFIX)
    # restricted to what vLLM runs: no layer-skip, no threshold, its prompt-lookup policy
    assert doc["search"]["engine"] == "vllm"
    assert doc["search"]["space"]["drafts"] == ["none", "draft", "prompt-lookup"]
    assert doc["search"]["space"]["threshold_drafts"] == []
    for res in [doc["best"], *doc["alternatives"]]:
        assert res["config"]["threshold"] == 0.0
        if res["config"]["draft"]["kind"] == "prompt_lookup":
            assert res["config"]["draft"]["lookup_match"] == "earliest"
        if res["config"]["draft"]["kind"] == "model":
            assert res["config"]["draft"]["path"] == "../models/draft"
    # the repository moves (another checkout, another machine); check runs from another folder
    moved = tmp_path / "elsewhere" / "checkout"
    shutil.copytree(repo, moved)
    shutil.rmtree(repo)
    monkeypatch.chdir(tmp_path)
    c = invoke("check", moved / "profiles" / "tiny.yaml", "--tolerance", "0.9", "--repeats", "1", "--json")
    assert c.exit_code == 0, c.output
    items = {i["metric"]: i for i in json.loads(c.stdout)["items"]}
    assert items["target weights"]["ok"]
    e = invoke("export", moved / "profiles" / "tiny.yaml", "--to", "vllm", "--json")
    exported = json.loads(e.stdout)
    assert e.exit_code == (0 if exported["exported"] else 5)
    if (exported["settings"] or {}).get("method") == "draft_model":
        assert Path(exported["settings"]["model"]) == (moved / "models" / "draft").resolve()


def test_export_resolves_a_relative_draft_from_the_profile_folder(tmp_path, monkeypatch):
    from specdec_tune import app
    from specdec_tune.store.yamlio import save_profile

    (tmp_path / "models" / "d").mkdir(parents=True)
    p = make_sample_profile(threshold=0.0)
    p.best.config.draft.path = "../models/d"
    path = save_profile(p, tmp_path / "profiles" / "p.yaml")
    monkeypatch.chdir(tmp_path / "models")  # any other working directory
    r = app.export(path, "vllm")
    assert r.settings["model"] == str((tmp_path / "models" / "d").resolve())
