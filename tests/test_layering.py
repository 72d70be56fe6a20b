"""The package's import graph (module-level imports of its own modules, read with `ast`) is acyclic
and layered as docs/architecture.md says ("The rules the layering test enforces"): a stage imports only itself, the stages before it
(runtime → measure → search → store → backends → serving → output → app → cli) and the shared leaves (domain,
errors, limits, serving.capabilities, ...); `store` imports no stage at all (profiles are read without
torch); no cycle, not even through imports inside functions; the package's own modules are imported
inside a function only when they load a heavy library (`DEFERRED`).

`serving` holds what is about the serving engines (HF, vLLM, llama.cpp, SGLang, TensorRT-LLM): their
capabilities, flag sets and the export. Its `capabilities` module is a shared leaf (it imports only
domain and errors), since the search space (`run --for`) and the profile schema both name the
engines; the rest of `serving` is a stage after `store`, as export reads a profile. `cli` is a package
(the typer commands and the terminal) and the last stage."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "specdec_tune"
PACKAGE = "specdec_tune"
STAGES = ["runtime", "measure", "search", "store", "backends", "serving", "output", "app", "cli"]
# Shared leaves (dotted names under the package): plain data and checks every stage may use
# (serving.capabilities: what each serving engine runs, which the search space and the profile schema
# both name; demo: the shipped models; atomic: the one atomic writer and file lock, which runtime's
# caches and the store both write through; measurement: the one type every backend's `measure`
# returns; checkpolicy: every threshold `check` decides by, which measure.noise's busy rule and
# domain's reference rule read too; measurepolicy: every threshold measuring decides by, which
# measure, search and app read; paths: the one cache folder). A
# leaf inside a stage folder imports that folder's `__init__` too, which therefore imports nothing
# of the package.
LEAVES = {"domain", "errors", "limits", "demo", "atomic", "checkpolicy", "measurepolicy", "paths",
          "measurement", "serving.capabilities"}  # fmt: skip
# Modules outside the stage folders and the stage they belong to.
LOOSE = {"__init__": None}
# Stages that import no other stage (only the shared leaves): store's profiles load without torch.
SELF_CONTAINED = {"store"}
HEAVY = {"torch", "transformers", "optuna", "matplotlib", "pandas", "numpy", "huggingface_hub", "yaml",
         "rich", "typer", "psycopg", "scipy", "safetensors", "tokenizers"}  # fmt: skip


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _resolve(current: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = current.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(current: str, is_package: bool, node: ast.AST, known: set[str]) -> list[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = _resolve(current, is_package, node)
        # `from . import x` names a submodule when there is one, else something inside `base`.
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    else:
        return []
    out = []
    for name in names:
        while name and name not in known and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in known and name != PACKAGE:
            out.append(name)
    return out


def _module_level(tree: ast.Module) -> list[ast.AST]:
    """Import statements run when the module is imported (not under `if TYPE_CHECKING`)."""
    out: list[ast.AST] = []

    def walk(body: list[ast.stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, ast.Import | ast.ImportFrom):
                out.append(stmt)
            elif isinstance(stmt, ast.If):
                if "TYPE_CHECKING" in ast.unparse(stmt.test):
                    continue
                walk(stmt.body)
                walk(stmt.orelse)
            elif isinstance(stmt, ast.Try):
                walk(stmt.body)
                for h in stmt.handlers:
                    walk(h.body)
                walk(stmt.orelse)
                walk(stmt.finalbody)

    walk(tree.body)
    return out


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        graph[name] = {t for node in _module_level(tree) for t in _targets(name, is_package, node, known)}
        graph[name].discard(name)
    return graph


def stage_of(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) < 2:
        return None
    if ".".join(parts[1:]) in LEAVES:
        return "leaf"
    if len(parts) == 2:
        return LOOSE.get(parts[1], parts[1] if parts[1] in STAGES else None)
    return parts[1] if parts[1] in STAGES else None


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return [*stack[stack.index(m) :], m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_the_graph_covers_every_module_including_the_llamacpp_backend():
    graph = import_graph()
    assert any(m.startswith("specdec_tune.measure.llamacpp") for m in graph)
    assert "specdec_tune.runtime.session" in graph and "specdec_tune.cli" in graph
    assert {stage_of(m) for m in graph} - {None} == {*STAGES, "leaf"}


def test_a_leaf_inside_a_stage_folder_stays_a_leaf():
    """Importing `serving.capabilities` runs `serving/__init__.py` first: it must import nothing of
    the package, or `search` and `store` would load the export with the engines' capabilities."""
    graph = import_graph()
    nested = [leaf for leaf in LEAVES if "." in leaf]
    assert f"{PACKAGE}.serving.capabilities" in graph and nested
    for leaf in nested:
        parent = f"{PACKAGE}.{leaf.rsplit('.', 1)[0]}"
        assert parent in graph and not graph[parent], f"{parent} imports {sorted(graph[parent])}"
        assert all(stage_of(m) == "leaf" for m in graph[f"{PACKAGE}.{leaf}"]), graph[f"{PACKAGE}.{leaf}"]


