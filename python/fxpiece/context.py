"""Context variables: the model tag selecting the cache sub-folder, and the
compile range seen by post-grad passes. No module globals are mutated."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

from fxpiece.errors import ConfigError
from fxpiece.ranges import Range

__all__ = [
    "SAFE_NAME",
    "ModelTag",
    "current_compile_range",
    "current_model_tag",
    "set_model_tag",
    "validate_path_part",
]

SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
"""A folder name that cannot escape the cache root (use with ``fullmatch``)."""


def validate_path_part(field: str, value: str) -> str:
    """Names used as path parts cannot escape the cache root (no ``/``, no
    ``..``, not absolute, not hidden)."""
    if not isinstance(value, str) or not SAFE_NAME.fullmatch(value) or ".." in value:
        raise ConfigError(
            field,
            f"{value!r} is not a safe folder name; use letters, digits, '.', '_', '+', '-' "
            "(no '/', no '..', not starting with '.'), at most 128 characters",
        )
    return value


@dataclass(frozen=True, slots=True)
class ModelTag:
    tag: str


_model_tag: ContextVar[ModelTag | None] = ContextVar("fxpiece_model_tag", default=None)
_compile_range: ContextVar[Range | None] = ContextVar("fxpiece_compile_range", default=None)


@contextlib.contextmanager
def set_model_tag(tag: str) -> Iterator[None]:
    """Select the cache sub-folder for models compiled inside this block.

    >>> import fxpiece
    >>> with fxpiece.set_model_tag("encoder"):
    ...     fxpiece.current_model_tag()
    ModelTag(tag='encoder')
    """
    token = _model_tag.set(ModelTag(validate_path_part("model_tag", tag)))
    try:
        yield
    finally:
        _model_tag.reset(token)


def current_model_tag() -> ModelTag | None:
    """The tag set by the innermost :func:`set_model_tag`, if any."""
    return _model_tag.get()


def current_compile_range() -> Range | None:
    """The :class:`Range` being compiled, inside a post-grad pass."""
    return _compile_range.get()


@contextlib.contextmanager
def compiling_range(r: Range) -> Iterator[None]:
    token = _compile_range.set(r)
    try:
        yield
    finally:
        _compile_range.reset(token)
