"""Workloads: the prompts a config is measured on, read from JSONL (built-in or a user file), and
`Case`, the same prompts encoded with their token budgets: what one measured pass generates.

One object per line: `prompt` (text) or `messages` (a chat list), optional `category`,
`max_new_tokens`, and `context` or `context_file` (text that comes before the request; see
runtime.contexts, which places it). Chat prompts go through the tokenizer's chat template when it has one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import SpecDecError

if TYPE_CHECKING:
    from importlib.abc import Traversable

    from transformers import PreTrainedTokenizerBase

_BUILTIN_PACKAGE = "specdec_tune"
_BUILTIN_DIR = "data/workloads"
_CONTEXTS_DIR = "data/contexts"


@dataclass
class Prompt:
    """One request. For a chat prompt, `text` is the template-free rendering of `messages`.

    `context` is real text that comes before the request (a module's source before an edit, a
    document before a question). It is not part of `text` or `messages` until
    `runtime.contexts.fit_prompt` (or `inline_context`) places it there.
    """

    text: str
    category: str | None = None
    max_new_tokens: int | None = None
    messages: list[dict[str, str]] | None = None
    context: str | None = None


def _canonical(prompt: Prompt) -> dict[str, Any]:
    # A prompt without context hashes as it did before the field existed: existing profiles'
    # workload hashes stay valid.
    data = asdict(prompt)
    if data["context"] is None:
        del data["context"]
    return data


@dataclass
class Workload:
    """A named list of prompts and where they came from ("builtin:<name>" or a file path)."""

    name: str
    prompts: list[Prompt]
    source: str

    @property
    def sha256(self) -> str:
        """First 16 hex chars of the SHA-256 of the prompts' canonical JSON: the workload's identity."""
        canonical = json.dumps(
            [_canonical(p) for p in self.prompts], sort_keys=True, separators=(",", ":"), ensure_ascii=False
        )
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def _builtin_root() -> Any:
    return resources.files(_BUILTIN_PACKAGE).joinpath(*_BUILTIN_DIR.split("/"))


def contexts_root() -> Traversable:
    """The shipped context texts (data/contexts): what built-ins' `context_file` names."""
    return resources.files(_BUILTIN_PACKAGE).joinpath(*_CONTEXTS_DIR.split("/"))


# (context_file, where) -> its text
_ContextReader = Callable[[str, str], str]


def _context_reader(root: Path | Traversable, builtin: bool) -> _ContextReader:
    """Reads `context_file`s under `root` (a folder or the package's contexts), each file once."""
    cache: dict[str, str] = {}

    def read(name: str, where: str) -> str:
        if builtin and (Path(name).name != name or name.startswith(".")):
            raise SpecDecError(
                f"{where}: `context_file` {name!r} must be a bare file name in the package's data/contexts"
            )
        if name not in cache:
            entry = root.joinpath(name)
            if not entry.is_file():
                raise SpecDecError(
                    f"{where}: `context_file` {name!r} not found (looked for {entry}); give a path "
                    "relative to the workload file, or put the text in `context`"
                )
            try:
                cache[name] = entry.read_text(encoding="utf-8")
            except UnicodeDecodeError as exc:
                raise SpecDecError(
                    f"{where}: `context_file` {name!r} is not UTF-8 text ({exc.reason}); save it as UTF-8"
                ) from exc
            except OSError as exc:
                raise SpecDecError(f"{where}: cannot read `context_file` {name!r} ({exc.strerror})") from exc
        return cache[name]

    return read


def _parse_context(obj: dict[str, Any], where: str, read_context: _ContextReader | None) -> str | None:
    context, context_file = obj.get("context"), obj.get("context_file")
    if context is not None and context_file is not None:
        raise SpecDecError(f"{where}: give either `context` or `context_file`, not both")
    if context_file is not None:
        if not isinstance(context_file, str) or not context_file.strip():
            raise SpecDecError(
                f"{where}: `context_file` must be a non-empty string (a file name), got {context_file!r}"
            )
        if read_context is None:
            raise SpecDecError(f"{where}: `context_file` needs a workload file to be relative to")
        context = read_context(context_file, where)
        if not context.strip():
            raise SpecDecError(f"{where}: `context_file` {context_file!r} is empty; give it text")
        return context
    if context is not None and not isinstance(context, str):
        raise SpecDecError(f"{where}: `context` must be a string, got {type(context).__name__}")
    if context is not None and not context.strip():
        raise SpecDecError(f"{where}: `context` is empty; give the text or leave the field out")
    return context


