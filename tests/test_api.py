"""fxpiece.compile takes a backend the caller made: progress callbacks and a
process group reach it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import fxpiece
from fxpiece import CompileConfig, ConfigError
from fxpiece.distributed import DistributedBackend
from fxpiece.piecewise.stats import ProgressEvent
from fxpiece.toy_llama import ATTENTION_OP, ToyLlama, ToyLlamaConfig


def _config(cache: Path) -> CompileConfig:
    return CompileConfig(
        splitting_ops=[ATTENTION_OP],
        compile_ranges_endpoints=[8],
        max_num_tokens=32,
        compiler="eager",
        cache_dir=str(cache),
    )


def test_progress_reaches_the_backend(cache_root: Path) -> None:
    model = ToyLlama(ToyLlamaConfig(num_layers=1)).eval()
    events: list[ProgressEvent] = []
    backend = fxpiece.Backend(_config(cache_root), progress=events.append)
    cm = fxpiece.compile(model, backend=backend)
    assert cm.backend is backend
    ids = torch.arange(5)
    with torch.no_grad():
        torch.testing.assert_close(cm(ids), model(ids))
    # Two compiled pieces around the attention op, two ranges each.
    assert sorted((e.piece, str(e.entry)) for e in events) == [
        (0, "[1,8]"),
        (0, "[9,32]"),
        (2, "[1,8]"),
        (2, "[9,32]"),
    ]
    assert {e.action for e in events} == {"compiled"}
    assert all(e.num_pieces == 3 for e in events)


def test_the_backends_own_config_or_the_same_config(cache_root: Path) -> None:
    cfg = _config(cache_root)
    model = torch.nn.Linear(4, 4)
    assert fxpiece.compile(model, cfg, backend=fxpiece.Backend(cfg)).backend.config is cfg
    same = _config(cache_root)  # equal, not the same object
    assert fxpiece.compile(model, same, backend=fxpiece.Backend(cfg)).backend.config is cfg
    with pytest.raises(ConfigError) as ei:
        fxpiece.compile(model, cfg.replace(max_num_tokens=64), backend=fxpiece.Backend(cfg))
    assert ei.value.field == "config"
    assert "pass it to the backend" in str(ei.value)
    # No backend: one is made from the config.
    cm = fxpiece.compile(model, cfg)
    assert type(cm.backend) is fxpiece.Backend and cm.backend.config is cfg


@pytest.mark.parametrize("bad", [fxpiece.Backend, DistributedBackend, "inductor", object()])
def test_a_backend_that_is_not_an_instance_is_refused(bad: object, cache_root: Path) -> None:
    with pytest.raises(ConfigError) as ei:
        fxpiece.compile(torch.nn.Linear(4, 4), backend=bad)  # type: ignore[arg-type]
    assert ei.value.field == "backend"
    if isinstance(bad, type):  # the old backend_cls= usage: the message shows the fix
        assert f"backend={bad.__qualname__}(config, progress=...)" in str(ei.value)


@pytest.fixture
def one_rank_job() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_process_group_and_progress_reach_the_distributed_backend(
    one_rank_job: None, cache_root: Path
) -> None:
    group = dist.new_group([0], backend="gloo")
    events: list[ProgressEvent] = []
    backend = DistributedBackend(_config(cache_root), progress=events.append, group=group)
    model = ToyLlama(ToyLlamaConfig(num_layers=1)).eval()
    cm = fxpiece.compile(model, backend=backend)
    assert cm.backend is backend and backend.group is group
    ids = torch.arange(5)
    with torch.no_grad(), fxpiece.counters.expect(num_eager_compiles=4):
        torch.testing.assert_close(cm(ids), model(ids))
    # The ranks compile while they agree on the work, then each loads
    # every piece from its own cache: every (piece, entry) is reported.
    assert sorted((e.piece, str(e.entry)) for e in events) == [
        (0, "[1,8]"),
        (0, "[9,32]"),
        (2, "[1,8]"),
        (2, "[9,32]"),
    ]
    assert {e.action for e in events} == {"loaded"}
