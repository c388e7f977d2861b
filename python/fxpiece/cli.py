"""The ``fxpiece`` command (also ``python -m fxpiece``).

::

    fxpiece demo                                  the main job (see README)
    fxpiece cache ls [ROOT] [--json]              models, keys, pieces, ranges, sizes, last use
    fxpiece cache explain A B [--root ROOT]       which factors differ between two keys/folders
    fxpiece cache verify [ROOT] [--repair]        check indexes and artifact checksums
    fxpiece cache prune [ROOT] --max-size 10G | --older-than 7d [--dry-run]
    fxpiece cache pack ROOT -o FILE
    fxpiece cache unpack FILE ROOT [--trust KEY]  refused unless a trusted key signed it all
    fxpiece cache push ROOT URL                   copy verified artifacts and entries to Redis
    fxpiece cache pull ROOT URL                   copy them from Redis into ROOT, checked
    fxpiece key new [--force]                     make this builder's signing key
    fxpiece key show                              its public key and the trusted keys
    fxpiece key trust KEY [--label TEXT]          trust another builder's key
    fxpiece key revoke KEY [--label TEXT]         refuse a key everywhere, even your own

``ROOT`` defaults to the configured cache (``FXPIECE_CACHE_ROOT``, else
``~/.cache/fxpiece``). Every subcommand takes ``--json``. Exit codes: 0 ok
(``explain`` finding differences is ok), 1 problems found (``verify``) or an
error (message on stderr), 2 usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from fxpiece.cache.admin import CacheListing, ModelInfo

__all__ = ["format_bytes", "main", "parse_age", "parse_size"]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b)?\s*$", re.IGNORECASE | re.ASCII)
_AGE_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])", re.ASCII)
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_MAX_SIZE = 1 << 63
"""Sizes must be below 8 EiB (what a file size can be)."""
_MAX_AGE = 1000 * 365.25 * 86400
"""Ages must be at most 1000 years."""


class BadValue(argparse.ArgumentTypeError, ValueError):
    """An option value that does not parse: a ``ValueError`` whose message
    argparse shows as is."""


def _shown(text: str, width: int = 32) -> str:
    return repr(text if len(text) <= width else text[: width - 3] + "...")


def parse_size(text: str) -> int:
    """Bytes from ``1024``, ``500K``, ``500M``, ``10G``, ``1.5GiB``, ``2TB``
    (powers of 1024).

    >>> parse_size("10G"), parse_size("500M"), parse_size("1024"), parse_size("1.5k")
    (10737418240, 524288000, 1024, 1536)

    Raises :class:`BadValue` (a ``ValueError``) for anything else, and for
    sizes of 8 EiB or more.
    """
    m = _SIZE.match(text)
    if not m:
        raise BadValue(
            f"{_shown(text)} is not a size; use bytes or a number with K, M, G, T (e.g. 10G, 500M)"
        )
    power = "kmgtp".find(m.group(2).lower()) + 1 if m.group(2) else 0
    value = float(m.group(1)) * 1024**power
    if not math.isfinite(value) or value >= _MAX_SIZE:
        raise BadValue(f"{_shown(text)} is too large a size; the limit is 8 EiB")
    return int(value)


def parse_age(text: str) -> float:
    """Seconds from ``30s``, ``30m``, ``12h``, ``7d``, ``2w`` or combinations (``1d12h``).

    >>> parse_age("7d"), parse_age("12h"), parse_age("30m"), parse_age("1h30m")
    (604800.0, 43200.0, 1800.0, 5400.0)

    Raises :class:`BadValue` (a ``ValueError``) for anything else, and for
    ages over 1000 years.
    """
    t = text.strip().lower()
    if not t or _AGE_PART.sub("", t) != "":
        raise BadValue(
            f"{_shown(text)} is not an age; use a number with a unit s, m, h, d or w (e.g. 7d, 12h)"
        )
    value = float(sum(float(n) * _AGE_UNITS[u] for n, u in _AGE_PART.findall(t)))
    if not math.isfinite(value) or value > _MAX_AGE:
        raise BadValue(f"{_shown(text)} is too long an age; the limit is 1000 years")
    return value


def format_bytes(n: int | None) -> str:
    """``1536`` -> ``'1.5 KiB'``.

    >>> format_bytes(0), format_bytes(1536), format_bytes(3 * 1024**3)
    ('0 B', '1.5 KiB', '3.0 GiB')
    """
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _when(ts: float | None, now: float) -> str:
    if ts is None:
        return "-"
    age = max(0.0, now - ts)
    for limit, div, unit in ((120, 1, "s"), (7200, 60, "m"), (172800, 3600, "h")):
        if age < limit:
            ago = f"{int(age // div)}{unit} ago"
            break
    else:
        ago = f"{int(age // 86400)}d ago"
    return f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(ts))} ({ago})"


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[int] = ()) -> str:
    cells = [[str(c) for c in r] for r in [headers, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for r in cells:
        parts = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _short_path(path: str, keep: int = 12) -> str:
    """``artifacts/03/0382511106718d5b...`` -> ``artifacts/03/038251110671..``."""
    head, _, name = path.rpartition("/")
    if len(name) > keep + 4:
        name = name[:keep] + ".." + (name[64:] if len(name) > 64 else "")
    return f"{head}/{name}" if head else name


def _default_root() -> Path:
    from fxpiece.config import default_cache_root  # torch-free, unlike CompileConfig

    return default_cache_root()


def _root(arg: str | None) -> Path:
    return Path(arg).expanduser() if arg else _default_root()


def _emit_json(value: Any) -> None:
    print(json.dumps(value, indent=1, sort_keys=False, default=str))


# -- subcommands ------------------------------------------------------------


_LS_HEADERS = (
    "KEY",
    "TAG",
    "ENTRIES",
    "PIECES",
    "RANGES",
    "COMPILER",
    "SIZE",
    "LAST USE",
    "SIGNED BY",
)
"""The columns of ``fxpiece cache ls``."""


def _ls_row(m: ModelInfo, now: float) -> list[Any]:
    """One model's row of the ``cache ls`` table (columns: ``_LS_HEADERS``)."""
    return [
        m.key[:12],
        m.tag,
        len(m.entries),
        ",".join(map(str, m.pieces)) or "-",
        " ".join(m.ranges) or "-",
        ",".join(m.compilers) or "-",
        format_bytes(m.artifact_bytes)
        + (f" ({m.missing_artifacts} missing)" if m.missing_artifacts else ""),
        _when(m.last_use, now),
        ",".join(m.signers) or "-",
    ]


