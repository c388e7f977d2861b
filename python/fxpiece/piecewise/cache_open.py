"""Opening a model's cache: one implementation for a graph's pieces
(:class:`GraphCacheOpener`, used by the backend) and an ahead-of-time entry
(:mod:`fxpiece.piecewise.aot_start`), and the model tag both are filed under.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.fx

from fxpiece.cache.keys import KeyFactors
from fxpiece.cache.layout import CacheLayout
from fxpiece.cache.model import ModelCache
from fxpiece.cache.trust import ensure_private_dir
from fxpiece.config import CompileConfig
from fxpiece.context import current_model_tag
from fxpiece.errors import CacheMissError, ConfigError, UntrustedCacheError
from fxpiece.piecewise import _torch_compat
from fxpiece.piecewise.factors import make_key_factors, saved_key_factors

__all__ = ["GraphCacheOpener", "OpenedCache", "model_tag_for", "open_model_cache"]

_log = logging.getLogger("fxpiece")


def model_tag_for(config: CompileConfig) -> str:
    """The model tag in effect: :func:`fxpiece.model_tag`'s, else the config's."""
    tag = current_model_tag()
    return tag.tag if tag is not None else config.model_tag


def open_model_cache(
    config: CompileConfig,
    key: str,
    model_tag: str,
    factors: dict[str, Any],
    *,
    rewrite_factors: bool = True,
) -> ModelCache:
    """``models/<key>/<model_tag>`` under the configured root (created
    private unless read-only), with ``cache_key_factors.json`` written for
    people (``fxpiece cache explain``; the key does not need it: a failure
    is a warning). ``rewrite_factors=False`` writes it only when missing."""
    readonly = config.cache_readonly
    root = config.resolved_cache_dir()
    layout = CacheLayout(root if readonly else ensure_private_dir(root))
    mc = ModelCache(layout, key, model_tag, trust=config.allow_untrusted_cache, readonly=readonly)
    if not readonly and (rewrite_factors or not CacheLayout.factors_file(mc.folder).exists()):
        best_effort(mc.write_factors, factors)
    return mc


def best_effort(write: Callable[[Any], None], value: Any) -> None:
    """A write that helps people (readable graph, factors) but that the cache
    does not need: a failure is logged, not raised."""
    try:
        write(value)
    except OSError as e:
        _log.warning("fxpiece: could not write to the cache: %s", e)


@dataclass(frozen=True)
class OpenedCache:
    """A graph's cache: its key factors and model folder."""

    factors: KeyFactors
    model: ModelCache
    miss_explanation: str | None


class GraphCacheOpener:
    """Computes a Dynamo graph's key and opens its model cache; explains a
    new key once per model tag."""

    def __init__(
        self,
        config: CompileConfig,
        compiler_hash: Callable[[], str],
        inductor_dirs: Callable[[], _torch_compat.InductorDirs],
    ) -> None:
        self.config = config
        self._compiler_hash = compiler_hash
        self._inductor_dirs = inductor_dirs
        self._tags_seen: set[str] = set()

    def open_or_skip(
        self,
        gm: torch.fx.GraphModule,
        fake_args: Sequence[Any],
        model_tag: str,
        traced: Sequence[str],
        saved: dict[str, Any] | None = None,
    ) -> tuple[OpenedCache | None, str | None]:
        """The graph's cache, or ``(None, why)`` when it cannot be used: the
        graph then compiles in memory. Only the trust boundary, a required
        hit and config errors raise."""
        try:
            return self.open(gm, fake_args, model_tag, traced, saved), None
        except (UntrustedCacheError, CacheMissError, ConfigError):
            raise
        except OSError as e:  # CacheError included: folder is a file, EACCES, EROFS, ENOSPC
            why = f"{type(e).__name__}: {e}"
            _log.warning("fxpiece: cache unusable, compiling in memory: %s", why)
            return None, why

    def open(
        self,
        gm: torch.fx.GraphModule,
        fake_args: Sequence[Any],
        model_tag: str,
        traced: Sequence[str],
        saved: dict[str, Any] | None = None,
    ) -> OpenedCache:
        """Compute the key (or reuse ``saved["factors"]`` when they still
        hold) and open the model's cache folder; a capture records the
        factors in ``saved``."""
        cfg = self.config
        prior = saved.get("factors") if saved is not None else None
        factors = saved_key_factors(prior, cfg) if isinstance(prior, dict) else None
        if factors is None:
            # The key's ISA probe compiles test programs in Inductor's folder.
            dirs = self._inductor_dirs()
            with dirs.active():
                dirs.patch()
                factors = make_key_factors(cfg, self._compiler_hash(), gm, fake_args, traced)
        if saved is not None:
            saved["factors"] = factors.as_dict()
        root = cfg.resolved_cache_dir()
        miss_explanation = None
        if not CacheLayout(root).model_dir(factors.key, model_tag).is_dir():
            miss_explanation = self._explain_new_key(root, model_tag, factors)
            if cfg.require_cache_hit:
                raise CacheMissError(
                    errno.ENOENT,
                    f"require_cache_hit: no cache for model tag {model_tag!r} under "
                    f"key {factors.key[:16]}; {miss_explanation}",
                    str(root),
                )
        model = open_model_cache(cfg, factors.key, model_tag, factors.as_dict())
        return OpenedCache(factors, model, miss_explanation)

    def _explain_new_key(self, root: Path, model_tag: str, factors: KeyFactors) -> str:
        """Why this key is new: the factors that differ from the nearest
        cached key of the same model tag (logged once per graph)."""
        from fxpiece.cache.explain import nearest_sibling

        first = model_tag not in self._tags_seen
        self._tags_seen.add(model_tag)
        found = nearest_sibling(root, model_tag, factors.as_dict(), exclude_key=factors.key)
        if found is None:
            return f"no other key is cached for model tag {model_tag!r}"
        folder, diff = found
        text = f"nearest cached key {folder.parent.name[:16]} differs: {diff.summary()}"
        # A model's 2nd, 3rd... Dynamo graph is new to the cache by nature:
        # say so only when a cached key of this very graph differs.
        if first or diff.graph is None:
            _log.warning("fxpiece: cache miss for model tag %r: %s", model_tag, text)
        return text
