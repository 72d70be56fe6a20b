"""The seam between the use cases (`app`) and the engines that measure: a backend opens a
**measuring session** over (target, drafts, workload, threads or device), and `tune`, `bench`,
`profile` and `check` call only the session (its Protocols by concern: backends.protocols). A third
backend (vLLM, SGLang on a GPU box) is one new module or package (`BackendModule`), registered by
name in `BACKENDS`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..domain import Costs, DecodeAnchorSpec
from ..errors import SpecDecError
from .protocols import CheckSession, MeasuringSession, Progress

__all__ = ["BACKENDS", "BackendModule", "CheckSession", "MeasuringSession", "Models", "Progress", "Purpose"]

if TYPE_CHECKING:  # a name for annotations only: the modes module loads torch
    from ..runtime.caches.modes import EngineMode


@dataclass
class Models:
    """What a measuring use case loads: target, drafts, workload and decoding settings.

    `drafts` are `--draft` strings (a model folder, HF id or demo name, `prompt-lookup[:MIN-MAX]`,
    `layer-skip:K`; an engine's own kinds for an engine backend); None means the backend's default
    drafts. `prompts` takes that many prompts round-robin over the workload's categories.
    """

    target: str | None = None
    drafts: list[Any] | None = None
    workload: str = "demo-code"
    prompt: str | None = None
    prompts: int | None = None
    max_new_tokens: int = 64
    temperature: float = 0.0
    device: str = "auto"
    dtype: str = "auto"
    engine_mode: EngineMode = "auto"  # `--engine`: auto, eager, static or compiled (runtime.caches.modes)
    backend: str = "native"  # where configs are measured: a name in BACKENDS
    server: str | None = None  # an engine backend's server binary (`--llama-server`; default: its extra's)
    # The launcher a profile recorded (`backend.launcher`, e.g. vLLM's Python): what `check` re-opens
    # with when neither `server` nor the engine's environment variable names one.
    launcher: list[str] | None = None
    threads: int | None = None  # engine threads (default: the engine's own, every core)
    # `run --context-lengths`: each prompt fitted to about this many target tokens with real text
    # before its request (runtime.contexts); None: the workload's prompts as written.
    context_length: int | None = None

    def open(self, lazy_drafts: bool = True, allow_random: bool = False) -> Any:
        """Load the models and the workload in this process (runtime.session); shapes (random
        weights) only with `allow_random`."""
        from ..runtime.session import load_models

        return load_models(
            self.target,
            self.drafts,
            self.workload,
            self.max_new_tokens,
            self.temperature,
            self.device,
            self.dtype,
            self.prompts,
            self.prompt,
            lazy_drafts=lazy_drafts,
            engine_mode=self.engine_mode,
            allow_random=allow_random,
            context_length=self.context_length,
        )


@dataclass
class Purpose:
    """What a session is opened for: `tune` (a search), `bench` (one config), `costs` (`profile`),
    `check` (a stored profile's configs, re-measured as they were)."""

    name: str = "tune"
    layer_skip: tuple[int, ...] = ()  # tune: extra layer-skip drafts
    batch_size: int = 1  # the first batch size it measures at
    allow_random: bool = False  # costs: shapes (random weights) allowed
    # check: the stored costs a config's gamma policy reads (None: none stored)
    costs: Costs | None = None
    # check: the profile's decode anchor (domain's spec), timed between the passes at batch size 1
    # where the engine can (our engine: `Measurement.plain_per_anchor`); None: none
    decode_anchor: DecodeAnchorSpec | None = None


class BackendModule(Protocol):
    """What a name in `BACKENDS` imports (or `register` takes): the backend's entry points, and
    what the CLI asks before a session is open."""

    DEFAULT_MAX_GAMMA: int  # `run --max-gamma`'s default: the largest γ worth searching there

    def open_session(self, models: Models, purpose: Purpose) -> MeasuringSession: ...

    def engine_build(self, models: Models) -> dict[str, Any]: ...


# name -> the module that opens its session (`open(models, purpose)`); imported on use, so the CLI's
# --help never loads an engine.
BACKENDS: dict[str, str] = {
    "native": "specdec_tune.backends.native",
    "llamacpp": "specdec_tune.backends.llamacpp",
    "vllm": "specdec_tune.backends.vllm",
}
_REGISTERED: dict[str, Any] = {}


def register(name: str, module: BackendModule) -> None:
    """Add a backend (a test's scripted engine, a plugin)."""
    _REGISTERED[name] = module


def known_backends() -> list[str]:
    """The backends' names: the built-in ones, then any registered."""
    return [*BACKENDS, *(n for n in _REGISTERED if n not in BACKENDS)]


def _module(name: str) -> BackendModule:
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name not in BACKENDS:
        known = ", ".join(known_backends())
        raise SpecDecError(f"unknown backend '{name}': choose one of {known}")
    return importlib.import_module(BACKENDS[name])  # type: ignore[return-value]


def open_session(models: Models, purpose: Purpose | None = None) -> MeasuringSession:
    """The session of `models.backend`, opened for `purpose`."""
    return _module(models.backend).open_session(models, purpose or Purpose())


def default_max_gamma(name: str) -> int:
    """`run --max-gamma`'s default in backend `name` (its module's `DEFAULT_MAX_GAMMA`)."""
    return _module(name).DEFAULT_MAX_GAMMA


def engine_build(models: Models) -> dict[str, Any]:
    """The build of the engine `models.backend` would start (package, binary hash), without starting
    it: `check` refuses another build before measuring anything ({} for an in-process engine)."""
    return _module(models.backend).engine_build(models)
