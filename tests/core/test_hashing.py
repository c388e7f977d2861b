"""Key hashing: fxpiece.hash_files / hash_files_report / hash_factors."""

from __future__ import annotations

import json
import logging
import os
import pathlib
import subprocess
from collections import OrderedDict

import pytest
from programs.run import program_argv, program_env

import fxpiece
from fxpiece import hash_factors, hash_files, hash_files_report


def _is_hex64(s: str) -> bool:
    return len(s) == 64 and all(c in "0123456789abcdef" for c in s)


@pytest.fixture
def files(tmp_path: pathlib.Path) -> dict[str, str]:
    out = {}
    for name, body in {"a.py": "x = 1\n", "b.py": "y = 2\n", "c.py": "z = [1, 2, 3]\n"}.items():
        p = tmp_path / name
        p.write_text(body)
        out[name] = str(p)
    return out


# ----- hash_files --------------------------------------------------------------


def test_digest_is_64_hex_chars_and_matches_report(files: dict[str, str]) -> None:
    paths = list(files.values())
    d = hash_files(paths)
    assert _is_hex64(d)
    report = hash_files_report(paths)
    assert report.digest == d
    assert [f.path for f in report.files] == sorted(paths)
    assert all(f.skipped is None and f.digest and _is_hex64(f.digest) for f in report.files)
    assert report.total_bytes == sum(os.path.getsize(p) for p in paths)
    assert report.skipped == ()


def test_order_independent(files: dict[str, str]) -> None:
    a, b, c = files["a.py"], files["b.py"], files["c.py"]
    assert hash_files([a, b, c]) == hash_files([c, a, b]) == hash_files([b, c, a])


def test_duplicates_do_not_matter(files: dict[str, str]) -> None:
    a, b = files["a.py"], files["b.py"]
    assert hash_files([a, b]) == hash_files([a, b, a, b, b])
    assert len(hash_files_report([a, a, a]).files) == 1


def test_any_iterable_is_accepted(files: dict[str, str]) -> None:
    paths = list(files.values())
    expected = hash_files(paths)
    assert hash_files(tuple(paths)) == expected
    assert hash_files(set(paths)) == expected
    assert hash_files(p for p in paths) == expected
    assert hash_files(dict.fromkeys(paths)) == expected


def test_empty_set_is_deterministic() -> None:
    assert _is_hex64(hash_files([]))
    assert hash_files([]) == hash_files(())


def test_content_change_changes_digest(files: dict[str, str]) -> None:
    paths = list(files.values())
    before = hash_files(paths)
    pathlib.Path(files["b.py"]).write_text("y = 3\n")
    assert hash_files(paths) != before


def test_moving_bytes_between_files_changes_digest(tmp_path: pathlib.Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"ab")
    b.write_bytes(b"c")
    d1 = hash_files([str(a), str(b)])
    a.write_bytes(b"a")
    b.write_bytes(b"bc")
    d2 = hash_files([str(a), str(b)])
    a.write_bytes(b"abc")
    b.write_bytes(b"")
    d3 = hash_files([str(a), str(b)])
    assert len({d1, d2, d3}) == 3


def test_moving_bytes_between_path_and_content_changes_digest(tmp_path: pathlib.Path) -> None:
    # Path ".../xy" with content "z" vs path ".../x" with content "yz".
    (tmp_path / "xy").write_bytes(b"z")
    (tmp_path / "x").write_bytes(b"yz")
    assert hash_files([str(tmp_path / "xy")]) != hash_files([str(tmp_path / "x")])


def test_path_change_changes_digest(tmp_path: pathlib.Path) -> None:
    (tmp_path / "one.py").write_text("same\n")
    (tmp_path / "two.py").write_text("same\n")
    assert hash_files([str(tmp_path / "one.py")]) != hash_files([str(tmp_path / "two.py")])


def test_path_is_taken_as_given(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "m.py").write_text("v = 1\n")
    monkeypatch.chdir(tmp_path)
    rel = hash_files(["m.py"])
    assert rel == hash_files_report(["m.py"]).digest
    assert rel != hash_files([str(tmp_path / "m.py")])
    assert hash_files_report(["m.py"]).files[0].skipped is None


def test_pathlike_accepted(files: dict[str, str]) -> None:
    paths = list(files.values())
    assert hash_files([pathlib.Path(p) for p in paths]) == hash_files(paths)
    mixed = [pathlib.Path(paths[0]), *paths[1:]]
    assert hash_files(mixed) == hash_files(paths)
    assert hash_files_report(mixed).digest == hash_files(paths)


