"""Build `benchmarks/workloads/held-out.jsonl`: a workload none of the built-in ones is made from,
for checking a tuned answer on text the tool was never shaped on (issue 35's third workload).

    python scripts/make_held_out_workload.py [--out benchmarks/workloads/held-out.jsonl]

Three kinds of request over standard-library modules that neither `code-edit` nor the long-context
workloads use: rewrite a function's docstring in Google style and return the function (mostly
copied), summarise what a function does (little copied), and explain a module's docstring to a
beginner (prose). Offline and deterministic: a fixed module list, the functions in file order.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "benchmarks" / "workloads" / "held-out.jsonl"
MODULES = ("json.decoder", "json.encoder", "sched", "queue", "selectors", "secrets", "graphlib",
           "timeit", "filecmp", "fileinput", "reprlib", "numbers", "gzip", "codeop", "runpy")  # fmt: skip
PER_KIND = 4
MIN_LINES, MAX_LINES = 6, 26


def _source(module: str) -> str:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return ""
    return Path(spec.origin).read_text(encoding="utf-8")


def _functions(module: str) -> list[str]:
    """Small documented functions of `module`, in file order, dedented."""
    text = _source(module)
    if not text:
        return []
    lines = text.splitlines(keepends=True)
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef) and ast.get_docstring(node):
            n = node.end_lineno - node.lineno + 1  # type: ignore[operator]
            if MIN_LINES <= n <= MAX_LINES:
                body = lines[node.lineno - 1 : node.end_lineno]
                pad = len(body[0]) - len(body[0].lstrip())
                out.append("".join(line[pad:] if line[:pad].isspace() else line for line in body).rstrip())
    return out


def _message(content: str, kind: str, module: str) -> dict:
    return {"messages": [{"role": "user", "content": content}], "category": kind, "source": module}


def build() -> list[dict]:
    google, summary, explain = [], [], []
    for module in MODULES:
        fns = _functions(module)
        if fns and len(google) < PER_KIND:
            google.append(_message(
                "Rewrite the docstring of this Python function in Google style (Args:, Returns:) and leave "
                "the code unchanged. Reply with the whole function in one ```python code block and nothing "
                f"else.\n\n```python\n{fns[0]}\n```", "docstring-style", module))  # fmt: skip
        if len(fns) > 1 and len(summary) < PER_KIND:
            summary.append(_message(
                f"In three sentences, say what this function from Python's `{module}` module does and when "
                f"it is called.\n\n```python\n{fns[-1]}\n```", "summary", module))  # fmt: skip
        doc = ast.get_docstring(ast.parse(_source(module))) if _source(module) else None
        if doc and len(doc) >= 300 and len(explain) < PER_KIND:
            explain.append(_message(
                f"Explain this module documentation to a beginner in plain English, in one short "
                f"paragraph:\n\n{doc[:900]}", "explain", module))  # fmt: skip
    return [r for trio in zip(google, summary, explain, strict=False) for r in trio]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    records = build()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    print(f"wrote {len(records)} requests to {args.out}")


if __name__ == "__main__":
    main()
