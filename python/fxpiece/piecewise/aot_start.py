"""Warm start without Dynamo: save Dynamo's output on a cold start, load it
on a warm one.

On the first call, :class:`AotStart` computes a *launch key* from what it
can know without tracing: the environment, config, Inductor and compiler
factors of the model key, and the call itself (the model's class and
parameter metadata, the inputs' dtypes, ranks, marked dims and static
sizes, grad mode). Under ``models/<launch key>/<model_tag>.aot`` the index
holds one entry per captured Dynamo graph (:class:`~fxpiece.cache.entries.AotKey`,
up to :data:`MAX_ENTRIES`): the digest of the saved Dynamo output (a
verified artifact in the content-addressed store) and the BLAKE3 of every
source file Dynamo traced.

- **Warm**: each entry's saved output is verified first (a corrupt one is
  quarantined; no module it names is looked up, since finding a module
  imports its parent packages), then the recorded files are hashed again;
  any change (an edited model file) is a miss. Otherwise every entry is
  loaded and its graph is rebuilt by the backend, which loads every piece
  from the cache: no Dynamo trace.
- **Cold**: the call is captured with Dynamo's ahead-of-time compile (one
  full graph), the pieces are compiled as usual, and the output is saved.
  A model with a graph break cannot be captured: that is logged with the
  reason, recorded (later starts do not retry), and the model runs through
  ``torch.compile`` as before.
- **Every call** checks the entries' guards first (the one that served
  the last call first). A call they all reject (``generate``'s decode step
  after its prefill) is captured as the next entry, so every graph a
  model's calls need is saved; when that cannot be done (a graph break, a
  read-only cache, :data:`MAX_ENTRIES` reached) the call runs through
  ``torch.compile`` (counted in ``num_aot_fallbacks``).

>>> from fxpiece.piecewise.aot_start import launch_input_meta
>>> import torch
>>> t = torch.ones(2, 3)
>>> launch_input_meta(t)["shape"]
[2, 3]
>>> torch._dynamo.mark_dynamic(t, 0)
>>> launch_input_meta(t)["shape"]
['*', 3]
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

import fxpiece
from fxpiece import gc_pause
from fxpiece.cache.entries import AotKey, Entry, Unsupported, Value
from fxpiece.cache.keys import AOT_TAG_SUFFIX, factors_key
from fxpiece.cache.model import ModelCache
from fxpiece.cache.store import checksum
from fxpiece.errors import CacheError, UntrustedCacheError
from fxpiece.hashing import hash_files_report
from fxpiece.piecewise._torch_compat import aot
from fxpiece.piecewise.backend import Backend
from fxpiece.piecewise.cache_open import open_model_cache
from fxpiece.piecewise.factors import (
    compiler_factors,
    config_factors,
    env_factors,
    inductor_factors,
)

__all__ = ["AotStart", "StartInfo", "launch_input_meta"]

_log = logging.getLogger("fxpiece")

MAX_ENTRIES = 8
"""The most ahead-of-time entries one launch key holds (one per Dynamo graph
the model's calls need: ``generate`` needs three). Calls none of them serves
are traced by Dynamo."""


@dataclass(frozen=True)
class StartInfo:
    """How a :class:`~fxpiece.api.CompiledModel` started (on its stats)."""

    path: str
    """``"aot-load"`` (Dynamo's output loaded: no trace), ``"aot-capture"``
    (cold: traced ahead of time and saved) or ``"dynamo"``."""
    why_not_aot: str | None
    """Why no saved entry was loaded: the miss before a capture, or why the
    ahead-of-time path was not taken at all (``path == "dynamo"``)."""
    seconds: float
    """Time to load or capture the ahead-of-time entry (backend included)."""
    launch_key: str | None = None


def launch_input_meta(a: Any) -> Any:
    """What a call's argument contributes to the launch key: for a tensor
    its dtype, device, grad flag and shape with marked (dynamic) dims as
    ``"*"``."""
    if isinstance(a, torch.Tensor):
        dyn: set[int] = set()
        for attr in ("_dynamo_unbacked_indices", "_dynamo_dynamic_indices"):
            dyn |= set(getattr(a, attr, ()) or ())
        return {
            "dtype": str(a.dtype),
            "device": a.device.type,
            "requires_grad": a.requires_grad,
            "shape": ["*" if i in dyn else int(s) for i, s in enumerate(a.shape)],
        }
    if isinstance(a, bool | int | float | str) or a is None:
        return {"const": a}
    return {"type": f"{type(a).__module__}.{type(a).__qualname__}"}


def _module_meta(model: torch.nn.Module) -> list[Any]:
    return [
        [name, str(t.dtype), list(t.shape), t.device.type, t.requires_grad]
        for name, t in (*model.named_parameters(), *model.named_buffers())
    ]


class AotStart:
    """The ahead-of-time start of one compiled model (see the module doc)."""

    def __init__(self, backend: Backend, model: Callable[..., Any], model_tag: str) -> None:
        self.backend = backend
        self.model = model
        self.model_tag = model_tag
        self._fns: list[Any] = []
        """The loaded or captured entries, in the order they are tried."""
        self._last = 0
        """The entry that served the last call (tried first)."""
        self._slots: set[int] = set()
        """Which ``AotKey(n)`` the entries are at (a capture takes the next free one)."""
        self._mc: ModelCache | None = None
        self._target_fn: Callable[..., Any] | None = None
        self._grad = True
        self._lead: tuple[Any, ...] = ()
        self._warned = False
        self._recorded_unsupported = False
        self.info: StartInfo | None = None

    # -- what is captured ----------------------------------------------------
    def _target(self) -> tuple[Callable[..., Any], tuple[Any, ...]] | str:
        """The function Dynamo captures and the arguments that lead the call
        (``self`` for a module), or why the model cannot be captured."""
        m = self.model
        if isinstance(m, torch.nn.Module):
            if "forward" in vars(m):
                return "the module's forward is an instance attribute"
            if m._forward_hooks or m._forward_pre_hooks:
                return "the module has forward hooks"
            return type(m).forward, (m,)
        if inspect.ismethod(m):
            # Captured as its function with the receiver first, as Dynamo
            # traces it: the saved guards then see the same locals on a check.
            return m.__func__, (m.__self__,)
        if hasattr(m, "__code__") and hasattr(m, "__globals__"):
            return m, ()
        return f"{type(m).__name__} is neither a function nor an nn.Module"

    def _why_not(self) -> str | None:
        cfg = self.backend.config
        if not cfg.aot:
            return "config.aot is off (FXPIECE_AOT=0)"
        if not self.backend.cache_enabled():
            return "the cache is disabled"
        if self.backend.aot_unsupported is not None:
            return self.backend.aot_unsupported
        return aot.aot_supported()

    def launch_factors(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The factors of the launch key (see the module doc)."""
        cfg = self.backend.config
        m = self.model
        owner = m.__self__ if inspect.ismethod(m) else m
        model = {
            "type": f"{type(owner).__module__}.{type(owner).__qualname__}",
            "name": getattr(m, "__qualname__", None),
            "state": _module_meta(owner) if isinstance(owner, torch.nn.Module) else None,
        }
        return {
            "env": env_factors(),
            "config": config_factors(cfg),
            "inductor": inductor_factors(cfg.inductor_config),
            "compiler": compiler_factors(self.backend.compiler.compute_hash()),
            "launch": {
                "model": model,
                "args": [launch_input_meta(a) for a in args],
                "kwargs": {k: launch_input_meta(v) for k, v in sorted(kwargs.items())},
                "grad": torch.is_grad_enabled(),
                "fxpiece": fxpiece.__version__,
            },
        }

    # -- the start ------------------------------------------------------------
    def start(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> StartInfo:
        """Load every ahead-of-time entry of the launch key, or capture the
        first call (first call only)."""
        t0 = time.perf_counter()
        why = self._why_not()
        target = self._target()
        if why is None and isinstance(target, str):
            why = target
        if why is not None or isinstance(target, str):
            self.info = StartInfo("dynamo", why, 0.0)
            return self.info
        fn, lead = target
        self._target_fn, self._lead = fn, lead
        self._grad = torch.is_grad_enabled()
        try:
            mc = self._open(args, kwargs)
        except UntrustedCacheError:
            raise
        except OSError as e:
            self.info = StartInfo("dynamo", f"launch folder unusable: {e}", 0.0)
            return self.info
        self._mc = mc
        if mc.entries.value(AotKey(0)) is None:  # the fleet's remote tier may have it
            self.backend.coordination.fetch(mc, [AotKey(0)])
        path, why = self._load(mc, fn)
        if path is None and self.can_capture():
            path, why_not = self._capture(mc, fn, lead, args, kwargs)
            if path is None:
                why = why_not
        self.info = StartInfo(path or "dynamo", why or None, time.perf_counter() - t0, mc.key)
        if path is None:
            _log.info("fxpiece: no ahead-of-time start for %r: %s", self.model_tag, why)
        return self.info

    def can_capture(self) -> bool:
        """Whether a call no entry serves may be captured as a new entry."""
        mc = self._mc
        return (
            mc is not None
            and self._target_fn is not None
            and not (mc.readonly or self.backend.config.require_cache_hit)
            and not self._recorded_unsupported
            and len(self._fns) < MAX_ENTRIES
        )

    def add(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
        """Capture a call that no entry serves as the next entry (``args``
        and ``kwargs`` with their dynamic dims marked). ``False`` if it
        cannot be captured (the call then goes through ``torch.compile``)."""
        if not self.can_capture() or self._mc is None or self._target_fn is None:
            return False
        if torch.is_grad_enabled() != self._grad:
            return False
        path, _ = self._capture(self._mc, self._target_fn, self._lead, args, kwargs)
        return path is not None

    def _open(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> ModelCache:
        factors = self.launch_factors(args, kwargs)
        return open_model_cache(
            self.backend.config,
            factors_key(factors),
            self.model_tag + AOT_TAG_SUFFIX,
            factors,
            rewrite_factors=False,
        )

    def _load(self, mc: ModelCache, fn: Callable[..., Any]) -> tuple[str | None, str]:
        """Load the launch key's entries in order (``AotKey(0)``, ``(1)``...,
        up to the first absent one); ``("aot-load", "")`` if any loaded."""
        why = "no ahead-of-time entry for this launch key yet"
        for n in range(MAX_ENTRIES):
            value = mc.entries.value(AotKey(n))
            if value is None:
                break
            if isinstance(value, Unsupported):
                reason = value.reason
                self._recorded_unsupported = True
                if n == 0:
                    self._log_unsupported(reason, recorded=True)
                    return None, reason
                break
            loaded, why = self._load_one(mc, fn, n, value)
            if loaded is not None:
                self._fns.append(loaded)
                self._slots.add(n)
        if not self._fns:
            return None, why
        self.backend.count("num_aot_loads", len(self._fns))
        return "aot-load", ""

    def _load_one(
        self, mc: ModelCache, fn: Callable[..., Any], n: int, entry: Entry
    ) -> tuple[Any, str]:
        files = entry.files
        if not files:
            return None, "the ahead-of-time entry lists no traced files"
        # Verified before any module it names is looked up: finding a module
        # imports its parent packages, so an entry that fails its checksum
        # never gets to make this process import anything.
        data = mc.artifacts.load(entry.handle)
        if data is None:
            self.backend.count("num_corrupt_artifacts")
            _log.warning("fxpiece: the ahead-of-time entry is missing or corrupt; tracing again")
            return None, "the ahead-of-time entry is missing or corrupt"
        changed = self._changed_files(files)
        if changed:
            return None, f"traced source file changed: {changed}"
        try:
            with gc_pause.paused():
                loaded, piece = aot.deserialize(data, fn.__globals__)
                piece.build(self.backend.build)
            return loaded, ""
        except UntrustedCacheError:
            raise
        except Exception as e:  # an entry torch cannot load: trace again, never crash
            self._quarantine(mc, n, entry)
            _log.warning(
                "fxpiece: loading the ahead-of-time entry failed (%s: %s); tracing again",
                type(e).__name__,
                e,
            )
            return None, f"loading the ahead-of-time entry failed: {type(e).__name__}"

    @staticmethod
    def _changed_files(files: Mapping[str, Any]) -> str | None:
        """The first recorded module (by name: the file it is *now* imported
        from, wherever that is) whose source differs now, or cannot be found."""
        paths = {name: aot.module_file(name) for name in files}
        found = [p for p in paths.values() if p is not None]
        now = {f.path: f.digest for f in hash_files_report(found).files}
        for name, digest in sorted(files.items()):
            path = paths[name]
            if path is None or now.get(path) != digest:
                return f"{name} ({path or 'not found'})"
        return None

    def _quarantine(self, mc: ModelCache, n: int, entry: Entry) -> None:
        """Move aside an entry that verified but does not load (torch cannot
        read it), with the index entries that point at it
        (:meth:`ModelCache.quarantine`), so the next capture can store its own."""
        self.backend.count("num_corrupt_artifacts")
        if mc.readonly or mc.quarantine(entry.handle):
            return
        try:  # nothing to move (no artifact handle): the entry still goes
            mc.entries.remove(AotKey(n))
        except CacheError as e:
            _log.warning("fxpiece: could not drop the ahead-of-time entry: %s", e)

    def _capture(
        self,
        mc: ModelCache,
        fn: Callable[..., Any],
        lead: tuple[Any, ...],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
    ) -> tuple[str | None, str]:
        n = next(i for i in range(MAX_ENTRIES + 1) if i not in self._slots)
        try:
            captured = aot.capture(
                fn,
                (*lead, *args),
                dict(kwargs),
                self.backend.capture,
                self.backend.inductor_dirs.active(),
            )
            piece = aot.captured_piecewise(captured)
            modules = aot.traced_modules(captured)
            piece.state["traced_modules"] = modules
            piece.build(self.backend.build)
            data = aot.serialize(captured)
        except aot.AotUnsupported as e:
            return self._unsupported(mc, n, str(e))
        # Serve calls with the saved function, exactly as a warm start does
        # (the pieces are reused from this backend, not rebuilt).
        try:
            built = piece.fn
            if built is None:
                raise aot.AotUnsupported("the captured graph was not built")
            loaded, again = aot.deserialize(data, fn.__globals__)
            again.serve(built)
        except Exception as e:
            return self._unsupported(
                mc, n, f"Dynamo's saved output does not load: {type(e).__name__}: {e}"
            )
        self._fns.append(loaded)
        self._slots.add(n)
        digests = {f.path: f.digest for f in hash_files_report(modules.values()).files}
        files = {name: digests.get(path) for name, path in modules.items()}
        try:
            digest = checksum(data)
            handle = mc.artifacts.put(digest, data)
        except CacheError as e:
            _log.warning("fxpiece: could not store the ahead-of-time entry: %s", e)
            return "aot-capture", ""
        self._record(mc, n, Entry(digest, handle, files))
        self.backend.count("num_aot_saves")
        return "aot-capture", ""

    def _unsupported(self, mc: ModelCache, n: int, reason: str) -> tuple[None, str]:
        """A call that cannot be captured: said once, and recorded so later
        starts do not try again (the first call: no ahead-of-time start at
        all; a later one: calls no entry serves are traced by Dynamo)."""
        if n == 0:
            self._log_unsupported(reason, recorded=False)
            self.backend.count("num_aot_fallbacks")  # later calls: counted by fallback()
        else:
            _log.warning(
                "fxpiece: a later call to %r cannot be captured ahead of time (%s); "
                "calls the %d captured entries do not serve are traced by Dynamo",
                self.model_tag,
                reason,
                len(self._fns),
            )
        self._recorded_unsupported = True
        self._record(mc, n, Unsupported(reason))
        return None, reason

    def _record(self, mc: ModelCache, n: int, value: Value) -> None:
        if mc.readonly:
            return
        try:
            mc.entries.put(AotKey(n), value)
        except CacheError as e:
            _log.warning("fxpiece: could not record the ahead-of-time entry: %s", e)
            return
        self.backend.coordination.publish(mc, [AotKey(n)])

    def _log_unsupported(self, reason: str, *, recorded: bool) -> None:
        _log.warning(
            "fxpiece: ahead-of-time warm start unavailable for model tag %r (%s): %s; "
            "Dynamo traces the model on every start",
            self.model_tag,
            "recorded by an earlier start" if recorded else "its capture failed",
            reason,
        )

    # -- calls ----------------------------------------------------------------
    def call(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[bool, Any]:
        """``(True, result)`` if a captured function serves this call (the
        first whose guards accept it), ``(False, None)`` if none does."""
        if not self._fns or torch.is_grad_enabled() != self._grad:
            return False, None
        lead, fns, last = self._lead, self._fns, self._last
        # The entry that served the last call first: decode steps repeat it.
        fn = fns[last]
        if aot.check_guards(fn, *lead, *args, **kwargs):
            return True, fn(*lead, *args, **kwargs)
        for i, fn in enumerate(fns):
            if i != last and aot.check_guards(fn, *lead, *args, **kwargs):
                self._last = i
                return True, fn(*lead, *args, **kwargs)
        return False, None

    def fallback(self) -> None:
        """A call no entry serves goes through ``torch.compile``: counted,
        and said once."""
        if not self._fns:
            return
        self.backend.count("num_aot_fallbacks")
        if not self._warned:
            self._warned = True
            _log.warning(
                "fxpiece: no ahead-of-time entry's guards accept a call to %r "
                "(inputs or grad mode differ from the captured ones); tracing it",
                self.model_tag,
            )
