"""What every command sets up first: the target, its drafts, the workload encoded as a `Case`.

Also the `--draft` syntax: a model (folder, HF id, demo name or `shape:NAME`),
`prompt-lookup[:MIN-MAX]`, `layer-skip:K`, or `hybrid:prompt-lookup[:MIN-MAX]+MODEL`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..domain import DraftSpec
from ..errors import SpecDecError
from ..limits import check_context, check_count, check_temperature
from .caches.auto import resolve_auto
from .caches.modes import DEFAULT_CAPACITY, EngineMode, ExecutionContext, check_engine_mode
from .contexts import workload_as_sent
from .drafting.hybrid import hybrid_parts
from .models.devices import resolve_device
from .models.loading import (
    DEMO_DRAFTS,
    DEMO_TARGET,
    LoadedModel,
    check_vocab_compatible,
    eos_ids,
    load_model,
    slugify,
)
from .models.shapes import SHAPE_PREFIX, is_shape_ref, shape_name
from .workloads import Case, Prompt, Workload, encode_prompts, load_workload, stratified

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

LOOKUP_RE = re.compile(r"^(?:prompt-lookup|lookup|ngram)(?::(\d+)-(\d+))?$")
LAYER_SKIP_RE = re.compile(r"^layer-skip:(\d+)$")


def parse_draft(text: str) -> DraftSpec:
    """`--draft` value -> DraftSpec (the model, if any, is loaded later)."""
    text = text.strip()
    if not text:
        raise SpecDecError(
            "--draft needs a value: a model folder or id, prompt-lookup[:MIN-MAX], layer-skip:K, "
            "or hybrid:prompt-lookup+MODEL"
        )
    if text.startswith("hybrid"):
        return _parse_hybrid(text)
    m = LOOKUP_RE.match(text)
    if m:
        lo, hi = (int(m.group(1)), int(m.group(2))) if m.group(1) else (1, 3)
        if not 1 <= lo <= hi:
            raise SpecDecError(f"prompt lookup n-gram range must satisfy 1 <= MIN <= MAX, got {lo}-{hi}")
        return DraftSpec(name="prompt-lookup", kind="prompt_lookup", ngram_min=lo, ngram_max=hi)
    m = LAYER_SKIP_RE.match(text)
    if m:
        k = int(m.group(1))
        return DraftSpec(name=f"layer-skip-{k}", kind="layer_skip", layers=k)
    if text.startswith("layer-skip"):
        raise SpecDecError(f"bad draft '{text}': layer-skip needs a layer count, e.g. layer-skip:2")
    if is_shape_ref(text):  # an unknown shape fails here, before anything is loaded
        return DraftSpec(name=SHAPE_PREFIX + shape_name(text), kind="model", path=text)
    return DraftSpec(name=text if text in DEMO_DRAFTS else slugify(text), kind="model", path=text)


HYBRID_NGRAMS = (2, 3)  # a hybrid's lookup n-gram sizes unless given
# In the demo pair's default space: prompt lookup where it matches, the best model draft (draft-1l,
# benchmarks/dynamic.py) elsewhere; the hybrids were what won there, so a new user should see one.
# Its lookup wants a match of 3 or 4 tokens: in a hybrid a lookup token displaces the model's guess,
# so a weak 2-token match is worth less than it is alone; 3-4 won in dynamic.py's runs (1.98x
# against 1.96x interleaved, and 2.33x against 2.28x in interference.py's quiet comparison).
DEMO_HYBRID = "hybrid:prompt-lookup:3-4+draft-1l"
HYBRID_HELP = "use hybrid:prompt-lookup[:MIN-MAX]+MODEL, MODEL a draft model (demo name, folder, HF id or shape:NAME) or layer-skip:K"


def _parse_hybrid(text: str) -> DraftSpec:
    """`hybrid:prompt-lookup[:MIN-MAX]+MODEL`: lookup first, the model where it has nothing."""
    body = text[len("hybrid:") :] if text.startswith("hybrid:") else ""
    parts = [p.strip() for p in body.split("+")]
    if len(parts) != 2 or not all(parts):
        raise SpecDecError(f"bad hybrid draft '{text}': {HYBRID_HELP}")
    lookups = [p for p in parts if LOOKUP_RE.match(p)]
    if len(lookups) == 2:
        raise SpecDecError(
            f"bad hybrid draft '{text}': a hybrid of two prompt-lookups proposes nothing the first "
            f"does not; {HYBRID_HELP}"
        )
    if not lookups:
        raise SpecDecError(f"bad hybrid draft '{text}': one component must be prompt-lookup; {HYBRID_HELP}")
    lookup = parse_draft(lookups[0])
    if ":" not in lookups[0]:
        # A 1-gram match almost always exists and would take most steps from the model: on the
        # demo pair the hybrid's tau at gamma 4 was 2.82 with n = 1..3, 3.20 with n = 2..3.
        lookup.ngram_min, lookup.ngram_max = HYBRID_NGRAMS
    other = next(p for p in parts if p is not lookups[0])
    known_model = (
        other in DEMO_DRAFTS
        or is_shape_ref(other)
        or Path(other).expanduser().is_dir()
        or re.fullmatch(r"[\w.-]+/[\w.-]+", other)
    )
    if not (LAYER_SKIP_RE.match(other) or known_model):
        raise SpecDecError(f"bad hybrid draft '{text}': unknown component '{other}'; {HYBRID_HELP}")
    model = parse_draft(other)
    default = (lookup.ngram_min, lookup.ngram_max) == HYBRID_NGRAMS
    look = "prompt-lookup" if default else f"prompt-lookup:{lookup.ngram_min}-{lookup.ngram_max}"
    return DraftSpec(
        name=f"hybrid:{look}+{model.name}",
        kind="hybrid",
        path=model.path,
        ngram_min=lookup.ngram_min,
        ngram_max=lookup.ngram_max,
        layers=model.layers,
    )


def model_part(spec: DraftSpec) -> DraftSpec | None:
    """The spec of the draft model a drafter needs loaded (a model, or a hybrid's model part)."""
    if spec.kind == "model":
        return spec
    if spec.kind == "hybrid" and not spec.layers:
        return hybrid_parts(spec)[1]
    return None


@dataclass
class Session:
    target: LoadedModel
    drafts: dict[str, LoadedModel]  # draft models by DraftSpec name
    specs: list[DraftSpec]  # every drafter asked for, models and model-free
    workload: Workload
    case: Case | None  # None for a shape target: no tokenizer, so no prompts (profile only)
    device: str
    # How every forward of this session runs (engine mode, capacity, compile fallbacks, caches):
    # passed to whatever builds a cache or a drafter.
    ctx: ExecutionContext = field(default_factory=ExecutionContext)

    @property
    def engine_mode(self) -> str:
        """The engine mode this session runs under (eager, static or compiled; auto resolved)."""
        return self.ctx.mode

    @property
    def draft_modules(self) -> dict[str, object]:
        return {name: m.model for name, m in self.drafts.items()}

    def draft_model(self, spec: DraftSpec) -> object:
        """The draft model of a kind-"model" spec, loaded (and its vocabulary checked) on first use."""
        if spec.name not in self.drafts:
            d = load_model(spec.path or spec.name, self.device, self.target.dtype)
            check_vocab_compatible(self.target, d)
            self.drafts[spec.name] = d
        return self.drafts[spec.name].model


def load_models(
    target: str | None,
    drafts: list[str | DraftSpec] | None,
    workload: str = "demo-code",
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    device: str = "auto",
    dtype: str = "auto",
    limit: int | None = None,
    prompt: str | None = None,
    default_drafts: bool = True,
    lazy_drafts: bool = False,
    engine_mode: EngineMode = "auto",
    allow_random: bool = False,
    auto_path: str | Path | None = None,
    context_length: int | None = None,
) -> Session:
    """Load models (demo pair when `target` is None), check vocabularies, encode the workload.

    `drafts` holds `--draft` strings or ready DraftSpecs (a stored profile's). With `lazy_drafts`
    the draft models are loaded on first use (`Session.draft_model`), so one that fails to load
    fails its trials instead of the whole run. Shapes (`shape:NAME`, random weights) are refused
    unless `allow_random`; a shape target has no tokenizer, so no workload is read and `case`
    is None. `engine_mode` "auto" is resolved here (remembered in `auto_path`, default
    `auto.default_auto_path()`) and recorded in the session's context (`ctx.auto`). With
    `context_length` every prompt is fitted to about that many target tokens with real text before
    its request (runtime.contexts); `workload` stays the workload as written (its identity).
    """
    check_count(max_new_tokens, "max_new_tokens")
    check_temperature(temperature)
    check_engine_mode(engine_mode)
    dev = resolve_device(device)
    if drafts is None:
        demo = target is None and default_drafts
        drafts = [*DEMO_DRAFTS, "prompt-lookup", DEMO_HYBRID] if demo else ["prompt-lookup"]
    specs = [d if isinstance(d, DraftSpec) else parse_draft(d) for d in drafts]
    names = [s.name for s in specs]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise SpecDecError(f"draft given twice: {', '.join(sorted(dup))}")
    if not allow_random:
        _refuse_shapes(target, specs)
    if is_shape_ref(target):
        tgt = load_model(str(target), dev, dtype)
        wl = Workload(name="none (random weights)", prompts=[], source=str(target))
        case = None
    else:
        if prompt is not None:
            if not prompt.strip():
                raise SpecDecError("the prompt is empty: pass some text with --prompt")
            wl = Workload(name="prompt", prompts=[Prompt(text=prompt)], source="--prompt")
        else:
            wl = load_workload(workload)
            if limit is not None:
                wl.prompts = stratified(wl.prompts, limit)
        tgt = load_model(target or DEMO_TARGET, dev, dtype)
        budgets = [p.max_new_tokens or max_new_tokens for p in wl.prompts]
        if context_length is not None:
            check_context(context_length, max(budgets), positions_of(tgt.model), tgt.name)
        sent = workload_as_sent(wl, context_length, token_counter(tgt.tokenizer))
        ids = encode_prompts(sent, tgt.tokenizer)
        case = Case(ids, budgets, eos_ids(tgt), temperature)
    auto = resolve_auto(dev, tgt.model, auto_path) if engine_mode == "auto" else None
    # Room for the longest request and a gamma up to 16; a cache asked for more grows. A shape
    # target has no requests: the default capacity holds its default context.
    longest = DEFAULT_CAPACITY
    if case is not None:
        longest = max(len(p) + b for p, b in zip(case.prompts, case.max_new_tokens, strict=True)) + 18
    ctx = ExecutionContext(auto.choice if auto else engine_mode, longest, dev, dtype, auto=auto)
    session = Session(tgt, {}, specs, wl, case, dev, ctx)
    if not lazy_drafts:
        for spec in specs:
            part = model_part(spec)
            if part is not None:
                session.draft_model(part)
    return session


def token_counter(tokenizer: PreTrainedTokenizerBase) -> Callable[[str], int]:
    """How many tokens `tokenizer` makes of a text (no special tokens: a template writes its own)."""
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])


def positions_of(model: PreTrainedModel) -> int | None:
    """The positions the model was trained for (None when its config does not say)."""
    return getattr(getattr(model, "config", None), "max_position_embeddings", None)


def has_random_weights(spec: DraftSpec) -> bool:
    """Whether a drafter's model is a shape (random weights): its acceptance cannot be measured."""
    part = model_part(spec)
    return part is not None and is_shape_ref(part.path)


def _refuse_shapes(target: str | None, specs: list[DraftSpec]) -> None:
    shapes = ([str(target)] if is_shape_ref(target) else []) + [
        s.name for s in specs if has_random_weights(s)
    ]
    if shapes:
        raise SpecDecError(
            f"'{shapes[0]}' has random weights (a shape): only `specdec-tune profile` measures shapes, "
            "for their costs; give a trained model here"
        )
