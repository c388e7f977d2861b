"""A piece's direct record (:mod:`fxpiece.piecewise._torch_compat.direct`)
is data from the cache: anything malformed is refused as
:class:`DirectUnsupported` (the piece then loads the usual way), never run,
and a kernel path never leaves Inductor's folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fxpiece.piecewise._torch_compat.direct import (
    MAGIC,
    DirectRecord,
    DirectUnsupported,
    pack,
    run,
    unpack,
)

GOOD = DirectRecord(
    source="def call(args):\n    return [args[0] + 1]\n",
    key="ckey",
    kernels={"cpp_fused_0": ("ckey.kernel", "ab/cabc.so")},
    externs={"mm": "mm"},
)


def _raw(**change: object) -> bytes:
    raw = json.loads(GOOD.to_bytes())
    raw.update(change)
    return json.dumps(raw).encode()


def test_a_record_round_trips_through_the_payload() -> None:
    payload = pack(GOOD, b"\x15\x00standalone")
    raw, rest = unpack(payload)
    assert raw is not None and bytes(rest) == b"\x15\x00standalone"
    assert DirectRecord.from_bytes(raw) == GOOD
    # A payload without a record (older, or no direct form) is the standalone bytes.
    assert unpack(b"\x15\x00standalone")[0] is None
    assert pack(None, b"x") == b"x"


@pytest.mark.parametrize(
    "rel",
    ["../x.so", "/etc/x.so", "ab/../../x.so", "ab/x.py", "", "a/b/c/d/e.so", "ab/x y.so"],
)
def test_a_kernel_path_that_could_leave_inductors_folder_is_refused(rel: str) -> None:
    with pytest.raises(DirectUnsupported):
        DirectRecord.from_bytes(_raw(kernels={"k": ["ckey.kernel", rel]}))


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b"[]",
        _raw(source=7),
        _raw(key=None),
        _raw(extra=1),
        _raw(kernels={"k": ["only-one"]}),
        _raw(kernels={"not an identifier": ["m", "ab/c.so"]}),
        _raw(externs={"mm": "os.system"}),
        _raw(externs={"mm": 3}),
    ],
)
def test_a_malformed_record_is_refused(data: bytes) -> None:
    with pytest.raises(DirectUnsupported):
        DirectRecord.from_bytes(data)


def test_a_truncated_record_is_refused() -> None:
    payload = pack(GOOD, b"rest")
    with pytest.raises(DirectUnsupported):
        unpack(payload[: len(MAGIC) + 8 + 10])
    with pytest.raises(DirectUnsupported):
        unpack(MAGIC + (1 << 40).to_bytes(8, "little") + b"{}")


def test_the_wrapper_cannot_import_inductor_or_dynamo(tmp_path: Path) -> None:
    for module in ("torch._inductor.compile_fx", "torch._dynamo", "torch._inductor"):
        rec = DirectRecord(f"import {module}\ndef call(args): pass\n", "k", {}, {})
        with pytest.raises(DirectUnsupported, match="imports"):
            run(rec, str(tmp_path), "t")


def test_a_kernel_missing_from_inductors_folder_is_refused(tmp_path: Path) -> None:
    src = (
        "from torch._inductor.async_compile import AsyncCompile\n"
        "async_compile = AsyncCompile()\n"
        "cpp_fused_0 = async_compile.cpp_pybinding(['float*'], 'src')\n"
        "async_compile.wait(globals())\n"
        "def call(args): return [cpp_fused_0]\n"
    )
    rec = DirectRecord(src, "k", {"cpp_fused_0": ("fxpiece_test_missing.kernel", "ab/c.so")}, {})
    with pytest.raises(DirectUnsupported, match="not in Inductor's folder"):
        run(rec, str(tmp_path), "t")


def test_a_plain_wrapper_runs_with_torch_only(tmp_path: Path) -> None:
    import torch

    src = (
        "import torch\n"
        "from torch._inductor.select_algorithm import extern_kernels\n"
        "def call(args):\n"
        "    out = torch.empty(2, 2)\n"
        "    extern_kernels.mm(args[0], args[1], out=out)\n"
        "    return [out]\n"
    )
    rec = DirectRecord(src, "k", {}, {"mm": "mm"})
    a, b = torch.randn(2, 3), torch.randn(3, 2)
    (got,) = run(rec, str(tmp_path), "t")["call"]([a, b])
    assert torch.equal(got, torch.mm(a, b))
