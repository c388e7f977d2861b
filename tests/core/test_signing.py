"""Signatures (fxpiece.signing, fxpiece._native's Ed25519): round trips,
tampering, trust and revocation, the key file's safety, racing creation,
and the ``fxpiece key`` commands. Torch-free."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import pytest

from fxpiece import _native, signing
from fxpiece.cli import main
from fxpiece.errors import (
    BadSignatureError,
    ConfigError,
    KeyFileError,
    RevokedSignerError,
    SignatureError,
    UntrustedSignerError,
)
from fxpiece.hashing import hash_factors
from fxpiece.signing import PublicKey, Signature, TrustedKeys

NOBODY = 65534
needs_setpriv = pytest.mark.skipif(
    os.getuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to act as another uid",
)


@pytest.fixture(autouse=True)
def key_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test's key, trusted-keys file and config folder under tmp_path
    (never the user's ~/.config)."""
    config = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    monkeypatch.delenv(signing.KEY_FILE_ENV, raising=False)
    monkeypatch.delenv(signing.TRUSTED_KEYS_FILE_ENV, raising=False)
    monkeypatch.delenv(signing.TRUSTED_KEYS_ENV, raising=False)
    return config / "fxpiece"


def other_key(tmp_path: Path, name: str = "other") -> signing.BuilderKey:
    return signing.new_key(tmp_path / name / "key")


PAYLOAD = b"compiled piece \x00\xff" * 1000


# -- round trip and the signed message ------------------------------------------


def test_round_trip_with_the_key_made_on_first_use(key_env: Path) -> None:
    assert not (key_env / "key").exists()
    sig = signing.sign("artifact", PAYLOAD)
    key = signing.load_key()
    assert key.path == key_env / "key"
    assert sig.signer == key.public
    trusted = signing.trusted_keys()  # your own key, trusted by default
    assert trusted.trusts(key.public)
    assert signing.verify("artifact", PAYLOAD, sig, trusted) == key.public
    # Any buffer, not copied; the text form round-trips.
    assert signing.verify("artifact", bytearray(PAYLOAD), sig.text(), trusted) == key.public
    assert signing.verify("artifact", memoryview(PAYLOAD), str(sig), trusted) == key.public
    assert Signature.parse(sig.text()) == sig
    # Deterministic (Ed25519): the same key, kind and payload sign the same.
    assert signing.sign("artifact", PAYLOAD) == sig


def test_the_signed_digest_is_the_artifact_checksum() -> None:
    """An artifact header's blake3= (hash_factors of the payload) is the digest
    that is signed: verifying by it needs no second pass over the payload."""
    checksum = hash_factors(PAYLOAD)
    assert _native.payload_digest(PAYLOAD) == bytes.fromhex(checksum)
    assert _native.signed_message("artifact", bytes.fromhex(checksum)) == (
        b"fxpiece-sig-v1\0artifact\0" + bytes.fromhex(checksum)
    )
    key = signing.builder_key()
    sig = signing.sign("artifact", PAYLOAD, key=key)
    assert signing.sign_digest("artifact", checksum, key=key) == sig
    trusted = TrustedKeys(frozenset({key.public}))
    assert signing.verify_digest("artifact", checksum, sig, trusted) == key.public
    assert signing.verify_digest("artifact", bytes.fromhex(checksum), sig, trusted) == key.public
    with pytest.raises(BadSignatureError):
        signing.verify_digest("artifact", hash_factors(PAYLOAD + b"x"), sig, trusted)


def test_signature_text_fits_a_header_line_and_json() -> None:
    sig = signing.sign("index-entry", b"{}")
    text = sig.text()
    assert len(text) == 138
    assert text.startswith("ed25519:") and text.count(":") == 2
    assert all(c.isalnum() or c in ":_-" for c in text), text
    header = b"FXPIECE-ARTIFACT v2 digest=ab blake3=cd len=2 sig=%s\n" % text.encode()
    assert Signature.parse(header.split(b"sig=")[1].strip().decode()) == sig
    assert Signature.parse(json.loads(json.dumps({"sig": text}))["sig"]) == sig
    assert PublicKey.parse(str(sig.signer)) == sig.signer
    assert PublicKey.parse("ed25519:" + sig.signer.raw.hex()) == sig.signer