def _ls_notes(listing: CacheListing) -> Iterator[str]:
    """The lines ``cache ls`` prints after its table: what is not a model's
    (unreferenced, quarantined, temp files), then every warning."""
    if listing.orphans:
        size = format_bytes(sum(o.size for o in listing.orphans))
        yield f"unreferenced artifacts: {len(listing.orphans)} ({size}); prune removes them first"
    if listing.quarantined:
        size = format_bytes(sum(q.size for q in listing.quarantined))
        yield (
            f"quarantined (moved aside as corrupt): {len(listing.quarantined)} ({size}); "
            "delete them once inspected"
        )
    if listing.temps:
        yield f"being written: {len(listing.temps)} temp file(s)"
    for m in listing.models:
        for p in m.problems:
            yield f"warning: {p}"
    for p in listing.problems:
        yield f"warning: {p}"


def _cmd_ls(a: argparse.Namespace) -> int:
    from fxpiece.cache.admin import list_cache

    listing = list_cache(_root(a.root))
    if a.json:
        _emit_json(listing.as_dict())
        return 0
    now = time.time()
    print(
        f"cache {listing.root}: {len(listing.models)} model folder(s), "
        f"{len(listing.artifacts)} artifact(s) ({format_bytes(listing.total_artifact_bytes)})"
    )
    if listing.models:
        rows = [_ls_row(m, now) for m in listing.models]
        print(_table(_LS_HEADERS, rows, right=(2,)))
    for line in _ls_notes(listing):
        print(line)
    return 0


