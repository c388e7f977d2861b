"""Operating the cache: the verbs behind ``fxpiece cache ...``.

Each returns data (frozen dataclasses with ``as_dict()`` for JSON) and
prints nothing; none imports torch. One module per verb, all starting from
the one scan of a root (:mod:`.scan`); every path comes from
:class:`~fxpiece.cache.layout.CacheLayout`.

=====================  ==================================================
:mod:`.scan`           the shared scan: models, index entries, artifacts
:mod:`.ls`             :func:`list_cache`
:mod:`.verify`         :func:`verify_cache` (``--repair``)
:mod:`.prune`          :func:`prune_cache`
:mod:`.archive`        :func:`pack_cache`, :func:`unpack_cache`
:mod:`.manifest`       the archive format and its checks
:mod:`.place`          moving unpacked files into place, all or none
=====================  ==================================================
"""

from fxpiece.cache.admin.archive import PackResult, UnpackResult, pack_cache, unpack_cache
from fxpiece.cache.admin.ls import CacheListing, EntryInfo, ModelInfo, list_cache
from fxpiece.cache.admin.manifest import PACK_FORMAT, PACK_VERSION, ArchiveError
from fxpiece.cache.admin.prune import PruneItem, PruneResult, prune_cache
from fxpiece.cache.admin.scan import ArtifactFile, IndexCheck
from fxpiece.cache.admin.verify import ArtifactProblem, CacheVerifyReport, verify_cache

__all__ = [
    "PACK_FORMAT",
    "PACK_VERSION",
    "ArchiveError",
    "ArtifactFile",
    "ArtifactProblem",
    "CacheListing",
    "CacheVerifyReport",
    "EntryInfo",
    "IndexCheck",
    "ModelInfo",
    "PackResult",
    "PruneItem",
    "PruneResult",
    "UnpackResult",
    "list_cache",
    "pack_cache",
    "prune_cache",
    "unpack_cache",
    "verify_cache",
]
