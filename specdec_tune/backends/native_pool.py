"""Our engine's drafters, built on first use per (draft, batch size) and wrapped in each config's
gamma policy: what `measure.backends.NativeBackend` measures with (backends.native)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..domain import Config, Costs, DraftSpec
from ..runtime.caches.modes import ExecutionContext
from ..runtime.drafting.build import build_drafter
from ..runtime.session import model_part
from ..search.policymodel import policy_drafter

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from ..runtime.drafting.drafters import Drafter
    from ..runtime.drafting.rows import BatchDrafter


class DrafterPool:
    """Builds drafters on first use; a drafter that fails to build fails its trials, not the run."""

    def __init__(
        self,
        specs: list[DraftSpec],
        target: PreTrainedModel,
        load: Callable[[DraftSpec], Any] | None = None,
        ctx: ExecutionContext | None = None,
    ):
        self.specs = {s.name: s for s in specs}
        self.target = target
        self.load = load  # DraftSpec -> draft model module, for kind "model"
        self.ctx = ctx or ExecutionContext()  # every drafter and the target's caches run under it
        self._built: dict[tuple[str, int | None], Any] = {}
        self.costs: Costs | None = None  # the measured costs, for the costmodel gamma policy

    def get(self, name: str, batch_size: int | None = None) -> Any:
        """The drafter `name`: for the batch-1 engine, or batched for `batch_size` rows."""
        key = (name, batch_size)
        if key not in self._built:
            try:
                spec = self.specs[name]
                part = model_part(spec)
                models = {part.name: self.load(part)} if part is not None and self.load else {}
                self._built[key] = build_drafter(spec, self.target, models, self.ctx, rows=batch_size)
            except Exception as exc:  # recorded, and re-raised for every trial of this draft
                self._built[key] = exc
        built = self._built[key]
        if isinstance(built, BaseException):
            raise built
        return built

    def for_config(self, config: Config, batch_size: int | None = None) -> Drafter | BatchDrafter:
        """The drafter of `config`, wrapped in its gamma policy when that is not fixed."""
        return policy_drafter(self.get(config.draft.name, batch_size), config, self.costs, batch_size)

    @staticmethod
    def free_device_memory() -> None:
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except Exception:
            pass