def test_single_str_is_rejected(files: dict[str, str]) -> None:
    with pytest.raises(TypeError, match="not one str"):
        hash_files(files["a.py"])
    with pytest.raises(TypeError, match="not one str"):
        hash_files_report(files["a.py"])


@pytest.mark.parametrize("bad", [[b"/tmp/x"], [1], [None], 42, pathlib.Path("/tmp")])
def test_bad_paths_are_rejected(bad: object) -> None:
    with pytest.raises(TypeError):
        hash_files(bad)  # type: ignore[arg-type]


def test_unreadable_paths_are_skipped_and_reported(files: dict[str, str]) -> None:
    gone = pathlib.Path(files["c.py"])
    gone.unlink()
    folder = str(gone.parent)
    paths = ["<frozen posixpath>", files["a.py"], "<string>", str(gone), folder, files["b.py"]]
    r1 = hash_files_report(paths)
    r2 = hash_files_report(list(reversed(paths)))
    assert r1 == r2
    assert hash_files(paths) == r1.digest
    skipped = [f.path for f in r1.skipped]
    assert skipped == sorted(["<frozen posixpath>", "<string>", str(gone), folder])
    for f in r1.skipped:
        assert f.digest is None and f.size == 0 and f.skipped
    # The readable files still count, and so does the set of asked-for paths.
    assert hash_files(paths) != hash_files([files["a.py"], files["b.py"]])
    assert hash_files(paths) != hash_files([*paths, "<stdin>"])


def test_deleting_a_file_changes_digest(files: dict[str, str]) -> None:
    paths = list(files.values())
    before = hash_files(paths)
    os.unlink(files["a.py"])
    after = hash_files(paths)
    assert after != before
    assert after == hash_files(paths)


def test_skipped_files_are_logged_at_debug(
    files: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="fxpiece.hashing"):
        d = hash_files([files["a.py"], "<frozen posixpath>"])
    assert d == hash_files([files["a.py"], "<frozen posixpath>"])
    assert any("<frozen posixpath>" in r.getMessage() for r in caplog.records)


def test_large_file_is_hashed_whole(tmp_path: pathlib.Path) -> None:
    # Bigger than the native read chunk: a change at the very end still counts.
    p = tmp_path / "big.bin"
    data = bytearray(os.urandom(1 << 20)) + b"tail"
    p.write_bytes(data)
    d1 = hash_files([str(p)])
    data[-1] ^= 1
    p.write_bytes(data)
    assert hash_files([str(p)]) != d1
    assert hash_files_report([str(p)]).total_bytes == len(data)


# ----- hash_factors ------------------------------------------------------------


def test_factor_digest_shape() -> None:
    assert _is_hex64(hash_factors({"a": 1}))
    assert _is_hex64(hash_factors(None))


def test_dict_key_order_irrelevant() -> None:
    a = {"a": 1, "b": [1, 2], "c": {"x": None, "y": 2.5}}
    b = {"c": {"y": 2.5, "x": None}, "b": [1, 2], "a": 1}
    assert hash_factors(a) == hash_factors(b)
    assert hash_factors(OrderedDict(reversed(list(a.items())))) == hash_factors(a)


def test_types_are_distinguished() -> None:
    variants = [{"a": 1}, {"a": "1"}, {"a": 1.0}, {"a": True}, {"a": b"1"}, {"a": [1]}]
    assert len({hash_factors(v) for v in variants}) == len(variants)
    falsy = [None, False, 0, 0.0, "", b"", [], (), {}]
    assert len({hash_factors(v) for v in falsy}) == len(falsy)
    # Key types too.
    assert hash_factors({1: "x"}) != hash_factors({"1": "x"})
    assert hash_factors({True: "x"}) != hash_factors({1: "x"})


def test_list_vs_tuple() -> None:
    assert hash_factors([1, 2]) != hash_factors((1, 2))
    assert hash_factors({"a": [1, (2, 3)]}) != hash_factors({"a": [1, [2, 3]]})
    assert hash_factors({"a": [1, (2, 3)]}) == hash_factors({"a": [1, (2, 3)]})


