"""Build the `code-edit` workload: copy-heavy code-editing requests over small functions of the
Python standard library (add type hints, fix a planted typo, rename a variable, add a docstring,
turn an append loop into a comprehension). Offline and deterministic: a fixed module list, a seed.

    python scripts/make_code_edit_workload.py [--out specdec_tune/data/workloads/code-edit.jsonl]

Every request asks for the whole edited function, so most of the answer copies the prompt. The
functions come from this interpreter's standard library; the shipped file was made with PYTHON.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import itertools
import json
import platform
import random
import re
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

PYTHON = "3.11.7"
SEED = 0
PER_CATEGORY = 10
OUT = Path(__file__).resolve().parent.parent / "specdec_tune" / "data" / "workloads" / "code-edit.jsonl"
MODULES = (
    "textwrap", "shlex", "fnmatch", "posixpath", "ntpath", "genericpath", "glob", "string", "calendar",
    "colorsys", "bisect", "heapq", "difflib", "csv", "html", "ipaddress", "statistics", "tokenize",
    "gettext", "netrc", "quopri", "base64", "cmd", "pprint", "mimetypes", "urllib.parse", "email.utils",
    "copy", "random", "fractions", "shutil", "tarfile", "zipfile", "inspect", "dis", "pydoc", "platform",
    "sysconfig", "configparser", "argparse", "optparse", "locale", "_pydecimal", "ftplib", "smtplib",
    "imaplib", "mailbox", "plistlib", "pathlib", "tempfile", "traceback", "linecache", "keyword",
    "functools", "operator", "warnings", "contextlib", "enum", "dataclasses", "typing",
)  # fmt: skip
MIN_LINES, MAX_LINES, MIN_CHARS, MAX_CHARS = 5, 28, 300, 1400
NEW_NAMES = ("item", "value", "entry", "current", "chunk", "piece", "buf", "acc", "tmp", "elem")
REPLY = "Reply with the whole edited function in one ```python code block and nothing else."


def _segment(lines: list[str], node: ast.FunctionDef) -> str:
    """ast.get_source_segment(padded=True), which re-splits the whole file on every call."""
    first, last = node.lineno - 1, node.end_lineno - 1  # type: ignore[operator]
    head = " " * node.col_offset + lines[first].encode()[node.col_offset :].decode()
    if first == last:
        return head.encode()[: node.end_col_offset].decode()
    tail = lines[last].encode()[: node.end_col_offset].decode()
    return head + "".join(lines[first + 1 : last]) + tail


def _functions(module: str) -> list[tuple[str, str, ast.FunctionDef, str]]:
    """(module, qualified name, node, source) for each small function or method of a stdlib module, in file order."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return []
    return functions_in(module, Path(spec.origin).read_text(encoding="utf-8"))