def builtin_workloads() -> list[str]:
    """Names of the workloads shipped with the package, sorted."""
    return sorted(
        entry.name.removesuffix(".jsonl")
        for entry in _builtin_root().iterdir()
        if entry.name.endswith(".jsonl")
    )


def _join_messages(messages: list[dict[str, str]]) -> str:
    # The fallback for tokenizers without a chat template: a plain transcript the model continues.
    lines = [f"{m['role']}: {m['content']}" for m in messages]
    return "\n".join([*lines, "assistant:"])


def _parse_messages(value: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise SpecDecError(f"{where}: `messages` must be a non-empty list of {{role, content}} objects")
    messages = []
    for i, m in enumerate(value, start=1):
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("role"), str)
            or not m["role"].strip()
            or not isinstance(m.get("content"), str)
        ):
            raise SpecDecError(
                f"{where}: message {i} must be an object with a non-empty string `role` "
                "and a string `content`"
            )
        messages.append({"role": m["role"], "content": m["content"]})
    return messages


def _parse_line(obj: Any, where: str, read_context: _ContextReader | None = None) -> Prompt:
    if not isinstance(obj, dict):
        raise SpecDecError(
            f'{where}: expected a JSON object like {{"prompt": "..."}}, got {type(obj).__name__}'
        )
    has_prompt = obj.get("prompt") is not None
    has_messages = obj.get("messages") is not None
    if has_prompt and has_messages:
        raise SpecDecError(f"{where}: give either `prompt` or `messages`, not both")
    if has_messages:
        messages = _parse_messages(obj["messages"], where)
        text = _join_messages(messages)
    else:
        text = obj.get("prompt")
        if not isinstance(text, str) or not text.strip():
            raise SpecDecError(f"{where}: missing or empty `prompt` (a non-empty string), and no `messages`")
        messages = None

    max_new_tokens = obj.get("max_new_tokens")
    # bool is an int subclass; `true` is not a token count.
    if max_new_tokens is not None and (
        isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1
    ):
        raise SpecDecError(f"{where}: `max_new_tokens` must be an integer >= 1, got {max_new_tokens!r}")
    category = obj.get("category")
    if category is not None and not isinstance(category, str):
        raise SpecDecError(f"{where}: `category` must be a string, got {category!r}")
    if category is not None and not category.strip():
        raise SpecDecError(f"{where}: `category` is empty; name the category or leave the field out")
    context = _parse_context(obj, where, read_context)
    return Prompt(
        text=text, category=category, max_new_tokens=max_new_tokens, messages=messages, context=context
    )


def _parse_jsonl(content: str, label: str, read_context: _ContextReader | None = None) -> list[Prompt]:
    prompts = []
    for lineno, line in enumerate(content.splitlines(), start=1):
        if not line.strip():
            continue  # blank lines (e.g. a trailing newline) are not prompts
        where = f"{label}, line {lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SpecDecError(
                f"{where}: not valid JSON ({exc.msg}); write one JSON object per line"
            ) from exc
        prompts.append(_parse_line(obj, where, read_context))
    if not prompts:
        raise SpecDecError(f'{label}: no prompts found; add lines like {{"prompt": "..."}}')
    return prompts