def _cmd_explain(a: argparse.Namespace) -> int:
    from fxpiece.cache.explain import diff_factors, load_factors, resolve_model_folder
    from fxpiece.cache.keys import factors_key

    root = _root(a.root) if a.root or not (Path(a.a).exists() and Path(a.b).exists()) else None
    folders = [resolve_model_folder(x, root) for x in (a.a, a.b)]
    fa, fb = (load_factors(f) for f in folders)
    diff = diff_factors(fa, fb)
    keys = [factors_key(fa), factors_key(fb)]
    if a.json:
        _emit_json(
            {
                "a": {"folder": str(folders[0]), "key": keys[0]},
                "b": {"folder": str(folders[1]), "key": keys[1]},
                **diff.as_dict(),
            }
        )
        return 0
    for label, folder, key in zip("AB", folders, keys, strict=True):
        print(f"{label}: {folder}  (key {key[:16]}..)")
    print(diff.summary())
    details = diff.lines()
    if len(details) > 1:
        for line in details:
            print(f"  {line}")
    return 0


def _cmd_verify(a: argparse.Namespace) -> int:
    from fxpiece.cache.admin import verify_cache

    report = verify_cache(_root(a.root), repair=a.repair)
    if a.json:
        _emit_json(report.as_dict())
        return 0 if report.ok else 1
    files = sum(i.good_files + len(i.problems) for i in report.indexes)
    n_bundles = report.kernel_bundles_checked
    bundles = f" + {n_bundles} kernel bundle(s)" if n_bundles else ""
    print(
        f"verified {report.root}: {len(report.indexes)} index(es) ({files} files), "
        f"{report.artifacts_checked} artifact(s){bundles} ({format_bytes(report.artifact_bytes)})"
    )
    for ix in report.indexes:
        for p in ix.problems:
            fate = f"moved aside to {p.moved_to}" if p.moved_to else "left in place"
            print(f"BAD INDEX FILE  {p.file}: {p.reason} ({fate})")
    for pr in report.problems:
        print(f"BAD ARTIFACT  {_short_path(pr.artifact)}: {pr.reason}")
        for ref in pr.referenced_by:
            print(f"    used by {ref}")
        if report.repaired:
            fate = f"moved aside to {pr.moved_to}" if pr.moved_to else "nothing to move"
            print(f"    repaired: {fate}; {pr.entries_removed} index entry(ies) removed")
    if report.unreferenced:
        print(
            f"unreferenced artifacts: {len(report.unreferenced)} (never loaded; "
            "`fxpiece cache prune` removes them first)"
        )
    for w in report.warnings:
        print(f"warning: {w}")
    for u in report.untrusted:
        print(f"UNTRUSTED  {u}")
    signed = ", ".join(f"{k.short} ({n})" for k, n in report.signers)
    if signed or report.unsigned:
        unsigned = f"; unsigned (before v3): {report.unsigned}" if report.unsigned else ""
        print(f"signed by: {signed or '-'}{unsigned}")
    n = len(report.problems) + report.index_problems + len(report.untrusted)
    if report.ok:
        print("OK")
    elif report.repaired:
        print(f"{n} problem(s) repaired: bad files moved aside; the next run recompiles them")
    else:
        print(f"{n} problem(s); `fxpiece cache verify --repair` moves them aside to recompile")
    return 0 if report.ok else 1


def _cmd_prune(a: argparse.Namespace) -> int:
    from fxpiece.cache.admin import prune_cache

    res = prune_cache(
        _root(a.root), max_size=a.max_size, older_than=a.older_than, dry_run=a.dry_run
    )
    if a.json:
        _emit_json(res.as_dict())
        return 0
    verb = "would remove" if res.dry_run else "removed"
    entries = sum(r.entries_removed for r in res.removed)
    limit = f" (limit {format_bytes(res.max_size)})" if res.max_size is not None else ""
    print(
        f"pruned {res.root}: {verb} {len(res.removed)} artifact(s) "
        f"({format_bytes(res.bytes_before - res.bytes_after)}) and {entries} index "
        f"entry(ies); artifacts {format_bytes(res.bytes_before)} -> "
        f"{format_bytes(res.bytes_after)}{limit}"
    )
    now = time.time()
    rows = [
        [
            verb if i < len(res.removed) else "kept",
            _short_path(r.artifact),
            format_bytes(r.size),
            _when(r.mtime, now),
            r.reason,
        ]
        for i, r in enumerate([*res.removed, *res.kept])
    ]
    if rows:
        print(_table(["", "ARTIFACT", "SIZE", "LAST USE", "WHY"], rows, right=(2,)))
    if not res.size_target_met:
        print("note: the size limit is not met: the rest is in use (see 'kept')")
    return 0


