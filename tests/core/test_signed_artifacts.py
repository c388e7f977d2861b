"""Signed artifacts (``FXPIECE-ARTIFACT v3 ... sig=``): what the store,
``cache unpack``, ``cache verify`` and ``cache ls`` accept and refuse.
Torch-free; the other builders are real processes with keys of their own.

The session's own key lives under the XDG_CONFIG_HOME tests/conftest.py
sets; each test here gets a config folder of its own (``keys``)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from fxpiece import signing
from fxpiece.cache.admin import list_cache, pack_cache, unpack_cache, verify_cache
from fxpiece.cache.admin.manifest import ArchiveError
from fxpiece.cache.layout import CacheLayout
from fxpiece.cache.model import ModelCache
from fxpiece.cache.store import (
    _HEAD_MAX,
    ArtifactSignatureError,
    ArtifactStore,
    checksum,
    decode_artifact,
    encode_artifact,
)
from fxpiece.cache.trust import ensure_private_dir
from fxpiece.errors import CorruptArtifactError
from fxpiece.signing import KeyRing, PublicKey

A, B = "ab" * 32, "cd" * 32
CLI = [sys.executable, "-m", "fxpiece"]


@pytest.fixture(autouse=True)
def keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own config folder (its builder key is made on first write)."""
    config = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    for name in (signing.KEY_FILE_ENV, signing.TRUSTED_KEYS_ENV, signing.TRUSTED_KEYS_FILE_ENV):
        monkeypatch.delenv(name, raising=False)
    return config / "fxpiece"


def root(tmp_path: Path) -> CacheLayout:
    return CacheLayout(ensure_private_dir(tmp_path / "root"))


def evil_payload(marker: Path) -> bytes:
    """A pickle that writes ``marker`` if anything ever unpickles it."""

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (exec, (f"open({str(marker)!r}, 'w').write('pwned')",))

    return pickle.dumps(Evil())