def test_the_import_graph_is_acyclic():
    assert find_cycle(import_graph()) is None, " -> ".join(find_cycle(import_graph()) or [])


def test_imports_point_down_the_stages():
    rank = {s: i for i, s in enumerate(STAGES)}
    bad = []
    for src, targets in import_graph().items():
        a = stage_of(src)
        for dst in targets:
            b = stage_of(dst)
            if a is None or b in (None, "leaf") or a == b:
                continue
            if a == "leaf" or rank[b] > rank[a] or a in SELF_CONTAINED:
                bad.append(f"{src} ({a}) imports {dst} ({b})")
    assert not bad, "\n".join(bad)


# The only own modules a function may import: each loads torch (or another heavy library) when
# imported, and `app` defers it so `--help`, `show` and reading a profile stay light. The test
# below checks that each entry still is heavy and still needed: this list may only shrink.
DEFERRED = {
    "specdec_tune.measure.bench": "torch (timing loops)",
    "specdec_tune.measure.costs": "torch (micro-benchmarks)",
    "specdec_tune.measure.forward": "torch (the machine anchors' copy and matmul)",
    "specdec_tune.measure.hfcompare": "torch, transformers (assisted generation)",
    "specdec_tune.measure.surface": "torch (batch surface)",
    "specdec_tune.runtime.batch": "torch (batched decoding)",
    "specdec_tune.runtime.session": "torch (model loading)",
}
HEAVY_LIBS = {"torch", "transformers", "optuna", "matplotlib", "pandas"}


def _function_level_own_imports() -> list[tuple[str, int, list[str]]]:
    """(module, line, the own modules it names) for each import of the package inside a function."""
    mods = modules()
    known = set(mods)
    found = []
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                targets = _targets(name, is_package, node, known)
                own = isinstance(node, ast.ImportFrom) and node.level
                if (
                    targets
                    or own
                    or (isinstance(node, ast.Import | ast.ImportFrom) and PACKAGE in ast.unparse(node))
                ):
                    found.append((name, node.lineno, targets))
    return sorted(set((m, n, tuple(t)) for m, n, t in found))  # nested functions are walked twice


