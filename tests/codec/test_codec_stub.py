"""pulsarwire/_codec.pyi against the twins: the stub declares what pulsarwire.codec exports, and
each twin has every name it declares, with the same parameters (names, kinds, defaults) for
functions and methods and the same public members for classes.

The Cython twin is compiled with Cython 3's default binding=True (neither _codec.pyx nor
setup.py turns it off), so inspect.signature reads its functions and methods; it cannot read
special methods of a cdef class (__init__, __len__), which are compared in the pure twin only."""
from __future__ import annotations

import ast
import inspect

import pytest

from pulsarwire import codec

from ..conftest import ROOT, TWINS

STUB = ROOT / "pulsarwire" / "_codec.pyi"
KINDS = {"posonly": inspect.Parameter.POSITIONAL_ONLY, "args": inspect.Parameter.POSITIONAL_OR_KEYWORD,
         "vararg": inspect.Parameter.VAR_POSITIONAL, "kwonly": inspect.Parameter.KEYWORD_ONLY,
         "kwarg": inspect.Parameter.VAR_KEYWORD}
NO_DEFAULT = inspect.Parameter.empty


def _params(node: ast.FunctionDef) -> list[tuple[str, inspect._ParameterKind, object]]:
    """(name, kind, default) of each parameter; a default written `...` is any default."""
    a = node.args
    positional = a.posonlyargs + a.args
    defaults = [NO_DEFAULT] * (len(positional) - len(a.defaults)) + [ast.literal_eval(d) for d in a.defaults]
    out = [(arg.arg, KINDS["posonly" if i < len(a.posonlyargs) else "args"], default)
           for i, (arg, default) in enumerate(zip(positional, defaults))]
    if a.vararg:
        out.append((a.vararg.arg, KINDS["vararg"], NO_DEFAULT))
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        out.append((arg.arg, KINDS["kwonly"], NO_DEFAULT if default is None else ast.literal_eval(default)))
    if a.kwarg:
        out.append((a.kwarg.arg, KINDS["kwarg"], NO_DEFAULT))
    return out


def _is_property(node: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list)


def _stub():
    """{name: None (a constant) | params (a function) | {member: None | params} (a class)}."""
    surface: dict = {}
    for node in ast.parse(STUB.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            surface[node.name] = _params(node)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            surface[node.target.id] = None
        elif isinstance(node, ast.ClassDef):
            members: dict = {}
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    members[item.name] = None if _is_property(item) else _params(item)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members[item.target.id] = None
            surface[node.name] = members
    return {name: value for name, value in surface.items() if not name.startswith("_")}


def _signature(obj) -> list[tuple[str, inspect._ParameterKind, object]] | None:
    """The twin's parameters, or None where inspect cannot read them (a cdef class's slot)."""
    if not (inspect.isfunction(obj) or type(obj).__name__ == "cython_function_or_method"):
        return None  # a C slot or descriptor: inspect gives a generic signature, or none
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


def _same(stub_params, twin_params) -> bool:
    if len(stub_params) != len(twin_params):
        return False
    for (name, kind, default), (twin_name, twin_kind, twin_default) in zip(stub_params, twin_params):
        if name != twin_name or kind != twin_kind:
            return False
        if default is Ellipsis:
            if twin_default is NO_DEFAULT:
                return False
        elif default != twin_default or type(default) is not type(twin_default):
            return False
    return True


def _public_members(cls) -> set[str]:
    names = {n for n in dir(cls) if not n.startswith("_")}
    try:  # attributes a pure-twin __init__ sets on the instance
        names |= {n for n in dir(cls()) if not n.startswith("_")}
    except TypeError:  # not made without arguments
        pass
    return names


def test_the_stub_declares_what_the_codec_exports():
    assert set(_stub()) == set(codec.__all__)


@pytest.mark.parametrize("twin", TWINS, ids=lambda twin: twin.IMPLEMENTATION)
def test_each_twin_matches_the_stub(twin):
    compared = 0
    for name, declared in _stub().items():
        assert hasattr(twin, name), name
        value = getattr(twin, name)
        if declared is None:
            assert not callable(value), name
        elif isinstance(declared, list):
            params = _signature(value)
            assert params is not None, f"{name}: no signature (compiled with binding=False?)"
            assert _same(declared, params), f"{name}: stub {declared}, {twin.IMPLEMENTATION} {params}"
            compared += 1
        else:
            assert isinstance(value, type), name
            public = {member for member in declared if not member.startswith("_")}
            assert public == _public_members(value), name
            for member, params_declared in declared.items():
                assert member in public or hasattr(value, member), f"{name}.{member}"
                if params_declared is None:
                    continue
                params = _signature(getattr(value, member))
                if params is None:
                    assert member.startswith("__"), f"{name}.{member}: no signature"
                    continue
                assert _same(params_declared, params), \
                    f"{name}.{member}: stub {params_declared}, {twin.IMPLEMENTATION} {params}"
                compared += 1
    assert compared > 20  # signatures were read, not skipped
