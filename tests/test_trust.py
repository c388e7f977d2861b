"""Trust boundary: the cache must not let another user run code as us."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import fxpiece
from fxpiece.toy_llama import ToyLlama, ToyLlamaConfig


def _run(cache: Path, **kw: object) -> fxpiece.CompiledModel:
    m = ToyLlama(ToyLlamaConfig(num_layers=0)).eval()
    cm = fxpiece.compile(m, fxpiece.CompileConfig(compiler="eager", cache_dir=str(cache), **kw))
    with torch.no_grad():
        torch.testing.assert_close(cm(torch.arange(3)), m(torch.arange(3)))
    return cm


def test_cache_folders_are_private(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _run(cache)
    # Inductor never writes under the cache root (its folder is private and
    # temporary); every folder there is ours and 0700.
    ours = [p for p in cache.rglob("*") if p.is_dir()]
    assert not (cache / "inductor").exists()
    assert {p.name for p in ours} >= {"models", "index"}
    for d in [cache, *ours]:
        assert d.stat().st_mode & 0o077 == 0, f"{d} is {oct(d.stat().st_mode)}"


@pytest.mark.parametrize("where", ["root", "artifacts", "model"])
def test_group_or_world_writable_folder_is_refused(tmp_path: Path, where: str) -> None:
    cache = tmp_path / "cache"
    cm = _run(cache)
    folder = {
        "root": cache,
        "artifacts": cache / "artifacts",
        "model": cm.stats.graphs[0].cache_folder,
    }[where]
    assert folder is not None
    folder.mkdir(exist_ok=True)
    os.chmod(folder, 0o777)
    torch._dynamo.reset()
    with pytest.raises(fxpiece.UntrustedCacheError, match="writable by other users") as ei:
        _run(cache)
    assert isinstance(ei.value, OSError) and ei.value.filename == str(folder)
    # Explicitly allowed: it runs.
    torch._dynamo.reset()
    _run(cache, allow_untrusted_cache=True)


def test_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to give a folder to another user")
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    os.chown(cache, 12345, 12345)
    with pytest.raises(fxpiece.UntrustedCacheError, match="belongs to uid 12345"):
        _run(cache)


@pytest.mark.parametrize("tag", ["../x", "/abs", "a/b", ".hidden", "", "x" * 200])
def test_model_tag_cannot_escape_the_cache(tag: str) -> None:
    with pytest.raises(fxpiece.ConfigError, match="model_tag"):
        fxpiece.CompileConfig(model_tag=tag)
    with pytest.raises(fxpiece.ConfigError, match="model_tag"), fxpiece.set_model_tag(tag):
        pass


def test_handle_pointing_out_of_the_cache_is_not_followed(tmp_path: Path) -> None:
    from fxpiece.cache.layout import CacheLayout
    from fxpiece.cache.store import ArtifactStore, checksum, encode_artifact

    root = tmp_path / "root"
    store = ArtifactStore(CacheLayout(root))
    handle = store.put("ab" * 32, b"payload")
    assert store.load(handle) == b"payload"
    outside = tmp_path / "evil.bin"
    outside.write_bytes(encode_artifact(b"evil"))
    evil = {"artifact": "../evil.bin", "blake3": checksum(b"evil"), "size": 4}
    assert store.load(evil) is None
    # A symlink in place of the artifact is never followed (even to a valid file).
    link = root / "artifacts" / "cd" / ("cd" * 32)
    link.parent.mkdir(mode=0o700)
    link.symlink_to(outside)
    assert store.load({**evil, "artifact": f"artifacts/cd/{'cd' * 32}"}) is None
    assert not link.is_symlink(), "the symlink was moved aside"
