"""The `code-edit` workload: shipped, chat-shaped, copy-heavy, and exactly what its script makes."""

from __future__ import annotations

import ast
import importlib.util
import platform
import re
from pathlib import Path

import pytest

from specdec_tune.runtime.workloads import builtin_workloads, load_workload, stratified

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make_code_edit_workload.py"
CATEGORIES = {"type-hints", "fix-typo", "rename", "docstring", "comprehension"}
CODE = re.compile(r"```python\n(.*)\n```\Z", re.S)


def _script():
    spec = importlib.util.spec_from_file_location("make_code_edit_workload", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_code_edit_is_a_builtin_chat_workload():
    assert "code-edit" in builtin_workloads()
    wl = load_workload("code-edit")
    assert wl.source == "builtin:code-edit" and len(wl.prompts) >= 40
    assert {p.category for p in wl.prompts} == CATEGORIES
    assert all(sum(p.category == c for p in wl.prompts) >= 5 for c in CATEGORIES)
    for p in wl.prompts:
        assert p.messages is not None and [m["role"] for m in p.messages] == ["user"]
    assert {p.category for p in stratified(wl.prompts, 5)} == CATEGORIES


def test_code_edit_prompts_hold_a_parsable_function_to_copy():
    for p in load_workload("code-edit").prompts:
        content = p.messages[0]["content"]
        assert "whole edited function" in content
        code = CODE.search(content).group(1)
        tree = ast.parse(code)  # a planted typo misspells a name; the code still parses
        assert isinstance(tree.body[0], ast.FunctionDef)
        assert len(code) > len(content) / 2  # most of the prompt is the code to copy back


def test_code_edit_typos_are_undefined_names():
    """Each fix-typo function uses one name that is neither a builtin nor bound anywhere in it."""
    import builtins

    for p in load_workload("code-edit").prompts:
        if p.category != "fix-typo":
            continue
        tree = ast.parse(CODE.search(p.messages[0]["content"]).group(1))
        fn = tree.body[0]
        bound = {a.arg for a in ast.walk(fn) if isinstance(a, ast.arg)}
        bound |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        loads = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        # The misspelling swaps two letters of a bound name.
        typos = [n for n in loads - bound - set(dir(builtins)) if any(sorted(n) == sorted(b) for b in bound)]
        assert len(typos) == 1, (p.messages[0]["content"], typos)


@pytest.mark.slow  # rebuilds the workload from the standard library
@pytest.mark.skipif(
    platform.python_version() != _script().PYTHON,
    reason="the shipped file is made from another Python's standard library sources",
)
def test_code_edit_file_is_what_the_script_makes():
    script = _script()
    shipped = (
        Path(__file__).resolve().parents[2] / "specdec_tune/data/workloads/code-edit.jsonl"
    ).read_text()
    assert script.to_jsonl(script.build()) == shipped