def _cmd_pack(a: argparse.Namespace) -> int:
    from fxpiece.cache.admin import pack_cache

    res = pack_cache(Path(a.root).expanduser(), Path(a.output))
    if a.json:
        _emit_json(res.as_dict())
        return 0
    print(
        f"packed {res.files} file(s) ({format_bytes(res.bytes)}) into {res.archive} "
        f"({format_bytes(res.archive_bytes)})"
    )
    for s in res.skipped:
        print(f"skipped: {s}")
    return 0


def _cmd_unpack(a: argparse.Namespace) -> int:
    from fxpiece.cache.admin import unpack_cache
    from fxpiece.signing import PublicKey

    extra = [PublicKey.parse(k, "--trust") for k in a.trust]
    res = unpack_cache(Path(a.file), Path(a.root).expanduser(), extra_trust=extra)
    if a.json:
        _emit_json(res.as_dict())
        return 0
    print(
        f"unpacked {res.written} file(s) into {res.root} ({res.unchanged} already there, "
        f"{format_bytes(res.bytes)} checked)"
    )
    for key, n in res.signers:
        print(f"signed by {key}: {n} artifact(s)")
    for key in res.not_trusted_for_loads:
        print(
            f"warning: {key} is trusted for this unpack only; loads refuse (and move aside) "
            f"its artifacts until you run `fxpiece key trust {key}` "
            "(or add it to FXPIECE_TRUSTED_KEYS)"
        )
    return 0


def _cmd_push(a: argparse.Namespace) -> int:
    from fxpiece.remote import open_remote
    from fxpiece.remote.sync import push_cache

    with contextlib.closing(open_remote(a.url)) as store:
        res = push_cache(Path(a.root).expanduser(), store)
    if a.json:
        _emit_json(res.as_dict())
        return 0 if res.ok else 1
    print(
        f"pushed {res.root} to {res.url}: {res.blobs_pushed} artifact(s) "
        f"({format_bytes(res.bytes_pushed)}; {res.blobs_present} already there), "
        f"{res.entries_pushed} index entry(ies) of {res.models} model(s) "
        f"({res.entries_present} already there)"
    )
    for p in res.skipped:
        print(f"SKIPPED  {p}")
    return 0 if res.ok else 1


def _cmd_pull(a: argparse.Namespace) -> int:
    from fxpiece.remote import open_remote
    from fxpiece.remote.sync import pull_cache

    with contextlib.closing(open_remote(a.url)) as store:
        res = pull_cache(Path(a.root).expanduser(), store)
    if a.json:
        _emit_json(res.as_dict())
        return 0 if res.ok else 1
    print(
        f"pulled {res.url} into {res.root}: {res.artifacts_written} artifact(s) "
        f"({format_bytes(res.bytes_written)}; {res.artifacts_present} already there), "
        f"{res.entries_written} index entry(ies) of {res.models} model(s) "
        f"({res.entries_present} already there)"
    )
    for p in res.refused:
        print(f"REFUSED  {p}")
    return 0 if res.ok else 1


def _public_key_arg(text: str) -> Any:
    from fxpiece.errors import ConfigError
    from fxpiece.signing import PublicKey

    try:
        return PublicKey.parse(text, "KEY")
    except ConfigError as e:
        raise BadValue(str(e).removeprefix("KEY: ")) from None


def _cmd_key_new(a: argparse.Namespace) -> int:
    from fxpiece.signing import new_key

    k = new_key(force=a.force)
    if a.json:
        _emit_json({"key_file": str(k.path), "public_key": str(k.public)})
        return 0
    print(f"new signing key {k.path}\npublic key: {k.public}")
    print(f"other builders trust it with: fxpiece key trust {k.public}")
    return 0


