"""`check --models-root DIR` (and SPECDEC_MODELS_ROOT): a profile may load only demo models,
bundled shapes and workloads, cached HF ids, and files inside DIR; loader failures are exit 2."""

from __future__ import annotations

import dataclasses
import os

import pytest
from helpers import invoke, make_sample_profile

from specdec_tune.app.confine import confine_model, confine_workload, models_root
from specdec_tune.backends.native import open_stored as open_models
from specdec_tune.errors import SpecDecError
from specdec_tune.store.yamlio import save_profile


def _profile(folder, target_path="demo", draft_path="draft-1l", workload="demo-code"):
    p = make_sample_profile()
    p = dataclasses.replace(
        p,
        target=dataclasses.replace(p.target, name="t", path=target_path),
        workload=dataclasses.replace(p.workload, name=workload),
        best=dataclasses.replace(
            p.best,
            config=dataclasses.replace(
                p.best.config, draft=dataclasses.replace(p.best.config.draft, path=draft_path)
            ),
        ),
    )
    return save_profile(p, folder / "profiles" / "p.yaml")


@pytest.mark.parametrize(
    "where",
    [
        {"target_path": "/etc"},
        {"target_path": "../../.."},
        {"draft_path": "../../../../../../usr"},
        {"draft_path": "shape:/etc/passwd.json"},
        {"workload": "/etc/passwd"},
        {"workload": "../../secret.jsonl"},
    ],
)
@pytest.mark.parametrize("via_env", [False, True])
def test_check_refuses_what_lies_outside_the_root(tmp_path, monkeypatch, where, via_env):
    root = tmp_path / "root"
    root.mkdir()
    path = _profile(root, **where)
    if via_env:
        monkeypatch.setenv("SPECDEC_MODELS_ROOT", str(root))
        result = invoke("check", path, "--device", "cpu")
    else:
        result = invoke("check", path, "--device", "cpu", "--models-root", root)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert err.startswith("error:") and "outside --models-root" in err and "\n" not in err


def test_symlink_out_of_the_root_is_refused(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, root / "model")
    with pytest.raises(SpecDecError, match="outside --models-root"):
        confine_model(str(root / "model"), models_root(root), "target")


def test_allowed_references(tmp_path):
    root = models_root(tmp_path)
    (tmp_path / "m").mkdir()
    for ref in ("demo", "draft-1l", "meta-llama/Llama-3.1-8B", str(tmp_path / "m")):
        confine_model(ref, root, "target")
    confine_workload("demo-code", root)
    confine_model("/etc", None, "target")  # no root: nothing refused (documented)


def test_a_root_that_is_no_folder_is_exit_2(tmp_path):
    result = invoke("check", _profile(tmp_path), "--models-root", tmp_path / "nope")
    assert result.exit_code == 2 and "is not a folder" in result.stderr


@pytest.mark.parametrize(
    "exc", [TypeError("bad config"), AttributeError("x"), RuntimeError("y"), ImportError("z")]
)
def test_any_loader_error_is_a_user_error(exc):
    class Broken:
        def open(self, lazy_drafts: bool = True):
            raise exc

    with pytest.raises(SpecDecError, match=type(exc).__name__):
        open_models(Broken())