def write_as_other_builder(tmp_path: Path, path: Path, digest: str, payload: bytes) -> str:
    """Another builder (a process with its own key, trusted by nobody here)
    writes a valid, signed artifact of ``payload`` for ``digest`` at
    ``path``; its public key."""
    key_file = tmp_path / "other-builder" / "key"
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from fxpiece.cache.store import encode_artifact\n"
        "from fxpiece.signing import builder_key\n"
        "k = builder_key()\n"
        "data = encode_artifact(Path(sys.argv[2]).read_bytes(), sys.argv[1], key=k)\n"
        "p = Path(sys.argv[3]); p.parent.mkdir(parents=True, exist_ok=True)\n"
        "p.write_bytes(data)\n"
        "print(k.public)\n"
    )
    src = tmp_path / "other-payload"
    src.write_bytes(payload)
    env = {**os.environ, signing.KEY_FILE_ENV: str(key_file)}
    out = subprocess.run(
        [sys.executable, "-c", code, digest, str(src), str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip()


# -- the header ---------------------------------------------------------------------


def test_put_writes_v3_signed_by_the_builder_key(tmp_path: Path, keys: Path) -> None:
    lay = root(tmp_path)
    store = ArtifactStore(lay)
    handle = store.put(A, b"code of A")
    data = lay.artifact_path(A).read_bytes()
    own = signing.load_key(keys / "key").public
    assert data.startswith(b"FXPIECE-ARTIFACT v3 digest=%s blake3=" % A.encode())
    assert b" sig=%s:" % str(own).encode() in data.split(b"\n", 1)[0]
    art = decode_artifact(data, "x", A, trusted=signing.trusted_keys(), unsigned_ok=False)
    assert art.signer == own and art.payload == b"code of A"
    assert store.load(handle) == b"code of A"
    # The longest header (128-hex digest, 20-digit length) fits what a read looks at.
    longest = encode_artifact(b"", "f" * 128, key=signing.load_key(keys / "key"))
    assert len(longest.split(b"\n", 1)[0]) + 1 <= _HEAD_MAX


def test_put_decoded_keeps_the_signer_and_put_not_durable_writes_the_same_file(
    tmp_path: Path, keys: Path
) -> None:
    lay = root(tmp_path)
    store = ArtifactStore(lay)
    store.put(A, b"code of A")
    signed = lay.artifact_path(A).read_bytes()
    # Another root stores it as decoded (what the remote tier pulls), no fsync.
    other = CacheLayout(ensure_private_dir(tmp_path / "other"))
    theirs = ArtifactStore(other)
    art = decode_artifact(signed, "x", A, trusted=theirs.trusted_keys(), unsigned_ok=False)
    handle = theirs.put_decoded(art, durable=False)
    assert other.artifact_path(A).read_bytes() == signed
    assert theirs.load(handle) == b"code of A"
    # Not durable is the same file as durable.
    third = ArtifactStore(CacheLayout(ensure_private_dir(tmp_path / "third")))
    third.put(B, b"code of B", durable=False)
    fourth = ArtifactStore(CacheLayout(ensure_private_dir(tmp_path / "fourth")))
    fourth.put(B, b"code of B")
    same = [s.layout.artifact_path(B).read_bytes().split(b"\n", 1)[1] for s in (third, fourth)]
    assert same == [b"code of B"] * 2
    # Unsigned (v2) or unbound (v1) bytes are never stored as decoded.
    for legacy in (encode_artifact(b"code of B", B), encode_artifact(b"code of B")):
        with pytest.raises(CorruptArtifactError, match="unsigned or unbound"):
            theirs.put_decoded(decode_artifact(legacy, "x"))
    assert not other.artifact_path(B).exists()


def test_signature_binds_the_digest_length_and_payload(tmp_path: Path) -> None:
    lay = root(tmp_path)
    store = ArtifactStore(lay)
    store.put(A, b"code of A")
    signed = lay.artifact_path(A).read_bytes()
    trusted = signing.trusted_keys()
    # Copied to another digest's path: refused by the path binding.
    with pytest.raises(CorruptArtifactError, match="written for"):
        decode_artifact(signed, "x", B, trusted=trusted)
    # ...and with the header's digest rewritten to match: the signature fails.
    moved = signed.replace(A.encode(), B.encode(), 1)
    with pytest.raises(ArtifactSignatureError, match="bad signature"):
        decode_artifact(moved, "x", B, trusted=trusted)
    # A new payload with a valid checksum under the old signature: fails too.
    head, _ = signed.split(b"\n", 1)
    forged = head.replace(checksum(b"code of A").encode(), checksum(b"code of X").encode())
    with pytest.raises(ArtifactSignatureError, match="bad signature"):
        decode_artifact(forged + b"\ncode of X", "x", A, trusted=trusted)
    # Through the store: the copy is moved aside, never loaded.
    lay.artifact_path(B).parent.mkdir(mode=0o700, exist_ok=True)
    lay.artifact_path(B).write_bytes(moved)
    assert store.lookup(B) == (None, True)
    assert not lay.artifact_path(B).exists()


# -- who is trusted -----------------------------------------------------------------------


def test_artifact_by_an_untrusted_builder_is_refused_moved_aside_and_never_unpickled(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lay = root(tmp_path)
    mc = ModelCache(lay, "ef" * 32, "backbone")
    handle = mc.artifacts.put(A, b"what was compiled")
    mc.index.insert((1, 8, 0, "inductor"), {"digest": A, "handle": handle})
    marker = tmp_path / "pwned"
    evil = evil_payload(marker)
    path = lay.artifact_path(A)
    os.rename(path, tmp_path / "good-copy")
    other = write_as_other_builder(tmp_path, path, A, evil)
    # The planted file has a valid checksum and a valid signature: only the
    # signer is wrong. The handle records the planted checksum, so only the
    # signer check stands between it and a load.
    forged = {**handle, "blake3": checksum(evil), "size": len(evil)}
    mc.index.insert((1, 8, 0, "inductor"), {"digest": A, "handle": forged})
    assert mc.artifacts.load(forged) is None
    assert not marker.exists()
    assert "refused a cached artifact" in caplog.text and other in caplog.text
    assert not path.exists() and list(path.parent.glob(f"{A}.corrupt-*"))
    assert (1, 8, 0, "inductor") not in mc.index  # reported once: its entry went with it
    # Once the signer is trusted, the very same file loads.
    os.rename(next(path.parent.glob(f"{A}.corrupt-*")), path)
    trusting = ArtifactStore(
        lay, keys=KeyRing(trusted=signing.trusted_keys().with_keys([PublicKey.parse(other)]))
    )
    assert trusting.load(forged) == evil


def test_a_revoked_key_is_refused_by_env_and_by_the_trusted_keys_file(
    tmp_path: Path, keys: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lay = root(tmp_path)
    handle = ArtifactStore(lay).put(A, b"code of A")
    own = signing.load_key(keys / "key").public
    assert ArtifactStore(lay, readonly=True).load(handle) == b"code of A"
    monkeypatch.setenv(signing.TRUSTED_KEYS_ENV, f"-{own}")
    assert ArtifactStore(lay, readonly=True).load(handle) is None  # read-only: left in place
    monkeypatch.delenv(signing.TRUSTED_KEYS_ENV)
    assert ArtifactStore(lay, readonly=True).load(handle) == b"code of A"
    signing.revoke_key(own, label="test")
    assert ArtifactStore(lay).load(handle) is None
    assert not lay.artifact_path(A).exists()  # moved aside


def test_unsigned_v2_loads_from_an_own_root_only(tmp_path: Path) -> None:
    """A cache written before v3 (the previous main's v2 files) still hits
    from a root of your own; a shared root (allow_untrusted_cache) and
    accept_unsigned=False refuse it."""
    lay = root(tmp_path)
    path = lay.artifact_path(A)
    ensure_private_dir(path.parent)
    path.write_bytes(encode_artifact(b"old code", A))  # the v2 encoding, unsigned
    assert path.read_bytes().startswith(b"FXPIECE-ARTIFACT v2 digest=")
    handle = {"artifact": lay.artifact_rel(A), "blake3": checksum(b"old code"), "size": 8}
    assert ArtifactStore(lay).load(handle) == b"old code"
    assert ArtifactStore(lay).lookup(A)[0] == handle
    assert ArtifactStore(lay, readonly=True, trust=True).load(handle) is None
    assert ArtifactStore(lay, readonly=True, accept_unsigned=False).load(handle) is None
    assert path.exists()  # read-only stores move nothing
    assert ArtifactStore(lay, trust=True).load(handle) is None
    assert not path.exists()


def test_broken_trust_configuration_is_an_error_not_a_quarantine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fxpiece.errors import UntrustedCacheError

    lay = root(tmp_path)
    handle = ArtifactStore(lay).put(A, b"code of A")
    monkeypatch.setenv(signing.TRUSTED_KEYS_ENV, "ed25519:not-a-key")
    with pytest.raises(UntrustedCacheError, match="FXPIECE_TRUSTED_KEYS"):
        ArtifactStore(lay).load(handle)
    assert lay.artifact_path(A).exists()


# -- the admin commands -----------------------------------------------------------------------


def fx(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )


def other_cache(tmp_path: Path) -> tuple[Path, str]:
    """A cache root written entirely by another builder, and its key."""
    src = tmp_path / "theirs"
    lay = CacheLayout(ensure_private_dir(src))
    key = write_as_other_builder(tmp_path, lay.artifact_path(A), A, b"their code")
    return src, key


def test_unpack_refuses_an_unknown_signer_unless_trusted(tmp_path: Path) -> None:
    src, key = other_cache(tmp_path)
    arc = tmp_path / "theirs.tar.gz"
    pack_cache(src, arc)
    dst = tmp_path / "dst"
    proc = fx("cache", "unpack", arc, dst)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "not a trusted key" in proc.stderr and f"--trust {key}" in proc.stderr
    assert not (dst / "artifacts").exists()
    proc = fx("cache", "unpack", arc, dst, "--trust", key)
    assert proc.returncode == 0, proc.stderr
    assert f"signed by {key}: 1 artifact(s)" in proc.stdout
    assert f"fxpiece key trust {key}" in proc.stdout  # loads still refuse it: said so
    assert CacheLayout(dst).artifact_path(A).read_bytes().endswith(b"\ntheir code")
    # A key revoked stays refused, --trust or not.
    signing.revoke_key(PublicKey.parse(key))
    with pytest.raises(ArchiveError, match="revoked"):
        unpack_cache(arc, tmp_path / "dst2", extra_trust=[PublicKey.parse(key)])


def test_unpack_refuses_unsigned_artifacts(tmp_path: Path) -> None:
    src = tmp_path / "old"
    lay = CacheLayout(ensure_private_dir(src))
    ensure_private_dir(lay.artifact_path(A).parent)
    lay.artifact_path(A).write_bytes(encode_artifact(b"old code", A))
    arc = tmp_path / "old.tar"
    pack_cache(src, arc)
    with pytest.raises(ArchiveError, match="unsigned"):
        unpack_cache(arc, tmp_path / "dst")
    with tarfile.open(arc) as tar:  # it was packed: only unpack refuses it
        assert f"artifacts/{A[:2]}/{A}" in tar.getnames()
    assert not (tmp_path / "dst" / "artifacts").exists()


def test_verify_reports_untrusted_signers_and_ls_shows_signers(tmp_path: Path, keys: Path) -> None:
    lay = root(tmp_path)
    mc = ModelCache(lay, "ef" * 32, "backbone")
    mc.index.insert((1, 8, 0, "inductor"), {"digest": A, "handle": mc.artifacts.put(A, b"a")})
    payload = b"their code"
    key = write_as_other_builder(tmp_path, lay.artifact_path(B), B, payload)
    handle_b = {"artifact": lay.artifact_rel(B), "blake3": checksum(payload), "size": len(payload)}
    mc.index.insert((1, 8, 1, "inductor"), {"digest": B, "handle": handle_b})
    own = signing.load_key(keys / "key").public

    report = verify_cache(lay.root)
    assert not report.ok
    (problem,) = report.problems
    assert problem.artifact == lay.artifact_rel(B) and "not a trusted key" in problem.reason
    assert report.signers == ((own, 1),)
    proc = fx("cache", "verify", lay.root)
    assert proc.returncode == 1 and f"signed by: {own.short} (1)" in proc.stdout

    listing = list_cache(lay.root)
    (model,) = listing.models
    assert {e.piece: e.signer for e in model.entries} == {0: str(own), 1: key}
    assert set(model.signers) == {own.short, PublicKey.parse(key).short}
    proc = fx("cache", "ls", lay.root, "--json")
    entries = json.loads(proc.stdout)["models"][0]["entries"]
    assert {e["signer"] for e in entries} == {str(own), key}

    fixed = verify_cache(lay.root, repair=True)
    assert fixed.problems[0].moved_to is not None
    assert verify_cache(lay.root).ok
