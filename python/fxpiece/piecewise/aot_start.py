"""Warm start without Dynamo: save Dynamo's output on a cold start, load it
on a warm one.

On the first call, :class:`AotStart` computes a *launch key* from what it
can know without tracing: the environment, config, Inductor and compiler
factors of the model key, and the call itself (the model's class and
parameter metadata, the inputs' dtypes, ranks, marked dims and static
sizes, grad mode). Under ``models/<launch key>/<model_tag>.aot`` the index
holds one entry (:data:`~fxpiece.cache.keys.AOT_KEY`): the digest of the
saved Dynamo output (a verified artifact in the content-addressed store)
and the BLAKE3 of every source file Dynamo traced.

- **Warm**: the recorded files are hashed again; any change (an edited
  model file) is a miss. Otherwise the artifact is loaded (verified first,
  quarantined if corrupt) and its graph is rebuilt by the backend, which
  loads every piece from the cache: no Dynamo trace.
- **Cold**: the call is captured with Dynamo's ahead-of-time compile (one
  full graph), the pieces are compiled as usual, and the output is saved.
  A model with a graph break cannot be captured: that is logged with the
  reason, recorded (later starts do not retry), and the model runs through
  ``torch.compile`` as before.
- **Every call** checks the captured guards first; a call they reject (a
  new dtype, a static size that changed) runs through ``torch.compile``
  (counted in ``num_aot_fallbacks``).

>>> from fxpiece.piecewise.aot_start import launch_input_meta
>>> import torch
>>> launch_input_meta(torch.ones(2, 3))["shape"]
['*', 3]
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

import fxpiece
from fxpiece.cache.keys import AOT_KEY, AOT_TAG_SUFFIX, factors_key
from fxpiece.cache.layout import CacheLayout
from fxpiece.cache.model import ModelCache
from fxpiece.cache.store import checksum, quarantine
from fxpiece.cache.trust import ensure_private_dir
from fxpiece.errors import CacheError, UntrustedCacheError
from fxpiece.hashing import hash_files_report
from fxpiece.piecewise._torch_compat import aot
from fxpiece.piecewise.backend import Backend
from fxpiece.piecewise.factors import (
    compiler_factors,
    config_factors,
    env_factors,
    inductor_factors,
)

__all__ = ["AotStart", "StartInfo", "launch_input_meta"]

_log = logging.getLogger("fxpiece")


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
        self._fn: Any = None
        self._grad = True
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
        model = {
            "type": f"{type(m).__module__}.{type(m).__qualname__}",
            "name": getattr(m, "__qualname__", None),
            "state": _module_meta(m) if isinstance(m, torch.nn.Module) else None,
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
        """Load or capture the ahead-of-time entry (first call only)."""
        t0 = time.perf_counter()
        why = self._why_not()
        target = self._target()
        if why is None and isinstance(target, str):
            why = target
        if why is not None or isinstance(target, str):
            self.info = StartInfo("dynamo", why, 0.0)
            return self.info
        fn, lead = target
        self._grad = torch.is_grad_enabled()
        try:
            mc = self._open(args, kwargs)
        except UntrustedCacheError:
            raise
        except OSError as e:
            self.info = StartInfo("dynamo", f"launch folder unusable: {e}", 0.0)
            return self.info
        path, why = self._load(mc, fn)
        can_capture = not (mc.readonly or self.backend.config.require_cache_hit)
        if path is None and can_capture and not self._recorded_unsupported:
            path, why_not = self._capture(mc, fn, lead, args, kwargs)
            if path is None:
                why = why_not
        self.info = StartInfo(path or "dynamo", why or None, time.perf_counter() - t0, mc.key)
        if path is None:
            _log.info("fxpiece: no ahead-of-time start for %r: %s", self.model_tag, why)
        return self.info

    def _open(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> ModelCache:
        cfg = self.backend.config
        root = cfg.resolved_cache_dir()
        layout = CacheLayout(root if cfg.cache_readonly else ensure_private_dir(root))
        factors = self.launch_factors(args, kwargs)
        mc = ModelCache(
            layout,
            factors_key(factors),
            self.model_tag + AOT_TAG_SUFFIX,
            trust=cfg.allow_untrusted_cache,
            readonly=cfg.cache_readonly,
        )
        if not mc.readonly and not CacheLayout.factors_file(mc.folder).exists():
            # For people (``fxpiece cache explain``); the key does not need it.
            try:
                mc.write_factors(factors)
            except OSError as e:
                _log.warning("fxpiece: could not write to the cache: %s", e)
        return mc

    def _load(self, mc: ModelCache, fn: Callable[..., Any]) -> tuple[str | None, str]:
        value = mc.index.get(AOT_KEY)
        if not isinstance(value, dict):
            return None, "no ahead-of-time entry for this launch key yet"
        if "unsupported" in value:
            reason = str(value["unsupported"])
            self._recorded_unsupported = True
            self._log_unsupported(reason, recorded=True)
            return None, reason
        files = value.get("files")
        if not isinstance(files, dict) or not files:
            return None, "the ahead-of-time entry lists no traced files"
        changed = self._changed_files(files)
        if changed:
            return None, f"traced source file changed: {changed}"
        data = mc.artifacts.load(value.get("handle"))
        if data is None:
            self.backend.count("num_corrupt_artifacts")
            _log.warning("fxpiece: the ahead-of-time entry is missing or corrupt; tracing again")
            return None, "the ahead-of-time entry is missing or corrupt"
        try:
            self._fn = aot.deserialize(data, fn.__globals__, self.backend.rebuild)
        except UntrustedCacheError:
            raise
        except Exception as e:  # an entry torch cannot load: trace again, never crash
            self._quarantine(mc, value)
            _log.warning(
                "fxpiece: loading the ahead-of-time entry failed (%s: %s); tracing again",
                type(e).__name__,
                e,
            )
            return None, f"loading the ahead-of-time entry failed: {type(e).__name__}"
        self.backend.count("num_aot_loads")
        return "aot-load", ""

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

    def _quarantine(self, mc: ModelCache, value: Mapping[str, Any]) -> None:
        """Move aside an entry that verified but does not load (torch cannot
        read it), so the next capture can store its own."""
        self.backend.count("num_corrupt_artifacts")
        handle = value.get("handle")
        if mc.readonly or not isinstance(handle, dict):
            return
        rel = handle.get("artifact")
        if isinstance(rel, str) and mc.layout.is_artifact_rel(rel):
            quarantine(mc.layout.artifact_path(mc.layout.digest_of_artifact(rel)))
        try:
            mc.index.remove(AOT_KEY)
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
        try:
            captured = aot.capture(fn, (*lead, *args), dict(kwargs), self.backend)
            piece = aot.captured_piecewise(captured)
            modules = aot.traced_modules(captured)
            piece.state["traced_modules"] = modules
            piece.finish(self.backend.rebuild)
            data = aot.serialize(captured)
        except aot.AotUnsupported as e:
            self._log_unsupported(str(e), recorded=False)
            self.backend.count("num_aot_fallbacks")
            self._record(mc, {"unsupported": str(e)})
            return None, str(e)
        # Serve calls with the saved function, exactly as a warm start does
        # (the pieces are reused from this backend, not rebuilt).
        try:
            built = piece.fn
            if built is None:
                raise aot.AotUnsupported("the captured graph was not built")
            self._fn = aot.deserialize(data, fn.__globals__, lambda *_: built)
        except Exception as e:
            reason = f"Dynamo's saved output does not load: {type(e).__name__}: {e}"
            self._log_unsupported(reason, recorded=False)
            self.backend.count("num_aot_fallbacks")
            self._record(mc, {"unsupported": reason})
            return None, reason
        digests = {f.path: f.digest for f in hash_files_report(modules.values()).files}
        files = {name: digests.get(path) for name, path in modules.items()}
        try:
            digest = checksum(data)
            handle = mc.artifacts.put(digest, data)
        except CacheError as e:
            _log.warning("fxpiece: could not store the ahead-of-time entry: %s", e)
            return "aot-capture", ""
        self._record(mc, {"digest": digest, "handle": handle, "files": files})
        self.backend.count("num_aot_saves")
        return "aot-capture", ""

    def _record(self, mc: ModelCache, value: dict[str, Any]) -> None:
        if mc.readonly:
            return
        try:
            mc.index.insert(AOT_KEY, value)
        except CacheError as e:
            _log.warning("fxpiece: could not record the ahead-of-time entry: %s", e)

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
        """``(True, result)`` if the captured function serves this call,
        ``(False, None)`` if it must go through ``torch.compile``."""
        fn = self._fn
        if fn is None:
            return False, None
        lead = (self.model,) if isinstance(self.model, torch.nn.Module) else ()
        if torch.is_grad_enabled() == self._grad and aot.check_guards(fn, *lead, *args, **kwargs):
            return True, fn(*lead, *args, **kwargs)
        self.backend.count("num_aot_fallbacks")
        if not self._warned:
            self._warned = True
            _log.warning(
                "fxpiece: the ahead-of-time entry's guards reject a call to %r "
                "(inputs or grad mode differ from the captured ones); tracing it",
                self.model_tag,
            )
        return False, None
