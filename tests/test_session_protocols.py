"""Every session class implements the Protocols it is used as (backends.protocols): each method and
each declared value (a class attribute, or set in `__init__`), so no use case has to probe one."""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Protocol

import fake_backend
import pytest

from specdec_tune.backends import protocols
from specdec_tune.backends.llamacpp import LlamaCppSession
from specdec_tune.backends.native import NativeSession


def members(proto: type) -> set[str]:
    """The names a Protocol and the Protocols it extends declare: methods and annotated values."""
    out: set[str] = set()
    for cls in proto.__mro__:
        if cls in (Protocol, object) or not getattr(cls, "_is_protocol", False):
            continue
        out |= set(getattr(cls, "__annotations__", {}))
        out |= {
            n
            for n, v in vars(cls).items()
            if callable(v) and (not n.startswith("_") or n in ("__enter__", "__exit__"))
        }
    return out


def provided(cls: type) -> set[str]:
    """What a class has: its attributes (methods, properties, class values) and what `__init__` sets."""
    names = set(dir(cls))
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls.__init__)))
    for node in ast.walk(tree):
        target = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for t in target:
            for x in ast.walk(t) if t is not None else ():
                if isinstance(x, ast.Attribute) and isinstance(x.value, ast.Name) and x.value.id == "self":
                    names.add(x.attr)
    return names


@pytest.mark.parametrize("cls", [NativeSession, LlamaCppSession, fake_backend.FakeSession])
def test_each_session_implements_every_protocol_of_a_measuring_session(cls):
    missing = members(protocols.MeasuringSession) - provided(cls)
    assert not missing, f"{cls.__name__} lacks {sorted(missing)}"


def test_the_protocols_are_small_and_their_union_is_the_session():
    parts = [protocols.Measures, protocols.Lifecycle, protocols.Judged, protocols.Reports, protocols.Benches,
             protocols.SearchHooks]  # fmt: skip
    assert all(len(members(p) - members(protocols.MeasuringBackend)) <= 12 for p in parts)
    assert set().union(*map(members, parts)) == members(protocols.MeasuringSession)
    assert {"screens", "measure", "policy", "fresh_reference"} <= members(protocols.MeasuringSession)
    # a class missing one is caught
    assert "policy" not in provided(type("Bare", (), {"__init__": lambda self: None}))