def _loads_heavy(module: str, graph: dict[str, set[str]], seen: set[str] | None = None) -> bool:
    """Whether importing `module` imports a heavy library (directly or through its own imports)."""
    seen = set() if seen is None else seen
    if module in seen:
        return False
    seen.add(module)
    tree = ast.parse(modules()[module].read_text())
    for node in _module_level(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            continue
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        if any(n.split(".")[0] in HEAVY_LIBS for n in names):
            return True
    return any(_loads_heavy(m, graph, seen) for m in graph.get(module, ()))


def test_imports_of_own_modules_inside_functions_are_only_the_heavy_ones():
    bad = [
        f"{m}:{line} imports {', '.join(t) or 'the package'}"
        for m, line, t in _function_level_own_imports()
        if not t or not set(t) <= set(DEFERRED)
    ]
    assert not bad, "import these at the top of the module:\n" + "\n".join(bad)


def test_the_deferred_modules_are_heavy_and_still_deferred():
    graph = import_graph()
    used = {t for _, _, targets in _function_level_own_imports() for t in targets}
    assert set(DEFERRED) <= used, f"no longer imported inside a function: {sorted(set(DEFERRED) - used)}"
    light = [m for m in DEFERRED if not _loads_heavy(m, graph)]
    assert not light, f"these load no heavy library: import them at the top instead: {light}"


def test_no_cycle_hides_behind_an_import_inside_a_function():
    """The graph of every import (module level and inside functions) is acyclic too."""
    mods = modules()
    known = set(mods)
    graph = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        graph[name] = {t for node in ast.walk(tree) for t in _targets(name, is_package, node, known)} - {name}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


MAX_LINES = 400  # docs/architecture.md, rule 6: a module a reader can hold at once


def test_no_module_is_over_400_lines():
    long = {m: n for m, p in modules().items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these by concept: {long}"


# ------------------------------------------------------------- no engine named above the seam

ENGINE_NEUTRAL = ("app", "search", "output")  # they ask the session (backends.protocols), never a name
BACKEND_NAMES = {"native", "llamacpp", "llama", "vllm"}


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the module's, classes' and functions' docstring nodes (prose, not code)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _words(text: str) -> set[str]:
    """An identifier's or a string's words: split at non-letters and at camel-case humps."""
    return {w.lower() for w in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])", text)}


def engine_names_in(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, what) of every backend name used as an identifier or inside a string (docstrings and
    comments aside), and of every `import torch`."""
    docs, found = _docstrings(tree), []
    for node in ast.walk(tree):
        texts: list[str] = []
        if isinstance(node, ast.Import):
            texts = [a.asname or a.name for a in node.names]
            if any(a.name.split(".")[0] == "torch" for a in node.names):
                found.append((node.lineno, "import torch"))
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[0] == "torch" and not node.level:
                found.append((node.lineno, "import torch"))
            texts = [node.module or "", *(a.asname or a.name for a in node.names)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            texts = [node.value]
        elif isinstance(node, ast.Name):
            texts = [node.id]
        elif isinstance(node, ast.Attribute):
            texts = [node.attr]
        elif isinstance(node, ast.arg) or (isinstance(node, ast.keyword) and node.arg):
            texts = [node.arg]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            texts = [node.name]
        hits = sorted(BACKEND_NAMES & set().union(*map(_words, texts))) if texts else []
        found += [(getattr(node, "lineno", 0), f"'{h}'") for h in hits]
    return sorted(set(found))


def test_no_backend_name_and_no_torch_above_the_seam():
    """`app`, `search` and `output` ask the measuring session what differs between engines (its
    policy, how it confirms, what it screens) and never branch on, build or name a backend."""
    bad = [
        f"{name}:{line} {what}"
        for name, path in modules().items()
        if stage_of(name) in ENGINE_NEUTRAL
        for line, what in engine_names_in(ast.parse(path.read_text(), str(path)))
    ]
    assert not bad, "ask the session (backends.protocols) instead:\n" + "\n".join(bad)


def test_the_engine_name_check_catches_names_and_torch():
    """The rule above can fail: a name in code or a string, or torch, is found; prose is not."""
    code = '"""native and llama.cpp in a docstring."""\nimport torch\nif backend == "llamacpp":\n    x = NativeBackend()\n# vllm\n'
    found = {what for _, what in engine_names_in(ast.parse(code))}
    assert found == {"import torch", "'llamacpp'", "'native'"}