def _cmd_key_show(a: argparse.Namespace) -> int:
    from fxpiece.signing import key_file, load_key, trusted_keys, trusted_keys_file

    path = key_file()
    try:
        own = load_key(path).public
    except FileNotFoundError:
        own = None
    trusted = trusted_keys()
    keys = sorted(map(str, trusted.keys))
    revoked = sorted(map(str, trusted.revoked))
    if a.json:
        _emit_json(
            {
                "key_file": str(path),
                "public_key": None if own is None else str(own),
                "trusted_keys_file": str(trusted_keys_file()),
                "trusted": [k for k in keys if k not in revoked],
                "revoked": revoked,
            }
        )
        return 0
    print(f"signing key: {path}")
    if own is None:
        print("public key: none yet (made on first use, or `fxpiece key new`)")
    else:
        print(f"public key: {own}")
    print(f"trusted keys (yours, FXPIECE_TRUSTED_KEYS, {trusted_keys_file()}):")
    for k in keys:
        notes = [n for n, on in (("yours", k == str(own)), ("REVOKED", k in revoked)) if on]
        print(f"  {k}" + (f"  ({', '.join(notes)})" if notes else ""))
    for k in revoked:
        if k not in keys:
            print(f"  {k}  (REVOKED)")
    if not keys and not revoked:
        print("  none")
    return 0


def _cmd_key_trust(a: argparse.Namespace) -> int:
    from fxpiece.signing import revoke_key, trust_key, trusted_keys_file

    revoke = a.key_command == "revoke"
    changed = (revoke_key if revoke else trust_key)(a.key, label=a.label)
    verb = "revoked" if revoke else "trusted"
    if a.json:
        _emit_json({"key": str(a.key), verb: True, "changed": changed})
        return 0
    where = trusted_keys_file()
    print(f"{verb} {a.key} in {where}" if changed else f"{a.key} is already {verb} in {where}")
    return 0


# -- parser -----------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """Usage errors are one line on stderr (exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


_ROOT_HELP = "cache root (default: FXPIECE_CACHE_ROOT, else ~/.cache/fxpiece)"


def _add_command(
    sub: argparse._SubParsersAction[_Parser],
    name: str,
    help: str,
    fn: Callable[[argparse.Namespace], int],
) -> argparse.ArgumentParser:
    """Add subcommand ``name`` to ``sub``: it takes ``--json`` and runs ``fn``."""
    p = sub.add_parser(name, help=help, description=help)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=fn)
    return p


def _add_bench_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    """``fxpiece bench hash`` (its options are parsed by :mod:`fxpiece.bench_hash`)."""
    bench = sub.add_parser("bench", help="benchmarks")
    bs = bench.add_subparsers(dest="bench_command", required=True, metavar="SUBCOMMAND")
    bs.add_parser(
        "hash",
        help="hash files the fxpiece way vs the reference way vs the read floor",
        add_help=False,
    )


def _add_ls_parser(cs: argparse._SubParsersAction[_Parser]) -> None:
    """``fxpiece cache ls``."""
    p = _add_command(
        cs, "ls", "list models: keys, pieces, ranges, sizes on disk, last use", _cmd_ls
    )
    p.add_argument("root", nargs="?", metavar="ROOT", help=_ROOT_HELP)


def _add_explain_parser(cs: argparse._SubParsersAction[_Parser]) -> None:
    """``fxpiece cache explain``."""
    p = _add_command(
        cs, "explain", "which cache-key factors differ between two keys or folders", _cmd_explain
    )
    p.add_argument("a", metavar="A", help="a model folder, or a key prefix (optionally KEY/TAG)")
    p.add_argument("b", metavar="B", help="the other one")
    p.add_argument("--root", help=f"where to look up key prefixes; {_ROOT_HELP}")


def _add_verify_parser(cs: argparse._SubParsersAction[_Parser]) -> None:
    """``fxpiece cache verify``."""
    p = _add_command(cs, "verify", "check every index and artifact checksum", _cmd_verify)
    p.add_argument("root", nargs="?", metavar="ROOT", help=_ROOT_HELP)
    p.add_argument(
        "--repair",
        action="store_true",
        help="move bad files aside (*.corrupt-<time>, never deleted) and drop their entries",
    )


def _add_prune_parser(cs: argparse._SubParsersAction[_Parser]) -> None:
    """``fxpiece cache prune`` (its parser is kept: :func:`main` checks that
    a limit is given)."""
    p = _add_command(cs, "prune", "remove least recently used artifacts", _cmd_prune)
    p.set_defaults(parser=p)
    p.add_argument("root", nargs="?", metavar="ROOT", help=_ROOT_HELP)
    p.add_argument("--max-size", type=parse_size, metavar="SIZE", help="e.g. 10G, 500M, 1024")
    p.add_argument("--older-than", type=parse_age, metavar="AGE", help="e.g. 7d, 12h, 30m")
    p.add_argument("--dry-run", action="store_true", help="only say what would be removed")


