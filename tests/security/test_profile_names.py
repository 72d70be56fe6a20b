"""Default profile file names never collide across orgs or folders; the demo keeps demo.yaml."""

from __future__ import annotations

from specdec_tune.store.refs import profile_file_slug


def test_default_names_keep_the_org_and_hash_folders(tmp_path):
    (tmp_path / "a" / "hf").mkdir(parents=True)
    (tmp_path / "b" / "hf").mkdir(parents=True)
    names = {
        profile_file_slug(n)
        for n in ("org-a/Llama-3.1-8B", "org-b/Llama-3.1-8B", str(tmp_path / "a/hf"), str(tmp_path / "b/hf"))
    }
    assert len(names) == 4
    assert profile_file_slug("org-a/Llama-3.1-8B") == "org-a--llama-3.1-8b"
    assert profile_file_slug("demo") == "demo"  # profiles/cpu-*/demo.yaml stay valid
    assert profile_file_slug(str(tmp_path / "a/hf")) == profile_file_slug(str(tmp_path / "a/hf/"))
