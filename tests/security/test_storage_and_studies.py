"""Storage URLs: passwords never printed or stored; `studies` never creates a storage and deletes
only with --yes, only what it names (or, with --all, only specdec-tune's studies), never a study
with running trials unless forced."""

from __future__ import annotations

import optuna
import pytest
from helpers import invoke

from specdec_tune.search.storage import open_storage
from specdec_tune.search.study import CREATED_BY, TOOL
from specdec_tune.store.refs import storage_for_record
from specdec_tune.urls import redact_url, scrub

SECRET = "s3cr3t-Pw"

URLS = [
    f"postgresql://user:{SECRET}@127.0.0.1:1/db",
    f"postgresql+psycopg://:{SECRET}@127.0.0.1:1/db",
    f"postgresql://user@127.0.0.1:1/db?password={SECRET}",
    f"postgresql://user@127.0.0.1:1/db?sslpassword={SECRET}&sslmode=require",
    f"mysql+pymysql://user@127.0.0.1:1/db?passwd={SECRET}",
    f"mysql://u:{SECRET}@127.0.0.1:1/db",
    f"nosuchdialect://u:{SECRET}@host/db",
    f"http://u:{SECRET}@example.invalid/x",
    f"not a url //u:{SECRET}@",
    f"oracle://u:{SECRET}@127.0.0.1:1/db",
]


@pytest.mark.parametrize("url", URLS)
def test_redaction_masks_every_form(url):
    assert SECRET not in redact_url(url)
    assert SECRET not in storage_for_record(url)
    assert SECRET not in scrub(f"driver said: bad password {SECRET} for {url}", url)


@pytest.mark.parametrize("url", URLS)
@pytest.mark.parametrize("command", ["list", "show"])
def test_studies_on_hostile_urls_are_one_line_without_password(url, command, monkeypatch):
    from specdec_tune.search import storage

    monkeypatch.setattr(storage, "RETRY_S", 0.0)  # nothing listens on port 1: no retry can reach it
    args = ["studies", command] + (["x"] if command == "show" else []) + ["--storage", url]
    result = invoke(*args)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert err.startswith("error:") and "\n" not in err
    assert SECRET not in result.output


@pytest.mark.parametrize("command", [["list"], ["show", "x"], ["delete", "x", "--yes"]])
def test_studies_never_create_a_sqlite_storage(tmp_path, command):
    db = tmp_path / "typo.db"
    result = invoke("studies", *command, "--storage", f"sqlite:///{db}")
    assert result.exit_code == 2 and "does not exist" in result.stderr
    assert not db.exists()


def _storage_with_studies(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    store = open_storage(url)
    ours = optuna.create_study(study_name="specdec-ours", storage=store)
    ours.set_user_attr(CREATED_BY, TOOL)
    ours.tell(ours.ask(), 1.0)
    optuna.create_study(study_name="someone-elses", storage=store).tell(
        optuna.load_study(study_name="someone-elses", storage=store).ask(), 2.0
    )
    busy = optuna.create_study(study_name="specdec-busy", storage=store)
    busy.set_user_attr(CREATED_BY, TOOL)
    busy.ask()  # a trial left RUNNING
    return url


def _names(url):
    result = invoke("studies", "list", "--storage", url, "--json")
    import json

    return sorted(s["name"] for s in json.loads(result.stdout))


def test_delete_needs_yes_and_refuses_name_with_all(tmp_path):
    url = _storage_with_studies(tmp_path)
    assert invoke("studies", "delete", "specdec-ours", "--storage", url).exit_code == 2
    r = invoke("studies", "delete", "specdec-ours", "--all", "--yes", "--storage", url)
    assert r.exit_code == 2 and "not both" in r.stderr
    assert _names(url) == ["someone-elses", "specdec-busy", "specdec-ours"]


def test_delete_all_keeps_other_tools_and_running_studies(tmp_path):
    url = _storage_with_studies(tmp_path)
    r = invoke("studies", "delete", "--all", "--yes", "--storage", url)
    assert r.exit_code == 2 and "running trials" in r.stderr and "specdec-busy" in r.stderr
    assert _names(url) == ["someone-elses", "specdec-busy", "specdec-ours"]  # nothing deleted
    assert invoke("studies", "delete", "specdec-ours", "--yes", "--storage", url).exit_code == 0
    assert invoke("studies", "delete", "--all", "--yes", "--force", "--storage", url).exit_code == 0
    assert _names(url) == ["someone-elses"]


def _profile_holding(url, tmp_path):
    """A profile file whose study storage holds `url` as written (by hand or an older version)."""
    import dataclasses
    import json

    from helpers import make_sample_profile

    from specdec_tune.store.yamlio import save_profile

    p = make_sample_profile()
    p.search = dataclasses.replace(p.search, storage="sqlite:///PLACEHOLDER.db")
    path = save_profile(p, tmp_path / "p.yaml")
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace("sqlite:///PLACEHOLDER.db", json.dumps(url)), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://user:{SECRET}@db.example/studies",
        f"postgresql://user@db.example/studies?password={SECRET}",
        f"mysql://:{SECRET}@db.example/studies",
    ],
)
def test_show_and_save_never_print_or_write_the_storage_password(url, tmp_path, monkeypatch):
    from specdec_tune.store.yamlio import load_profile, save_profile

    monkeypatch.setenv("COLUMNS", "400")  # the study row on one line: a wrapped URL would hide it
    path = _profile_holding(url, tmp_path)
    assert SECRET in path.read_text(encoding="utf-8")  # the file as the user wrote it
    table = invoke("show", path)
    assert table.exit_code == 0, table.output
    study = next(line for line in table.stdout.splitlines() if "db.example" in line)
    assert SECRET not in table.output and "***" in study
    j = invoke("show", path, "--json")
    assert j.exit_code == 0 and SECRET not in j.output and "***" in j.stdout
    saved = save_profile(load_profile(path), tmp_path / "again.yaml")
    assert SECRET not in saved.read_text(encoding="utf-8")
