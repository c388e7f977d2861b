"""Signatures: who built what the cache holds (provenance, not only integrity).

Every builder has an Ed25519 key, made on first use (:func:`builder_key`) at
``$FXPIECE_KEY_FILE``, else ``$XDG_CONFIG_HOME/fxpiece/key``, else
``~/.config/fxpiece/key``: a 0600 file in a 0700 folder, created atomically
(written whole to a private temp file, then linked into place without
replacing anything: two processes racing both end with the one key that won).
A key file that is a symlink, is not a regular file, is owned by another user
or is readable by group or others is refused (:class:`~fxpiece.errors.
KeyFileError`), never used or repaired.

What is signed is a domain-separated message over the payload's checksum
(see ``rust/src/sign.rs``)::

    b"fxpiece-sig-v1\\0" + kind + b"\\0" + digest

``kind`` says what the payload is (``artifact``, ``kernel-bundle``,
``aot-entry``, ``index-entry``: 1-64 of ``[a-z0-9._-]``), ``digest`` is the
32 raw bytes of the payload's fxpiece checksum (``hash_factors(payload)``,
exactly the ``blake3=<hex>`` an artifact header records), hashed natively
over the caller's buffer with the GIL released: signing a large artifact
never copies it, and a reader that has checked an artifact's checksum
verifies its signature by that checksum alone (:func:`verify_digest`).

Text forms (no spaces, ``=`` or ``/``: fit for a header line, a JSON string,
an environment variable):

- a public key: ``ed25519:<43 characters of unpadded base64url>`` (the 32
  raw bytes; ``ed25519:<64 hex digits>`` is accepted too);
- a signature: ``ed25519:<public key, 43>:<signature, 86>``
  (:meth:`Signature.text`, 138 characters), the signer travels with it.

Which signers are trusted (:class:`TrustedKeys`, :func:`trusted_keys`): your
own key (when its file exists), every key in ``FXPIECE_TRUSTED_KEYS``
(comma-separated public keys; ``-ed25519:...`` revokes one) and every line
of the trusted-keys file (``$FXPIECE_TRUSTED_KEYS_FILE``, else
``<config>/fxpiece/trusted_keys``)::

    # comments and blank lines are ignored; text after a key is a label
    ed25519:0b5S...   ci-builder
    revoked ed25519:Q9x...   laptop stolen 2026-11-02

A revoked key is refused everywhere, even your own (revocation wins over
trust). The trusted-keys file must be a regular file owned by you or root
that nobody else can write (else :class:`~fxpiece.errors.KeyFileError`);
``fxpiece key trust KEY`` / ``fxpiece key revoke KEY`` rewrite it
atomically under a lock.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import fcntl
import os
import re
import secrets
import stat
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fxpiece import _native
from fxpiece.errors import (
    BadSignatureError,
    ConfigError,
    KeyFileError,
    RevokedSignerError,
    UntrustedSignerError,
)

__all__ = [
    "ALGORITHM",
    "KEY_FILE_ENV",
    "KINDS",
    "TRUSTED_KEYS_ENV",
    "TRUSTED_KEYS_FILE_ENV",
    "BuilderKey",
    "KeyRing",
    "PublicKey",
    "Signature",
    "TrustedKeys",
    "builder_key",
    "config_dir",
    "key_file",
    "load_key",
    "new_key",
    "revoke_key",
    "sign",
    "sign_digest",
    "trust_key",
    "trusted_keys",
    "trusted_keys_file",
    "verify",
    "verify_digest",
]

ALGORITHM = "ed25519"
KEY_FILE_ENV = "FXPIECE_KEY_FILE"
TRUSTED_KEYS_ENV = "FXPIECE_TRUSTED_KEYS"
TRUSTED_KEYS_FILE_ENV = "FXPIECE_TRUSTED_KEYS_FILE"
KINDS = ("artifact", "kernel-bundle", "aot-entry", "index-entry")
"""The kinds the cache signs (any ``[a-z0-9][a-z0-9._-]{0,63}`` is accepted)."""

_KIND = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}", re.ASCII)
_B64_32 = r"[A-Za-z0-9_-]{43}"
_PUBLIC = re.compile(rf"ed25519:({_B64_32}|[0-9A-Fa-f]{{64}})", re.ASCII)
_SIGNATURE = re.compile(rf"ed25519:({_B64_32}):([A-Za-z0-9_-]{{86}})", re.ASCII)
_KEY_MAGIC = "fxpiece-key v1 ed25519 "
_KEY_LINE = re.compile(rf"fxpiece-key v1 ed25519 ({_B64_32})\n?", re.ASCII)
_MAX_KEY_FILE = 4096
_MAX_TRUSTED_FILE = 1 << 20
_TRUSTED_HEADER = (
    "# fxpiece trusted signing keys: one public key a line (text after it is a\n"
    "# label); 'revoked <key>' refuses a key everywhere, even your own.\n"
)


# -- text forms ---------------------------------------------------------------


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _unb64(text: str, size: int) -> bytes | None:
    """The bytes of canonical unpadded base64url ``text``, or None."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) == size and _b64(raw) == text else None