def load_workload(name_or_path: str) -> Workload:
    """Load a built-in workload by name (see `builtin_workloads()`) or a JSONL file by path."""
    builtins = builtin_workloads()
    if name_or_path in builtins:
        name, source = name_or_path, f"builtin:{name_or_path}"
        content = _builtin_root().joinpath(f"{name_or_path}.jsonl").read_text(encoding="utf-8")
        label = f"built-in workload {name_or_path!r}"
        read_context = _context_reader(contexts_root(), builtin=True)
    else:
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            raise SpecDecError(
                f"unknown workload {name_or_path!r}: not a built-in ({', '.join(builtins)}) "
                "and no such file; pass a built-in name or the path of a JSONL file"
            )
        name, source, label = path.stem, str(path), str(path)
        read_context = _context_reader(path.parent, builtin=False)
        try:
            content = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise SpecDecError(f"{label}: not UTF-8 text ({exc.reason}); save the workload as UTF-8") from exc
        except OSError as exc:
            raise SpecDecError(f"{label}: cannot read the workload ({exc.strerror})") from exc
    prompts = _parse_jsonl(content, label, read_context)
    return Workload(name=name, prompts=prompts, source=source)


def prompt_text(prompt: Prompt, tokenizer: PreTrainedTokenizerBase) -> str:
    """The text the model sees: the chat template applied to `messages` when the tokenizer has one."""
    if prompt.messages is None:
        return prompt.text
    if not getattr(tokenizer, "chat_template", None):
        return _join_messages(prompt.messages)
    try:
        return tokenizer.apply_chat_template(prompt.messages, add_generation_prompt=True, tokenize=False)
    except Exception as exc:
        # Templates raise on content they reject (e.g. roles that don't alternate): that is the
        # workload's fault, so say so instead of showing a Jinja traceback.
        raise SpecDecError(
            f"the tokenizer's chat template rejected a prompt ({exc}); fix its `messages` in the workload"
        ) from exc


def encode_prompts(workload: Workload, tokenizer: PreTrainedTokenizerBase) -> list[list[int]]:
    """Token ids per prompt. No special tokens are added: a chat template already writes its own."""
    encoded = []
    for i, prompt in enumerate(workload.prompts, start=1):
        ids = list(tokenizer(prompt_text(prompt, tokenizer), add_special_tokens=False)["input_ids"])
        if not ids:
            raise SpecDecError(
                f"workload {workload.name!r}, prompt {i}: encodes to no tokens with this tokenizer; "
                "remove it or give it text the tokenizer knows"
            )
        encoded.append(ids)
    return encoded


def stratified(prompts: list[Prompt], n: int) -> list[Prompt]:
    """n prompts taken round-robin over categories, so a subset covers every category."""
    if n < 1:
        raise SpecDecError(f"--prompts must be >= 1, got {n}")
    groups: dict[str | None, list[Prompt]] = {}
    for p in prompts:
        groups.setdefault(p.category, []).append(p)
    picked: list[Prompt] = []
    queues = [list(q) for q in groups.values()]
    while len(picked) < min(n, len(prompts)):
        for q in queues:
            if q and len(picked) < n:
                picked.append(q.pop(0))
    return picked


@dataclass
class Case:
    """Encoded prompts with their token budgets: what one pass generates."""

    prompts: list[list[int]]
    max_new_tokens: list[int]
    eos: list[int] = field(default_factory=list)
    temperature: float = 0.0

    def __post_init__(self) -> None:
        if not self.prompts:
            raise SpecDecError("the workload has no prompts")
        if len(self.max_new_tokens) != len(self.prompts):
            raise ValueError("one max_new_tokens per prompt")

    def head(self, n: int, max_new_tokens: int | None = None) -> Case:
        """The first n prompts, each budget capped at `max_new_tokens` when given."""
        budgets = self.max_new_tokens[:n]
        if max_new_tokens is not None:
            budgets = [min(b, max_new_tokens) for b in budgets]
        return Case(self.prompts[:n], budgets, self.eos, self.temperature)

    def pick(self, indices: list[int], max_new_tokens: int | None = None) -> Case:
        """The prompts at `indices`, in that order; their budgets at most `max_new_tokens`."""
        cap = max_new_tokens or max(self.max_new_tokens, default=0)
        return Case(
            [self.prompts[i] for i in indices],
            [min(self.max_new_tokens[i], cap) for i in indices],
            self.eos,
            self.temperature,
        )
