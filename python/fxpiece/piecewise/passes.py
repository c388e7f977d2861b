"""Post-grad passes and the pass manager installed in Inductor.

A pass subclasses :class:`InductorPass`, rewrites the ``torch.fx.Graph`` it
is called with in place, and has a :meth:`~InductorPass.uuid` that changes
when its code or options change (it enters the cache key). Inside a pass,
:func:`fxpiece.current_compile_range` is the :class:`~fxpiece.Range` being
compiled.

>>> import torch
>>> from fxpiece.piecewise.passes import InductorPass
>>> class CountNodes(InductorPass):
...     def __init__(self, limit: int) -> None:
...         self.limit = limit
...     def options(self):
...         return {"limit": self.limit}
...     def __call__(self, graph: torch.fx.Graph) -> None:
...         pass
>>> CountNodes(1).uuid() != CountNodes(2).uuid()
True
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import torch.fx

from fxpiece.context import current_compile_range
from fxpiece.errors import ConfigError
from fxpiece.hashing import hash_factors
from fxpiece.piecewise._torch_compat import CustomGraphPassBase
from fxpiece.ranges import Range

__all__ = ["InductorPass", "PassManager"]


def _class_source(cls: type) -> str:
    parts = []
    for klass in cls.__mro__:
        if klass in (InductorPass, ABC, object):
            break
        try:
            parts.append(inspect.getsource(klass))
        except (OSError, TypeError):
            raise ConfigError(
                "post_grad_passes",
                f"cannot read the source of pass class {klass.__qualname__} to build its uuid; "
                "define it in a file, or override uuid() to return a string that changes "
                "whenever its behaviour does",
            ) from None
    return "\n".join(parts)


class InductorPass(ABC):
    """A post-grad pass run by Inductor on each compiled piece."""

    @abstractmethod
    def __call__(self, graph: torch.fx.Graph) -> None:
        """Rewrite ``graph`` in place."""

    def options(self) -> Any:
        """JSON-like options that change what the pass does (enter the uuid)."""
        return None

    def uuid(self) -> str:
        """Changes whenever the pass's source or options do."""
        return hash_factors(
            {
                "class": f"{type(self).__module__}.{type(self).__qualname__}",
                "source": _class_source(type(self)),
                "options": self.options(),
            }
        )

    def is_applicable_for_range(self, compile_range: Range) -> bool:
        """Whether to run when compiling for ``compile_range``."""
        return True


class PassManager(CustomGraphPassBase):
    """Runs the configured passes in order; what Inductor's
    ``post_grad_custom_post_pass`` is set to. Its uuid covers every pass's
    uuid and the compile range, so each range gets its own Inductor cache
    entry."""

    def __init__(self, passes: Sequence[InductorPass], compile_range: Range | None) -> None:
        self.passes = tuple(passes)
        self.compile_range = compile_range

    def __call__(self, graph: torch.fx.Graph) -> None:
        r = current_compile_range() or self.compile_range
        for p in self.passes:
            if r is None or p.is_applicable_for_range(r):
                p(graph)

    def uuid(self) -> str:
        r = self.compile_range
        return hash_factors(
            {
                "passes": [p.uuid() for p in self.passes],
                "range": None if r is None else [r.start, r.end],
            }
        )
