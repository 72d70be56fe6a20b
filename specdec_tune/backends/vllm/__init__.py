"""vLLM as a measuring backend (`--backend vllm`): every trial runs inside vLLM's own OpenAI server,
started from vLLM's own environment (`SPECDEC_VLLM_PYTHON`), each config's server against a plain
one on loopback. Registered by name in `backends.base.BACKENDS`; nothing outside this package
knows it.
"""

from __future__ import annotations

from typing import Any

from ...measure.servers import ServerError
from ..base import Models, Purpose
from ..server_session import failures_as_one_line, open_tied
from .args import ENGINE_MAX_GAMMA
from .server import build_info, find_python
from .session import VllmSession

DEFAULT_MAX_GAMMA = ENGINE_MAX_GAMMA  # `run --max-gamma`'s default in vLLM

__all__ = ["DEFAULT_MAX_GAMMA", "VllmSession", "engine_build", "open_session"]


def engine_build(models: Models) -> dict[str, Any]:
    """The vLLM build `models` would start: its package and torch versions (no server started)."""
    return dict(build_info(find_python(models.server, models.launcher)))


def open_session(models: Models, purpose: Purpose) -> VllmSession:
    """The session, its servers tied to this command (stopped on exit, Ctrl-C and SIGTERM)."""
    return open_tied(lambda: VllmSession(models, purpose), failures_as_one_line(ServerError))
