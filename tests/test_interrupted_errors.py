"""cli.terminal.user_errors: an error raised while an interrupt unwinds is the interrupt."""

from __future__ import annotations

import pytest
import typer

from specdec_tune.cli.terminal import user_errors


def test_an_error_raised_while_an_interrupt_unwinds_exits_as_interrupted(capsys):
    """Optuna 5.1's `_run_trial` reads an unbound `updated_state` in a `finally` when a SIGTERM's
    KeyboardInterrupt lands inside its tell: that run exited 4, "internal error", in CI."""

    def optuna_like() -> None:
        try:
            raise KeyboardInterrupt
        finally:
            raise UnboundLocalError("cannot access local variable 'updated_state'")

    with pytest.raises(typer.Exit) as exited, user_errors():
        optuna_like()
    assert exited.value.exit_code == 130 and "interrupted" in capsys.readouterr().err
    # an error of its own, with no interrupt behind it, is still an internal error
    with pytest.raises(typer.Exit) as exited, user_errors():
        raise UnboundLocalError("a bug")
    assert exited.value.exit_code == 4 and "internal error" in capsys.readouterr().err
