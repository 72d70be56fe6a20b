"""Values from a profile reach the terminal as text: rich markup, emoji codes and control
characters in names are printed inert, and the error handler cannot fail on its own message."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import invoke, make_sample_profile

from specdec_tune.cli.terminal import user_errors
from specdec_tune.errors import SpecDecError
from specdec_tune.store.yamlio import save_profile

HOSTILE = ["[/x]", "[bold red]x[/]", "[link=file:///etc/passwd]y[/link]", ":skull: [/]", "a\x1b]0;pwned\x07b"]


def _hostile_profile(tmp_path, name: str):
    p = make_sample_profile()
    p = dataclasses.replace(
        p,
        target=dataclasses.replace(p.target, name=name),
        hardware={**p.hardware, "gpu_name": name},
        best=dataclasses.replace(
            p.best,
            config=dataclasses.replace(
                p.best.config, draft=dataclasses.replace(p.best.config.draft, name=name)
            ),
        ),
    )
    return save_profile(p, tmp_path / "p.yaml")


@pytest.mark.parametrize("name", HOSTILE)
@pytest.mark.parametrize("command", [["show"], ["export", "--to", "hf"], ["export", "--to", "vllm"]])
def test_hostile_names_print_as_text(tmp_path, name, command):
    path = _hostile_profile(tmp_path, name)
    result = invoke(command[0], path, *command[1:])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\x07" not in result.output
    if command[0] == "show" and "\x1b" not in name:
        assert name in result.stdout  # shown literally, brackets and all


def test_show_renders_literal_markup(tmp_path):
    result = invoke("show", _hostile_profile(tmp_path, "[bold]evil[/bold]"))
    assert result.exit_code == 0
    assert "[bold]evil[/bold]" in result.stdout


@pytest.mark.parametrize("message", ["[/x]", "[/]", "bad [red]", "two\nlines\x1b[2J"])
def test_error_handler_survives_markup(capsys, message):
    import typer

    with pytest.raises(typer.Exit) as exc, user_errors():
        raise SpecDecError(message)
    assert exc.value.exit_code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err and "\x1b" not in err
    assert "lines" in err or "[" in err


def test_error_handler_survives_unprintable_exception(capsys):
    import typer

    class Broken(SpecDecError):
        def __str__(self) -> str:
            raise RuntimeError("no")

    with pytest.raises(typer.Exit) as exc, user_errors():
        raise Broken()
    assert exc.value.exit_code == 2
    assert capsys.readouterr().err.startswith("error: <Broken>")