def test_large_payload_is_not_copied() -> None:
    key = signing.builder_key()
    payload = bytearray(os.urandom(1 << 20)) * 32  # 32 MiB
    tracemalloc.start()
    try:
        sig = key.sign("artifact", payload)
        trusted = TrustedKeys(frozenset({key.public}))
        signing.verify("artifact", memoryview(payload), sig, trusted)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak


# -- tampering ----------------------------------------------------------------------


def test_tampered_payload_kind_or_signature_is_refused() -> None:
    key = signing.builder_key()
    trusted = signing.trusted_keys()
    sig = key.sign("artifact", PAYLOAD)
    tampered = bytearray(PAYLOAD)
    tampered[len(PAYLOAD) // 2] ^= 1
    for payload in (bytes(tampered), PAYLOAD[:-1], PAYLOAD + b"\0", b""):
        with pytest.raises(BadSignatureError, match="changed after signing"):
            signing.verify("artifact", payload, sig, trusted)
    # The same bytes as another kind of object.
    with pytest.raises(BadSignatureError):
        signing.verify("kernel-bundle", PAYLOAD, sig, trusted)
    # Any flipped bit of the signature.
    for i in (0, 31, 32, 63):
        value = bytearray(sig.value)
        value[i] ^= 0x10
        with pytest.raises(BadSignatureError):
            signing.verify("artifact", PAYLOAD, Signature(sig.signer, bytes(value)), trusted)
    # Another trusted signer's name put on this signature.
    other = signing.new_key(key.path.parent / "other-key")
    both = trusted.with_keys([other.public])
    with pytest.raises(BadSignatureError):
        signing.verify("artifact", PAYLOAD, Signature(other.public, sig.value), both)
    # Malformed text: typed, never a crash.
    text = sig.text()
    for bad in ("", "ed25519:", text[:-1], text + "A", text.replace(":", ";"), "rsa" + text[7:]):
        with pytest.raises(BadSignatureError):
            signing.verify("artifact", PAYLOAD, bad, trusted)
    # Every refusal is a SignatureError (ValueError).
    assert issubclass(BadSignatureError, SignatureError)
    assert issubclass(SignatureError, ValueError)


def test_kinds_are_checked() -> None:
    key = signing.builder_key()
    for kind in ("", "Artifact", "-x", "a b", "a\0b", "a" * 65):
        with pytest.raises(ValueError):
            key.sign(kind, b"p")
    assert key.sign("a" * 64, b"p")
    for kind in signing.KINDS:
        assert key.sign(kind, b"p") != key.sign("artifact", b"p") or kind == "artifact"


# -- trust and revocation -----------------------------------------------------------


def test_untrusted_signer_is_refused(tmp_path: Path) -> None:
    signing.builder_key()
    stranger = other_key(tmp_path, "stranger")
    sig = stranger.sign("artifact", PAYLOAD)  # valid, by a key nobody trusted
    with pytest.raises(UntrustedSignerError) as e:
        signing.verify("artifact", PAYLOAD, sig, signing.trusted_keys())
    assert not isinstance(e.value, RevokedSignerError)
    assert e.value.signer == str(stranger.public)
    with pytest.raises(UntrustedSignerError):
        signing.verify("artifact", PAYLOAD, sig, TrustedKeys())
    # Trusted by the environment or by the trusted-keys file: accepted.
    env = {"XDG_CONFIG_HOME": os.environ["XDG_CONFIG_HOME"]}
    env[signing.TRUSTED_KEYS_ENV] = f" {stranger.public} ,"
    assert signing.verify("artifact", PAYLOAD, sig, signing.trusted_keys(env)) == stranger.public
    assert signing.trust_key(stranger.public, label="ci builder")
    assert not signing.trust_key(stranger.public)  # already there: no second line
    assert signing.verify("artifact", PAYLOAD, sig, signing.trusted_keys()) == stranger.public
    lines = signing.trusted_keys_file().read_text().splitlines()
    assert f"{stranger.public}  ci builder" in lines
    assert sum(str(stranger.public) in ln for ln in lines) == 1


def test_revoked_key_is_refused_even_your_own(tmp_path: Path) -> None:
    own = signing.builder_key()
    friend = other_key(tmp_path, "friend")
    signing.trust_key(friend.public)
    own_sig = own.sign("aot-entry", PAYLOAD)
    friend_sig = friend.sign("aot-entry", PAYLOAD)
    trusted = signing.trusted_keys()
    for sig in (own_sig, friend_sig):
        signing.verify("aot-entry", PAYLOAD, sig, trusted)

    assert signing.revoke_key(friend.public, label="left the team")
    trusted = signing.trusted_keys()
    assert not trusted.trusts(friend.public)
    with pytest.raises(RevokedSignerError, match="revoked"):
        signing.verify("aot-entry", PAYLOAD, friend_sig, trusted)
    # The trust line was replaced, not kept beside the revocation.
    text = signing.trusted_keys_file().read_text()
    assert f"revoked {friend.public}  left the team" in text.splitlines()
    assert text.count(str(friend.public)) == 1

    # Your own key, and a key the environment trusts, lose to a revocation.
    signing.revoke_key(own.public)
    env = dict(os.environ)
    env[signing.TRUSTED_KEYS_ENV] = f"{own.public},{friend.public}"
    for t in (signing.trusted_keys(), signing.trusted_keys(env)):
        for sig in (own_sig, friend_sig):
            with pytest.raises(RevokedSignerError):
                signing.verify("aot-entry", PAYLOAD, sig, t)
    # Revoked in the environment (a leading '-').
    signing.trust_key(friend.public)
    env[signing.TRUSTED_KEYS_ENV] = f"-{friend.public}"
    with pytest.raises(RevokedSignerError):
        signing.verify("aot-entry", PAYLOAD, friend_sig, signing.trusted_keys(env))
    assert signing.verify("aot-entry", PAYLOAD, friend_sig, signing.trusted_keys()) == (
        friend.public
    )


def test_own_key_is_not_made_by_reading_the_trusted_keys(key_env: Path) -> None:
    assert signing.trusted_keys() == TrustedKeys()
    assert not key_env.exists()
    assert signing.trusted_keys(own=False).keys == frozenset()


def test_malformed_trusted_keys_are_config_errors(tmp_path: Path) -> None:
    env = dict(os.environ)
    env[signing.TRUSTED_KEYS_ENV] = "ed25519:nope"
    with pytest.raises(ConfigError, match=signing.TRUSTED_KEYS_ENV):
        signing.trusted_keys(env)
    # A small-order point is no key.
    env[signing.TRUSTED_KEYS_ENV] = "ed25519:" + (b"\x01" + bytes(31)).hex()
    with pytest.raises(ConfigError, match="not a usable Ed25519 key"):
        signing.trusted_keys(env)
    path = signing.trusted_keys_file()
    path.parent.mkdir(parents=True, mode=0o700)
    path.write_text("# ok\n\nrevoked\n")
    with pytest.raises(ConfigError, match=f"{path}:3"):
        signing.trusted_keys()


# -- the key file ----------------------------------------------------------------------


def test_key_file_is_private_and_made_whole(key_env: Path) -> None:
    old = os.umask(0)
    try:
        key = signing.builder_key()
    finally:
        os.umask(old)
    assert (key_env.stat().st_mode & 0o777) == 0o700
    st = os.lstat(key.path)
    assert (st.st_mode & 0o777) == 0o600 and st.st_uid == os.geteuid()
    assert sorted(os.listdir(key_env)) == ["key"]  # no temp file left
    assert key.path.read_bytes().startswith(b"fxpiece-key v1 ed25519 ")
    assert signing.load_key().public == key.public
    assert signing.builder_key().public == key.public


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_key_readable_by_others_is_refused(mode: int) -> None:
    key = signing.builder_key()
    key.path.chmod(mode)
    for load in (signing.load_key, signing.builder_key, lambda: signing.sign("artifact", b"x")):
        with pytest.raises(KeyFileError, match="readable by group or others") as e:
            load()
        assert e.value.filename == str(key.path)
        assert e.value.errno == errno.EPERM
    # Not repaired behind the user's back, not replaced.
    assert (key.path.stat().st_mode & 0o777) == mode
    key.path.chmod(0o600)
    assert signing.load_key().public == key.public


def test_key_symlink_is_refused(key_env: Path, tmp_path: Path) -> None:
    real = other_key(tmp_path, "real")  # a good 0600 key, elsewhere
    key_env.mkdir(parents=True, mode=0o700)
    (key_env / "key").symlink_to(real.path)
    with pytest.raises(KeyFileError, match="symlink") as e:
        signing.builder_key()
    assert e.value.errno == errno.ELOOP
    with pytest.raises(KeyFileError, match="symlink"):
        signing.sign("artifact", b"x")
    assert (key_env / "key").is_symlink()  # left as it was, not followed or replaced
    # A dangling symlink is not "no key yet" either: nothing is created through it.
    target = tmp_path / "elsewhere" / "key"
    (key_env / "key").unlink()
    (key_env / "key").symlink_to(target)
    with pytest.raises(KeyFileError):
        signing.builder_key()
    assert not target.exists()


def test_key_folder_writable_by_others_or_a_fifo_is_refused(key_env: Path) -> None:
    key = signing.builder_key()
    key_env.chmod(0o777)
    with pytest.raises(KeyFileError, match="writable by others"):
        signing.load_key()
    key_env.chmod(0o700)
    key.path.unlink()
    os.mkfifo(key.path, 0o600)
    t0 = time.monotonic()
    with pytest.raises(KeyFileError, match="not a regular file"):
        signing.builder_key()
    assert time.monotonic() - t0 < 5  # opened without blocking on a writer


def test_malformed_key_is_refused_not_replaced(key_env: Path) -> None:
    key_env.mkdir(parents=True, mode=0o700)
    path = key_env / "key"
    for data in (b"", b"fxpiece-key v1 ed25519 short\n", b"\xff" * 40, b"x" * 10000):
        path.write_bytes(data)
        path.chmod(0o600)
        with pytest.raises(KeyFileError):
            signing.builder_key()
        assert path.read_bytes() == data


def test_key_new_refuses_to_overwrite_without_force() -> None:
    first = signing.new_key()
    with pytest.raises(FileExistsError):
        signing.new_key()
    assert signing.load_key().public == first.public
    second = signing.new_key(force=True)
    assert second.public != first.public
    assert signing.load_key().public == second.public
    assert (second.path.stat().st_mode & 0o777) == 0o600
    # What the replaced key signed is no longer trusted by default.
    sig = first.sign("artifact", b"x")
    with pytest.raises(UntrustedSignerError):
        signing.verify("artifact", b"x", sig, signing.trusted_keys())


def test_the_loser_of_a_creation_race_takes_the_winners_key(
    key_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deterministic race: another process links its key in between this
    one's finding no key and linking its own."""
    real_write = signing._write_temp
    winner: list[signing.BuilderKey] = []

    def write_then_lose(folder: Path, name: str, data: bytes, mode: int) -> Path:
        tmp = real_write(folder, name, data, mode)
        if not winner:
            monkeypatch.setattr(signing, "_write_temp", real_write)
            winner.append(signing.new_key(folder / name))
        return tmp

    monkeypatch.setattr(signing, "_write_temp", write_then_lose)
    key = signing.builder_key()
    assert winner and key.public == winner[0].public
    assert signing.load_key().public == winner[0].public
    assert sorted(os.listdir(key_env)) == ["key"]


RACER = """
import sys, time
from pathlib import Path
from fxpiece.signing import builder_key
start = float(sys.argv[2])
while time.time() < start:
    pass
print(builder_key(Path(sys.argv[1])).public, flush=True)
"""


def test_processes_racing_to_make_the_key_end_with_one_key(tmp_path: Path) -> None:
    for round_ in range(3):
        path = tmp_path / f"round{round_}" / "fxpiece" / "key"
        start = time.time() + 2.0
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", RACER, str(path), repr(start)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(4)
        ]
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
            outs.append(out.strip())
        assert len(set(outs)) == 1, outs
        assert outs[0] == str(signing.load_key(path).public)
        assert sorted(os.listdir(path.parent)) == ["key"]


@needs_setpriv
def test_key_owned_by_another_user_is_refused(key_env: Path) -> None:
    """Another uid makes a key with fxpiece itself (setpriv); moved into our
    own private folder it is still refused: we sign only with our own key."""
    base = Path(tempfile.mkdtemp(prefix="fxpiece-nobody-", dir="/tmp"))
    base.chmod(0o755)  # nobody may pass through to its own folder
    theirs = base / "home"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    try:
        _key_owned_by_nobody_is_refused(theirs, key_env)
    finally:
        shutil.rmtree(base)


def _key_owned_by_nobody_is_refused(theirs: Path, key_env: Path) -> None:
    code = (
        "from pathlib import Path\nfrom fxpiece.signing import new_key\n"
        f"print(new_key(Path({str(theirs / 'key')!r})).public)"
    )
    out = subprocess.run(
        [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            sys.executable,
            "-c",
            code,
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HOME": str(theirs)},
    )
    their_public = out.stdout.strip()
    assert os.stat(theirs / "key").st_uid == NOBODY
    key_env.mkdir(parents=True, mode=0o700)
    os.rename(theirs / "key", key_env / "key")  # ownership stays nobody's
    with pytest.raises(KeyFileError, match=f"owned by uid {NOBODY}") as e:
        signing.builder_key()
    assert e.value.errno == errno.EPERM
    with pytest.raises(KeyFileError):
        signing.trusted_keys()  # an unsafe own key is an error, not skipped
    assert str(signing.PublicKey.parse(their_public)) == their_public
    # Its trusted-keys file is refused the same way (nobody could add keys).
    (key_env / "key").unlink()
    tk = signing.trusted_keys_file()
    tk.write_text(f"{their_public}\n")
    os.chown(tk, NOBODY, NOBODY)
    with pytest.raises(KeyFileError, match=f"owned by uid {NOBODY}"):
        signing.trusted_keys()


def test_trusted_keys_file_others_can_write_is_refused() -> None:
    signing.trust_key(other_key(Path(os.environ["XDG_CONFIG_HOME"]).parent).public)
    path = signing.trusted_keys_file()
    path.chmod(0o666)
    with pytest.raises(KeyFileError, match="writable by others"):
        signing.trusted_keys()
    path.chmod(0o644)
    assert len(signing.trusted_keys().keys) == 1


TRUSTER = """
import sys, time
from fxpiece.signing import PublicKey, trust_key
start = float(sys.argv[2])
while time.time() < start:
    pass
trust_key(PublicKey.parse(sys.argv[1]))
"""


def test_concurrent_trust_edits_lose_no_key(tmp_path: Path) -> None:
    keys = [other_key(tmp_path, f"k{i}").public for i in range(4)]
    start = time.time() + 2.0
    procs = [subprocess.Popen([sys.executable, "-c", TRUSTER, str(k), repr(start)]) for k in keys]
    assert [p.wait(timeout=60) for p in procs] == [0] * 4
    assert signing.trusted_keys().keys == frozenset(keys)


# -- the command line ---------------------------------------------------------------------


def test_cli_key_new_show_trust_revoke(
    key_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["key", "show", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["public_key"] is None and not (key_env / "key").exists()

    assert main(["key", "new", "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert made["key_file"] == str(key_env / "key")
    assert made["public_key"] == str(signing.load_key().public)

    assert main(["key", "new"]) == 1
    assert "--force" in capsys.readouterr().err
    assert str(signing.load_key().public) == made["public_key"]

    friend = str(other_key(tmp_path, "friend").public)
    assert main(["key", "trust", friend, "--label", "ci"]) == 0
    assert "trusted" in capsys.readouterr().out
    assert main(["key", "trust", friend]) == 0
    assert "already trusted" in capsys.readouterr().out
    assert main(["key", "revoke", made["public_key"]]) == 0
    capsys.readouterr()
    assert main(["key", "show", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["public_key"] == made["public_key"]
    assert shown["trusted"] == [friend]
    assert shown["revoked"] == [made["public_key"]]
    assert main(["key", "show"]) == 0
    out = capsys.readouterr().out
    assert "(yours, REVOKED)" in out and friend in out

    with pytest.raises(SystemExit) as e:
        main(["key", "trust", "ed25519:not-a-key"])
    assert e.value.code == 2
    assert "not a public key" in capsys.readouterr().err

    assert main(["key", "new", "--force"]) == 0
    assert str(signing.load_key().public) != made["public_key"]