@dataclass(frozen=True, slots=True, order=True, repr=False)
class PublicKey:
    """An Ed25519 public key (32 bytes, a valid point not of small order)."""

    raw: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.raw, bytes):
            raise TypeError(f"a public key is bytes, not {type(self.raw).__name__}")
        _native.check_public_key(self.raw)  # ValueError: length, no point, small order

    @classmethod
    def parse(cls, text: str, where: str = "public key") -> PublicKey:
        """From ``ed25519:<base64url>`` (or ``ed25519:<hex>``); a
        :class:`~fxpiece.errors.ConfigError` naming ``where`` otherwise."""
        m = _PUBLIC.fullmatch(text.strip())
        raw = None
        if m:
            body = m.group(1)
            raw = bytes.fromhex(body) if len(body) == 64 else _unb64(body, 32)
        if raw is None:
            shown = text if len(text) <= 60 else text[:57] + "..."
            raise ConfigError(
                where,
                f"{shown!r} is not a public key; write ed25519:<43 base64url characters> "
                "(as `fxpiece key show` prints it)",
            )
        try:
            return cls(raw)
        except ValueError as e:
            raise ConfigError(where, f"{text!r} is not a usable Ed25519 key: {e}") from None

    def __str__(self) -> str:
        return f"{ALGORITHM}:{_b64(self.raw)}"

    def __repr__(self) -> str:
        return f"PublicKey({str(self)!r})"

    @property
    def short(self) -> str:
        """A short form for listings (``ed25519:AbCdEfGh12..``): not for trust."""
        return str(self)[:20] + ".."


@dataclass(frozen=True, slots=True)
class Signature:
    """A signature together with its signer's public key.

    ``text()`` / :meth:`parse` give the compact form
    ``ed25519:<public key>:<signature>`` (base64url, 138 characters) to embed
    in a header line (``sig=<text>``) or a JSON string.
    """

    signer: PublicKey
    value: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.value, bytes) or len(self.value) != 64:
            raise BadSignatureError("an Ed25519 signature is 64 bytes")

    def text(self) -> str:
        return f"{self.signer}:{_b64(self.value)}"

    def __str__(self) -> str:
        return self.text()

    @classmethod
    def parse(cls, text: str) -> Signature:
        """From :meth:`text`; :class:`~fxpiece.errors.BadSignatureError` for
        anything else (including a signer that is no usable key)."""
        m = _SIGNATURE.fullmatch(text) if isinstance(text, str) else None
        pk = _unb64(m.group(1), 32) if m else None
        sig = _unb64(m.group(2), 64) if m else None
        if pk is None or sig is None:
            shown = repr(text)[:60]
            raise BadSignatureError(
                f"malformed signature {shown}: expected ed25519:<public key>:<signature>"
            )
        try:
            return cls(PublicKey(pk), sig)
        except ValueError as e:
            raise BadSignatureError(f"signature by an unusable key: {e}") from None


