"""vLLM as a measuring backend (`--backend vllm`): every trial runs inside vLLM's own OpenAI server,
started from vLLM's own environment (`SPECDEC_VLLM_PYTHON`), each config's server against a plain
one on loopback. Registered by name in `backends.base.BACKENDS`; nothing outside this package
knows it.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from ...errors import SpecDecError
from ...measure.servers import ServerError, servers_die_with_us
from ..base import Models, Purpose
from .args import ENGINE_MAX_GAMMA
from .server import build_info, find_python
from .session import VllmSession

DEFAULT_MAX_GAMMA = ENGINE_MAX_GAMMA  # `run --max-gamma`'s default in vLLM

__all__ = ["DEFAULT_MAX_GAMMA", "VllmSession", "engine_build", "open_session"]


@contextlib.contextmanager
def _server_failures() -> Any:
    """A server that fails outside a trial (the plain one, the costs) ends the command in one line."""
    try:
        yield
    except ServerError as exc:
        raise SpecDecError(str(exc)) from None


def engine_build(models: Models) -> dict[str, Any]:
    """The vLLM build `models` would start: its package and torch versions (no server started)."""
    return dict(build_info(find_python(models.server)))


def open_session(models: Models, purpose: Purpose) -> VllmSession:
    """The session, its servers tied to this command (stopped on exit, Ctrl-C and SIGTERM)."""
    stack = contextlib.ExitStack()
    stack.enter_context(servers_die_with_us())
    stack.enter_context(_server_failures())
    try:
        session = VllmSession(models, purpose)
    except BaseException:
        if not stack.__exit__(*sys.exc_info()):
            raise
        raise
    session._stack = stack
    return session
