"""The command line (`specdec-tune`): the typer `app` and its commands (`main`: the root commands,
`run`, `profiles`: export and show, `studies`, `gguf`), the options they share (`options`) and the
terminal (`terminal`: consoles, the error guard, progress). Parse, call one `app` use case, render.
"""

from __future__ import annotations

from .main import app, main

__all__ = ["app", "main"]