# -- where keys live ----------------------------------------------------------


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def config_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/fxpiece`` (when set to an absolute path), else
    ``~/.config/fxpiece``."""
    xdg = _env(env).get("XDG_CONFIG_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".config"
    return base / "fxpiece"


def _path_from(env: Mapping[str, str], name: str, default: Path) -> Path:
    raw = env.get(name)
    if not raw:
        return default
    if "\x00" in raw:
        raise ConfigError(name, "a path cannot contain a NUL character")
    return Path(raw).expanduser()


def key_file(env: Mapping[str, str] | None = None) -> Path:
    """Where the builder key lives: ``$FXPIECE_KEY_FILE``, else
    ``<config_dir>/key``."""
    e = _env(env)
    return _path_from(e, KEY_FILE_ENV, config_dir(e) / "key")


def trusted_keys_file(env: Mapping[str, str] | None = None) -> Path:
    """The trusted-keys file: ``$FXPIECE_TRUSTED_KEYS_FILE``, else
    ``<config_dir>/trusted_keys``."""
    e = _env(env)
    return _path_from(e, TRUSTED_KEYS_FILE_ENV, config_dir(e) / "trusted_keys")


# -- safe file access ---------------------------------------------------------


def _refuse(path: Path, code: int, why: str, fix: str) -> KeyFileError:
    return KeyFileError(code, f"refusing {path}: {why}; {fix}", str(path))


def _check_folder(folder: Path, what: str) -> None:
    """The folder holding a key file: a real folder (no symlink), owned by us
    or root, writable by nobody else (else one could swap the file)."""
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise KeyFileError(
            e.errno or 0, f"cannot look at {folder}: {e.strerror}", str(folder)
        ) from e
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(
            folder, errno.ELOOP, f"the folder of the {what} is a symlink", "use a real folder"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(
            folder, errno.ENOTDIR, "not a folder", f"remove it or point the {what} elsewhere"
        )
    if st.st_uid not in (os.geteuid(), 0):
        raise _refuse(
            folder,
            errno.EPERM,
            f"the folder of the {what} is owned by uid {st.st_uid}",
            "use a folder of your own",
        )
    if st.st_mode & 0o022:
        raise _refuse(
            folder,
            errno.EPERM,
            f"the folder of the {what} is writable by others (mode {st.st_mode & 0o777:04o})",
            f"chmod go-w {folder}",
        )


def _read_private(path: Path, *, secret: bool, limit: int) -> bytes:
    """Read a key file without following a symlink: a regular file of ours
    (a trusted-keys file may be root's), a secret readable by us alone, a
    trusted-keys file writable by us alone. FileNotFoundError when absent."""
    what = "signing key" if secret else "trusted-keys file"
    _check_folder(path.parent, what)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _refuse(
                path, errno.ELOOP, f"the {what} is a symlink", "replace it with the file"
            ) from None
        raise KeyFileError(
            e.errno or 0, f"cannot open the {what} {path}: {e.strerror}", str(path)
        ) from e
    try:
        st = os.fstat(fd)
        mode = st.st_mode & 0o777
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, errno.EINVAL, f"the {what} is not a regular file", "remove it")
        owners = (os.geteuid(),) if secret else (os.geteuid(), 0)
        if st.st_uid not in owners:
            raise _refuse(
                path,
                errno.EPERM,
                f"the {what} is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})",
                "use a key of your own: `fxpiece key new --force`" if secret else "use your own",
            )
        if secret and mode & 0o077:
            raise _refuse(
                path,
                errno.EPERM,
                f"the signing key is readable by group or others (mode {mode:04o}): "
                "treat it as leaked",
                "make a new one (`fxpiece key new --force`) and revoke the old one",
            )
        if not secret and mode & 0o022:
            raise _refuse(
                path,
                errno.EPERM,
                f"the trusted-keys file is writable by others (mode {mode:04o})",
                f"chmod go-w {path}",
            )
        if st.st_size > limit:
            raise _refuse(path, errno.EFBIG, f"the {what} is over {limit} bytes", "remove it")
        chunks = []
        total = 0
        while chunk := os.read(fd, limit + 1 - total):
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise _refuse(path, errno.EFBIG, f"the {what} is over {limit} bytes", "remove it")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _make_folder(folder: Path, what: str) -> None:
    """Create ``folder`` and missing parents 0700, then check it."""
    missing = []
    p = folder
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:
            pass
        except OSError as e:
            raise KeyFileError(
                e.errno or 0, f"cannot create the folder of the {what} {d}: {e.strerror}", str(d)
            ) from e
    _check_folder(folder, what)


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_temp(folder: Path, name: str, data: bytes, mode: int) -> Path:
    """``data`` in a new file (O_EXCL, ``mode``, fsynced) next to ``name``."""
    tmp = folder / f".{name}.tmp-{os.getpid()}-{secrets.token_hex(6)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, mode)
    try:
        os.fchmod(fd, mode)  # the umask may have taken bits away; never adds any
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    return tmp


@contextlib.contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    """An exclusive ``flock`` on the folder itself (read-modify-write of the
    trusted-keys file by two ``fxpiece key`` commands loses no line)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# -- the builder key ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BuilderKey:
    """A loaded signing key: the secret stays native (``_native.SigningKey``)."""

    path: Path
    public: PublicKey
    key: _native.SigningKey = field(repr=False, compare=False)

    def sign(self, kind: str, payload: bytes | bytearray | memoryview) -> Signature:
        """Sign ``payload`` (any contiguous buffer; not copied) as ``kind``."""
        _check_kind(kind)
        return Signature(self.public, self.key.sign(kind, payload))

    def sign_digest(self, kind: str, digest: bytes | str) -> Signature:
        """Sign by the payload's checksum (32 bytes, or its 64 hex digits as an
        artifact header's ``blake3=`` gives it)."""
        _check_kind(kind)
        return Signature(self.public, self.key.sign_digest(kind, _digest_bytes(digest)))


def _encode_key(key: _native.SigningKey) -> bytes:
    return f"{_KEY_MAGIC}{_b64(key.seed())}\n".encode("ascii")


def _decode_key(path: Path, data: bytes) -> BuilderKey:
    m = _KEY_LINE.fullmatch(data.decode("ascii", "replace"))
    seed = _unb64(m.group(1), 32) if m else None
    if seed is None:
        raise KeyFileError(
            errno.EINVAL,
            f"{path} is not an fxpiece signing key (expected one line "
            f"'{_KEY_MAGIC}<seed>'); move it aside and run `fxpiece key new`",
            str(path),
        )
    key = _native.SigningKey.from_seed(seed)
    return BuilderKey(path, PublicKey(key.public_key), key)


def load_key(path: Path | None = None) -> BuilderKey:
    """The key at ``path`` (default :func:`key_file`), checked (see the
    module doc); FileNotFoundError when there is none."""
    p = key_file() if path is None else path
    return _decode_key(p, _read_private(p, secret=True, limit=_MAX_KEY_FILE))


def _create_key(path: Path, *, replace: bool) -> BuilderKey | None:
    """A new key at ``path``: replacing any file there (``replace``), else
    linked into place only if there is none (None if there was one)."""
    _make_folder(path.parent, "signing key")
    key = _native.SigningKey.generate()
    tmp = _write_temp(path.parent, path.name, _encode_key(key), 0o600)
    try:
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # never replaces: a racing creator's key stays
    except FileExistsError:
        return None
    except OSError as e:
        raise KeyFileError(
            e.errno or 0, f"cannot create the signing key {path}: {e.strerror}", str(path)
        ) from e
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    _fsync_dir(path.parent)
    return BuilderKey(path, PublicKey(key.public_key), key)


def builder_key(path: Path | None = None) -> BuilderKey:
    """This builder's key, made on first use (see the module doc): processes
    racing to make it all end with the one that was linked first."""
    p = key_file() if path is None else path
    try:
        return load_key(p)
    except FileNotFoundError:
        pass
    made = _create_key(p, replace=False)
    return load_key(p) if made is None else made


def new_key(path: Path | None = None, *, force: bool = False) -> BuilderKey:
    """Make a new key. Without ``force``, :class:`FileExistsError` if there is
    one; with it, the old one is replaced atomically (what it signed stays
    trusted only while its public key is in the trusted keys)."""
    p = key_file() if path is None else path
    made = _create_key(p, replace=force)
    if made is None:
        raise FileExistsError(
            errno.EEXIST,
            f"a signing key exists at {p}; `fxpiece key new --force` replaces it "
            "(what the old key signed is then trusted only if you `fxpiece key trust` it)",
            str(p),
        )
    return made


# -- trust --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TrustedKeys:
    """Whose signatures are accepted: ``keys`` less ``revoked``."""

    keys: frozenset[PublicKey] = frozenset()
    revoked: frozenset[PublicKey] = frozenset()

    def trusts(self, key: PublicKey) -> bool:
        return key in self.keys and key not in self.revoked

    def check(self, signer: PublicKey) -> None:
        """:class:`~fxpiece.errors.RevokedSignerError` or
        :class:`~fxpiece.errors.UntrustedSignerError` unless trusted."""
        if signer in self.revoked:
            raise RevokedSignerError(str(signer), f"signed by a revoked key {signer}")
        if signer not in self.keys:
            raise UntrustedSignerError(
                str(signer),
                f"signed by {signer}, which is not a trusted key "
                "(`fxpiece key trust KEY` or FXPIECE_TRUSTED_KEYS to trust it)",
            )

    def with_keys(self, keys: Iterable[PublicKey]) -> TrustedKeys:
        return TrustedKeys(self.keys | frozenset(keys), self.revoked)

    def with_revoked(self, keys: Iterable[PublicKey]) -> TrustedKeys:
        return TrustedKeys(self.keys, self.revoked | frozenset(keys))


def _parse_env_keys(raw: str) -> tuple[list[PublicKey], list[PublicKey]]:
    trust: list[PublicKey] = []
    revoke: list[PublicKey] = []
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        if item.startswith("-"):
            revoke.append(PublicKey.parse(item[1:], TRUSTED_KEYS_ENV))
        else:
            trust.append(PublicKey.parse(item, TRUSTED_KEYS_ENV))
    return trust, revoke


def _parse_trusted_file(path: Path, text: str) -> tuple[list[PublicKey], list[PublicKey]]:
    trust: list[PublicKey] = []
    revoke: list[PublicKey] = []
    for n, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{path}:{n}"
        if words[0] == "revoked":
            if len(words) < 2:
                raise ConfigError(where, "'revoked' needs a key: revoked ed25519:<key>")
            revoke.append(PublicKey.parse(words[1], where))
        else:
            trust.append(PublicKey.parse(words[0], where))
    return trust, revoke


def _read_trusted_file(path: Path) -> str:
    try:
        data = _read_private(path, secret=False, limit=_MAX_TRUSTED_FILE)
    except FileNotFoundError:
        return ""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise KeyFileError(errno.EINVAL, f"{path} is not UTF-8 text", str(path)) from None


def trusted_keys(
    env: Mapping[str, str] | None = None,
    *,
    own: bool = True,
    file: Path | None = None,
) -> TrustedKeys:
    """Your own key (when ``own`` and its file exists: a missing key signed
    nothing; an unsafe one raises), ``FXPIECE_TRUSTED_KEYS`` and the
    trusted-keys file (``file``, default :func:`trusted_keys_file`), less
    every revoked key."""
    e = _env(env)
    keys: list[PublicKey] = []
    revoked: list[PublicKey] = []
    if own:
        with contextlib.suppress(FileNotFoundError):
            keys.append(load_key(key_file(e)).public)
    t, r = _parse_env_keys(e.get(TRUSTED_KEYS_ENV, ""))
    keys += t
    revoked += r
    path = trusted_keys_file(e) if file is None else file
    t, r = _parse_trusted_file(path, _read_trusted_file(path))
    keys += t
    revoked += r
    return TrustedKeys(frozenset(keys), frozenset(revoked))


def _edit_trusted(key: PublicKey, *, revoke: bool, label: str, path: Path | None) -> bool:
    p = trusted_keys_file() if path is None else path
    if label and ("\n" in label or "\r" in label):
        raise ValueError("a key label is one line")
    _make_folder(p.parent, "trusted-keys file")
    with _folder_lock(p.parent):
        text = _read_trusted_file(p)
        trust, revoked = _parse_trusted_file(p, text)  # refuses a malformed file as it is
        if (key in revoked) if revoke else (key in trust and key not in revoked):
            return False
        kept = []
        for line in text.splitlines():
            words = line.split("#", 1)[0].split()
            named = words[1:2] if words[:1] == ["revoked"] else words[:1]
            if named and PublicKey.parse(named[0], str(p)) == key:
                continue  # the key's old line: one line per key
            kept.append(line)
        if not text:
            kept = _TRUSTED_HEADER.splitlines()
        entry = f"revoked {key}" if revoke else str(key)
        kept.append(f"{entry}  {label}".rstrip())
        tmp = _write_temp(p.parent, p.name, ("\n".join(kept) + "\n").encode(), 0o644)
        try:
            os.replace(tmp, p)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise KeyFileError(e.errno or 0, f"cannot write {p}: {e.strerror}", str(p)) from e
        _fsync_dir(p.parent)
    return True


def trust_key(key: PublicKey, *, label: str = "", path: Path | None = None) -> bool:
    """Add ``key`` to the trusted-keys file (replacing a revocation of it);
    False if it was trusted there already."""
    return _edit_trusted(key, revoke=False, label=label, path=path)


def revoke_key(key: PublicKey, *, label: str = "", path: Path | None = None) -> bool:
    """Revoke ``key`` in the trusted-keys file (replacing a trust line of
    it); False if it was revoked there already."""
    return _edit_trusted(key, revoke=True, label=label, path=path)


# -- signing and verifying ------------------------------------------------------


def _check_kind(kind: str) -> None:
    if not isinstance(kind, str) or not _KIND.fullmatch(kind):
        raise ValueError(f"a signature kind is 1-64 of [a-z0-9._-], not {kind!r}")


def _digest_bytes(digest: bytes | str) -> bytes:
    if isinstance(digest, str):
        if not re.fullmatch(r"[0-9a-f]{64}", digest, re.ASCII):
            raise ValueError("a payload digest is 64 lowercase hex digits")
        return bytes.fromhex(digest)
    if len(digest) != 32:
        raise ValueError(f"a payload digest is 32 bytes, not {len(digest)}")
    return bytes(digest)


def sign(
    kind: str, payload: bytes | bytearray | memoryview, *, key: BuilderKey | None = None
) -> Signature:
    """Sign ``payload`` as ``kind`` with ``key`` (default: :func:`builder_key`,
    made on first use)."""
    return (builder_key() if key is None else key).sign(kind, payload)


def sign_digest(kind: str, digest: bytes | str, *, key: BuilderKey | None = None) -> Signature:
    """:func:`sign` by the payload's checksum (32 bytes or 64 hex digits)."""
    return (builder_key() if key is None else key).sign_digest(kind, digest)


def _signature(signature: Signature | str) -> Signature:
    return signature if isinstance(signature, Signature) else Signature.parse(signature)


def verify(
    kind: str,
    payload: bytes | bytearray | memoryview,
    signature: Signature | str,
    trusted: TrustedKeys,
) -> PublicKey:
    """The signer, if ``signature`` (a :class:`Signature` or its text) is a
    trusted key's signature of ``payload`` as ``kind``.

    Raises :class:`~fxpiece.errors.RevokedSignerError` /
    :class:`~fxpiece.errors.UntrustedSignerError` (checked first: an
    untrusted payload is not even hashed) or
    :class:`~fxpiece.errors.BadSignatureError` (malformed, or it does not
    verify: payload, kind or signature changed).
    """
    _check_kind(kind)
    sig = _signature(signature)
    trusted.check(sig.signer)
    if not _native.verify_signature(sig.signer.raw, kind, payload, sig.value):
        raise BadSignatureError(
            f"bad {kind} signature by {sig.signer.short}: the payload, its kind or the "
            "signature was changed after signing"
        )
    return sig.signer


def verify_digest(
    kind: str, digest: bytes | str, signature: Signature | str, trusted: TrustedKeys
) -> PublicKey:
    """:func:`verify` by the payload's checksum (32 bytes or 64 hex digits, as
    an artifact header's ``blake3=`` records it, once that is checked)."""
    _check_kind(kind)
    d = _digest_bytes(digest)
    sig = _signature(signature)
    trusted.check(sig.signer)
    if not _native.verify_signature_digest(sig.signer.raw, kind, d, sig.value):
        raise BadSignatureError(
            f"bad {kind} signature by {sig.signer.short}: the payload, its kind or the "
            "signature was changed after signing"
        )
    return sig.signer


# -- the keys a cache store uses -----------------------------------------------


class KeyRing:
    """The builder key and the trusted keys one cache store (or one backend:
    share it between stores) signs and verifies with, each loaded once, on
    first need, never at import: a store that only reads unsigned files
    from its own root never touches a key file, one that never writes never
    makes a key.

    ``signer`` / ``trusted`` given: used as they are. Not given:
    :func:`builder_key` (made on first use) and :func:`trusted_keys`; then
    the key this ring loaded to sign with is trusted too (unless revoked),
    even if it was made after the trusted keys were read: a store always
    reads back what it wrote.

    Not a frozen value on purpose: it is the memo of two loads, kept per
    instance (no module state), safe to share between threads."""

    __slots__ = ("_lock", "_own", "_signer", "_trusted", "_trusted_given")

    def __init__(
        self, signer: BuilderKey | None = None, trusted: TrustedKeys | None = None
    ) -> None:
        self._lock = threading.Lock()
        self._signer = signer
        self._own = signer is None  # the default key: trusted with the defaults
        self._trusted = trusted
        self._trusted_given = trusted is not None

    def signer(self) -> BuilderKey:
        """The key to sign with (:class:`~fxpiece.errors.KeyFileError` if
        the key file is unsafe)."""
        with self._lock:
            if self._signer is None:
                self._signer = builder_key()
                if self._trusted is not None and not self._trusted_given:
                    self._trusted = self._trusted.with_keys([self._signer.public])
            return self._signer

    def trusted(self) -> TrustedKeys:
        """Whose signatures are accepted (:class:`~fxpiece.errors.ConfigError`
        or :class:`~fxpiece.errors.KeyFileError` if the configuration is
        malformed or unsafe)."""
        with self._lock:
            if self._trusted is None:
                t = trusted_keys()
                if self._own and self._signer is not None:
                    t = t.with_keys([self._signer.public])
                self._trusted = t
            return self._trusted

    def __repr__(self) -> str:
        signer = "unloaded" if self._signer is None else self._signer.public.short
        return f"KeyRing(signer={signer}, trusted={'given' if self._trusted_given else 'default'})"