def _add_pack_parsers(cs: argparse._SubParsersAction[_Parser]) -> None:
    """``fxpiece cache pack`` and ``unpack``."""
    p = _add_command(
        cs, "pack", "write the cache into one archive with a checksummed manifest", _cmd_pack
    )
    p.add_argument("root", metavar="ROOT", help="the cache root to pack")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help=".tar, .tar.gz, .tgz...")

    p = _add_command(cs, "unpack", "verify an archive and unpack it into a cache root", _cmd_unpack)
    p.add_argument("file", metavar="FILE", help="an archive written by `fxpiece cache pack`")
    p.add_argument("root", metavar="ROOT", help="the cache root to unpack into")
    p.add_argument(
        "--trust",
        action="append",
        default=[],
        metavar="KEY",
        help="also accept artifacts signed by KEY (ed25519:...), for this unpack only",
    )


def _add_remote_parsers(cs: argparse._SubParsersAction[_Parser]) -> None:
    """``fxpiece cache push`` and ``pull``."""
    for name, what, fn in (
        (
            "push",
            "copy every verified artifact and index entry of ROOT to a remote cache",
            _cmd_push,
        ),
        ("pull", "copy a remote cache's artifacts and entries into ROOT, each checked", _cmd_pull),
    ):
        p = _add_command(cs, name, what, fn)
        p.add_argument("root", metavar="ROOT", help="the cache root")
        p.add_argument("url", metavar="URL", help="the remote cache, e.g. redis://host:6379/0")


def _add_cache_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    """``fxpiece cache`` and its subcommands."""
    cache = sub.add_parser("cache", help="inspect and operate the compile cache")
    cs = cache.add_subparsers(dest="cache_command", required=True, metavar="SUBCOMMAND")
    _add_ls_parser(cs)
    _add_explain_parser(cs)
    _add_verify_parser(cs)
    _add_prune_parser(cs)
    _add_pack_parsers(cs)
    _add_remote_parsers(cs)


def _add_key_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    """``fxpiece key`` and its subcommands."""
    key = sub.add_parser("key", help="this builder's signing key and the keys it trusts")
    ks = key.add_subparsers(dest="key_command", required=True, metavar="SUBCOMMAND")
    p = _add_command(
        ks, "new", "make a signing key (FXPIECE_KEY_FILE, else ~/.config/fxpiece/key)", _cmd_key_new
    )
    p.add_argument("--force", action="store_true", help="replace an existing key")
    _add_command(ks, "show", "print the public key and the trusted and revoked keys", _cmd_key_show)
    for name, help in (
        ("trust", "trust another builder's key (adds it to the trusted-keys file)"),
        ("revoke", "refuse a key everywhere, even your own (in the trusted-keys file)"),
    ):
        p = _add_command(ks, name, help, _cmd_key_trust)
        p.add_argument("key", type=_public_key_arg, metavar="KEY", help="ed25519:<base64url>")
        p.add_argument("--label", default="", help="a note kept after the key")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="fxpiece",
        description="fxpiece: a piecewise torch.compile backend and its compile cache",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("demo", help="compile a toy Llama piecewise, cold and warm", add_help=False)
    _add_bench_parser(sub)
    _add_cache_parser(sub)
    _add_key_parser(sub)
    return parser


def _message(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        msg = e.strerror
        if e.filename and str(e.filename) not in msg:
            msg += f": {e.filename}"
        return msg
    return str(e)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["demo"]:
        from fxpiece.demo import main as demo_main

        return demo_main(argv[1:])
    if argv[:2] == ["bench", "hash"]:
        from fxpiece.bench_hash import main as bench_hash_main

        return bench_hash_main(argv[2:])
    parser = _parser()
    a = parser.parse_args(argv)
    if getattr(a, "cache_command", None) == "prune" and a.max_size is a.older_than is None:
        a.parser.error("give --max-size SIZE or --older-than AGE (or both)")
    from fxpiece.errors import FxpieceError

    try:
        code: int = a.func(a)
    except (OSError, FxpieceError) as e:
        print(f"fxpiece: error: {_message(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code