def test_nesting_is_unambiguous() -> None:
    cases = [
        ["ab"],
        ["a", "b"],
        [["a"], "b"],
        [["a", "b"]],
        [[], "ab"],
        ["", "ab"],
        {"a": {"b": 1}},
        {"a": [("b", 1)]},
        {"a": "b", "1": 1},
    ]
    assert len({hash_factors(c) for c in cases}) == len(cases)


def test_values_change_digest() -> None:
    assert hash_factors({"a": 1}) != hash_factors({"a": 2})
    assert hash_factors({"a": 1}) != hash_factors({"b": 1})
    assert hash_factors(1.0) != hash_factors(1.0000000000000002)
    assert hash_factors("é") != hash_factors("e")


def test_equal_floats_hash_equal() -> None:
    assert hash_factors(0.0) == hash_factors(-0.0)
    assert hash_factors(float("nan")) == hash_factors(-float("nan"))
    assert hash_factors(float("inf")) != hash_factors(float("-inf"))


def test_big_ints() -> None:
    big = [2**63 - 1, 2**63, 2**64, 2**64 + 1, 2**200, -(2**200), -(2**63), -(2**63) - 1]
    assert len({hash_factors(v) for v in big}) == len(big)
    assert hash_factors(2**200) == hash_factors(int(str(2**200)))
    assert hash_factors(2**64) != hash_factors(str(2**64))
    assert hash_factors(2**64) != hash_factors(float(2**64))
    # Past Python's int<->str digit limit: still hashes, still canonical.
    huge = 10**5000
    assert hash_factors(huge) == hash_factors(10**5000)
    assert hash_factors(huge) != hash_factors(huge + 1)


def test_int_subclasses_hash_by_value() -> None:
    class Weird(int):
        def __str__(self) -> str:
            return "same"

        __repr__ = __str__

    assert hash_factors(Weird(1)) == hash_factors(1)
    assert hash_factors(Weird(1)) != hash_factors(Weird(2))
    assert hash_factors(Weird(2**70)) == hash_factors(2**70)


def test_unsupported_type_names_path() -> None:
    with pytest.raises(TypeError, match=r"value\['a'\]\[1\]") as ei:
        hash_factors({"a": [1, object()]})
    assert "object" in str(ei.value)
    with pytest.raises(TypeError, match=r"value\[0\]\['k'\]\[2\]"):
        hash_factors([{"k": (1, 2, {3})}])
    with pytest.raises(TypeError, match=r"at value\b"):
        hash_factors({1, 2})
    with pytest.raises(TypeError, match=r"value\[\('x', 1\)\]"):
        hash_factors({("x", 1): pathlib.Path("p")})


def test_too_deep_or_cyclic_is_an_error_not_a_crash() -> None:
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(ValueError, match="nested deeper"):
        hash_factors(deep)
    cyclic: list[object] = []
    cyclic.append(cyclic)
    with pytest.raises(ValueError, match="cyclic"):
        hash_factors(cyclic)
    ok: list[object] = []
    for _ in range(200):
        ok = [ok]
    assert _is_hex64(hash_factors(ok))


# Golden digests: the encoding is part of the cache format (a change here
# invalidates every cache on disk, so it must be deliberate).
GOLDEN = {
    "none": (None, "4ed36a6cf7a552e769cae2a504be2fb195167271fb56900e03fa9cd8d7628f85"),
    "dict": (
        {"a": 1, "b": [1.5, "x", None, True], "c": (b"\x00", 2**70)},
        "6c022d3c5cfa87b91eb566d3427928e87b6ec1ede9fda353d79059a3bae0a1f7",
    ),
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_digests(name: str) -> None:
    value, digest = GOLDEN[name]
    assert hash_factors(value) == digest


def test_stable_across_processes(files: dict[str, str]) -> None:
    paths = [*files.values(), "<string>"]
    value = {"m": -7, "a": {"x": b"\x01", "y": 2**80}, "z": [1, 2.5, None, True, "s", (3, 4)]}
    here = [hash_files(paths), hash_factors(value), hash_files_report(paths).digest]
    outs = []
    for seed in ("0", "12345"):
        env = program_env({"PYTHONHASHSEED": seed})
        out = subprocess.run(
            program_argv("hash_stable", json.dumps(list(reversed(paths)))),
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        outs.append(json.loads(out.stdout))
    assert outs[0] == outs[1] == here


def test_public_api() -> None:
    for name in ("hash_files", "hash_files_report", "hash_factors", "FilesReport", "FileDigest"):
        assert name in fxpiece.__all__