def functions_in(module: str, source: str) -> list[tuple[str, str, ast.FunctionDef, str]]:
    """`_functions` for a module's source text (also used by make_long_context_workloads.py)."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    found = [(n.name, n) for n in tree.body if isinstance(n, ast.FunctionDef)]
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        found += [(f"{cls.name}.{n.name}", n) for n in cls.body if isinstance(n, ast.FunctionDef)]
    out = []
    for name, node in found:
        if not isinstance(node, ast.FunctionDef) or node.decorator_list:
            continue
        text = _segment(lines, node)
        if not MIN_LINES <= text.count("\n") + 1 <= MAX_LINES or not MIN_CHARS <= len(text) <= MAX_CHARS:
            continue
        if any(
            isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            for n in list(ast.walk(node))[1:]
        ):
            continue  # keep one scope: renames and typos stay unambiguous
        code = textwrap.dedent(text)
        try:
            ast.parse(code)
        except SyntaxError:
            continue  # a method whose strings are indented less than its body: dedent cannot fix it
        out.append((module, name, node, code))
    return out


def _names(node: ast.FunctionDef) -> list[str]:
    """Local names: parameters and assignment targets, first occurrence order."""
    seen: list[str] = [a.arg for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]]
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id not in seen:
            seen.append(n.id)
    return [s for s in seen if s not in ("self", "cls") and len(s) >= 3]


def _uses(text: str, name: str) -> list[re.Match[str]]:
    return list(re.finditer(rf"(?<![\w.'\"]){re.escape(name)}(?![\w'\"])", text))


def _docstring_span(node: ast.FunctionDef) -> tuple[int, int] | None:
    first = node.body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return first.lineno - node.lineno, first.end_lineno - node.lineno  # type: ignore[operator]
    return None


def _message(module: str, ask: str, code: str) -> str:
    return f"{ask} The function is from Python's `{module}` module. {REPLY}\n\n```python\n{code}\n```"


def type_hints(module: str, node: ast.FunctionDef, code: str, rng: random.Random) -> str | None:
    args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
    if node.returns is not None or any(a.annotation is not None for a in args) or not args:
        return None
    return _message(
        module, "Add type hints to every parameter and to the return value of this function.", code
    )


def fix_typo(module: str, node: ast.FunctionDef, code: str, rng: random.Random) -> str | None:
    bound = _names(node)
    loads = [n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
    names = [b for b in bound if sum(n.id == b for n in loads) >= 2]
    if not names:
        return None
    name = rng.choice(names)
    use = rng.choice([n for n in loads if n.id == name])  # a read, so the misspelling is a NameError
    i = rng.randrange(1, len(name) - 1)
    typo = name[:i] + name[i + 1] + name[i] + name[i + 2 :]
    if typo == name or _uses(code, typo):
        return None
    lines = code.splitlines(keepends=True)
    line = lines[use.lineno - 1].encode()
    lines[use.lineno - 1] = (line[: use.col_offset] + typo.encode() + line[use.end_col_offset :]).decode()
    ask = "This function has a typo: one name is misspelled, so it would raise NameError. Fix it."
    return _message(module, ask, "".join(lines))


def rename(module: str, node: ast.FunctionDef, code: str, rng: random.Random) -> str | None:
    args = node.args
    params = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg] if a}
    names = [n for n in _names(node) if n not in params and len(_uses(code, n)) >= 2]
    free = [n for n in NEW_NAMES if not _uses(code, n)]
    if not names or not free:
        return None
    old, new = rng.choice(names), rng.choice(free)
    return _message(
        module, f"Rename the local variable `{old}` to `{new}` everywhere in this function.", code
    )


def docstring(module: str, node: ast.FunctionDef, code: str, rng: random.Random) -> str | None:
    span = _docstring_span(node)
    if span is None:
        return None  # a function with its docstring removed reads naturally; one without may be odd
    lines = code.splitlines()
    stripped = "\n".join(lines[: span[0]] + lines[span[1] + 1 :])
    if len(stripped.splitlines()) < 3 or len(stripped) < MIN_CHARS:
        return None
    ask = "Add a docstring to this function that says what it does, its arguments and what it returns."
    return _message(module, ask, stripped)


def _is_append(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and isinstance(stmt.value.func, ast.Attribute)
        and stmt.value.func.attr == "append"
    )


def _append_loop(node: ast.FunctionDef) -> bool:
    """`x = []` directly followed by `for ...: x.append(...)` (maybe under one `if`), nothing else."""
    for body in (n.body for n in ast.walk(node) if isinstance(getattr(n, "body", None), list)):
        for a, b in itertools.pairwise(body):
            if not (isinstance(a, ast.Assign) and isinstance(a.value, ast.List) and not a.value.elts):
                continue
            if not isinstance(b, ast.For) or b.orelse or len(b.body) != 1:
                continue
            inner = b.body[0]
            if isinstance(inner, ast.If) and not inner.orelse and len(inner.body) == 1:
                inner = inner.body[0]
            if _is_append(inner):
                return True
    return False


def comprehension(module: str, node: ast.FunctionDef, code: str, rng: random.Random) -> str | None:
    if not _append_loop(node):
        return None
    ask = "Rewrite the loop that builds a list with append in this function as a list comprehension."
    return _message(module, ask, code)


EDITS: dict[str, Callable[[str, ast.FunctionDef, str, random.Random], str | None]] = {
    "type-hints": type_hints,
    "fix-typo": fix_typo,
    "rename": rename,
    "docstring": docstring,
    "comprehension": comprehension,
}


def build(seed: int = SEED, per_category: int = PER_CATEGORY) -> list[dict]:
    """The workload records: per_category requests per edit, each on a different function."""
    rng = random.Random(seed)
    functions = [f for m in MODULES for f in _functions(m)]
    rng.shuffle(functions)
    used: set[str] = set()
    records = []
    for category, edit in EDITS.items():
        made = 0
        for module, name, node, code in functions:
            key = f"{module}:{name}"
            if made == per_category or key in used:
                continue
            content = edit(module, node, code, rng)
            if content is None:
                continue
            used.add(key)
            made += 1
            records.append(
                {"messages": [{"role": "user", "content": content}], "category": category, "source": key}
            )
    return records


def to_jsonl(records: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if platform.python_version() != PYTHON:
        print(f"note: the shipped file was made with Python {PYTHON}; this is {platform.python_version()}")
    records = build()
    args.out.write_text(to_jsonl(records), encoding="utf-8")
    counts = {c: sum(r["category"] == c for r in records) for c in EDITS}
    print(f"wrote {len(records)} prompts to {args.out}: {counts}", file=sys.stderr)


if __name__ == "__main__":
    main()
