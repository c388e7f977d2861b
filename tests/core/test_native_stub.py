"""python/fxpiece/_native.pyi says exactly what the extension does at run
time: the same names, the same signatures (parameter names, kinds and
defaults), the same exception hierarchy, and the documented return types."""

from __future__ import annotations

import ast
import inspect
import pathlib
import types
from typing import Any

import pytest

import fxpiece
from fxpiece import _native as native

STUB = pathlib.Path(fxpiece.__file__).with_name("_native.pyi")
TREE = ast.parse(STUB.read_text())
TOP = {n.name: n for n in TREE.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
CLASSES = {n: c for n, c in TOP.items() if isinstance(c, ast.ClassDef)}
assert set(CLASSES) == {"CacheIndex", "SigningKey"}


def _methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}


def _decorated(fn: ast.FunctionDef, name: str) -> bool:
    return any(isinstance(d, ast.Name) and d.id == name for d in fn.decorator_list)


def _stub_params(fn: ast.FunctionDef, drop_self: bool) -> list[tuple[str, str, Any]]:
    a = fn.args
    out: list[tuple[str, str, Any]] = []
    positional = a.posonlyargs + a.args
    defaults: list[Any] = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for arg, d in zip(positional, defaults, strict=True):
        out.append(
            (arg.arg, "positional", ast.literal_eval(d) if d is not None else inspect._empty)
        )
    for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        out.append((arg.arg, "keyword", ast.literal_eval(d) if d is not None else inspect._empty))
    return out[1:] if drop_self else out


def _runtime_params(obj: Any, drop_self: bool) -> list[tuple[str, str, Any]]:
    sig = inspect.signature(obj)
    params = list(sig.parameters.values())
    if drop_self:
        params = params[1:]
    kinds = {
        inspect.Parameter.POSITIONAL_ONLY: "positional",
        inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
        inspect.Parameter.KEYWORD_ONLY: "keyword",
    }
    return [(p.name, kinds[p.kind], p.default) for p in params]


def test_module_names_match() -> None:
    stub_names = set(TOP)
    stub_names |= {
        t.id
        for n in TREE.body
        if isinstance(n, ast.AnnAssign)
        for t in [n.target]
        if isinstance(t, ast.Name) and not t.id.startswith("_")
    }
    runtime = {n for n in dir(native) if not n.startswith("_")}
    assert stub_names == runtime


@pytest.mark.parametrize(
    "name", sorted(n for n, v in TOP.items() if isinstance(v, ast.FunctionDef))
)
def test_function_signatures_match(name: str) -> None:
    fn = TOP[name]
    assert isinstance(fn, ast.FunctionDef)
    assert _stub_params(fn, drop_self=False) == _runtime_params(getattr(native, name), False)


@pytest.mark.parametrize("cls_name", sorted(CLASSES))
def test_class_signatures_match(cls_name: str) -> None:
    methods = _methods(CLASSES[cls_name])
    runtime_cls = getattr(native, cls_name)
    if "__init__" in methods:
        assert _stub_params(methods["__init__"], True) == _runtime_params(runtime_cls, False)
    for name, fn in methods.items():
        if name == "__init__":
            continue
        attr = inspect.getattr_static(runtime_cls, name)
        if _decorated(fn, "property"):
            assert isinstance(attr, types.GetSetDescriptorType), name
            continue
        static = _decorated(fn, "staticmethod")
        assert isinstance(attr, staticmethod) == static, name
        stub = _stub_params(fn, drop_self=not static)
        runtime = _runtime_params(getattr(runtime_cls, name), drop_self=not static)
        if name.startswith("__"):  # dunders are positional-only at run time
            assert [p[0] for p in stub] == [p[0] for p in runtime], name
        else:
            assert stub == runtime, name
    runtime_methods = {
        n
        for n, v in vars(runtime_cls).items()
        if not n.startswith("_") or n in {"__contains__", "__len__", "__repr__"}
    }
    assert runtime_methods == set(methods) - {"__init__"}


def test_native_errors_are_the_python_classes(tmp_path: pathlib.Path) -> None:
    """The exception hierarchy lives in fxpiece.errors; the native core raises
    those very classes (and exports none of its own)."""
    import fxpiece.errors as errors

    # No exception class in the stub (its classes derive from nothing) nor at run time.
    assert all(not c.bases for c in CLASSES.values())
    runtime_classes = [v for v in vars(native).values() if isinstance(v, type)]
    assert {c.__name__ for c in runtime_classes} == set(CLASSES)
    assert not any(issubclass(c, BaseException) for c in runtime_classes)
    for name in ("CacheError", "CorruptIndexError", "LockTimeoutError", "CacheWarning"):
        assert not hasattr(native, name), name
    bad = tmp_path / "log-1-x-1-0.json"
    bad.write_bytes(b"garbage")
    with pytest.raises(errors.CorruptIndexError) as ei:
        native.verify_index_file(bad)
    assert isinstance(ei.value, errors.FxpieceError) and isinstance(ei.value, OSError)
    (tmp_path / "file").write_text("x")
    with pytest.raises(errors.CacheError) as e2:
        native.CacheIndex(tmp_path / "file" / "index")
    assert e2.value.filename is not None


def test_documented_return_types(tmp_path: pathlib.Path) -> None:
    idx = native.CacheIndex(tmp_path / "index")
    assert type(idx.path) is str and idx.path == str(tmp_path / "index")
    assert type(idx.host) is str and idx.host == native.this_host()
    assert type(repr(idx)) is str
    assert type(native.FORMAT_VERSION) is int
    assert type(native.pid_alive(1)) is bool
    f = tmp_path / "f"
    f.write_bytes(b"x")
    assert type(native.read_regular_file(f, 10)) is bytes
    assert type(native.quarantine(f)) is str
    assert native.quarantine(f) is None
