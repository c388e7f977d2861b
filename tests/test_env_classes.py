"""Every TORCHINDUCTOR_* / TORCH_* / TORCHDYNAMO_* variable the installed torch
reads is classified in :mod:`fxpiece.piecewise.env_classes` (runs on both
supported releases: ``compat``), and the Inductor deny list agrees with it."""

from __future__ import annotations

import ast
import os
import re

import pytest
import torch

from fxpiece.piecewise import _torch_compat, env_classes
from fxpiece.piecewise.factors import env_factors, inductor_factors

pytestmark = pytest.mark.compat

_READ = re.compile(
    r"""(?:environ\.get|getenv|environ\[|env_name_(?:default|force)\s*=)\s*\(?\s*\[?\s*"""
    r"""["']((?:TORCHINDUCTOR|TORCHDYNAMO|TORCH)_[A-Z0-9_]+)["']"""
)


def torch_env_reads() -> dict[str, set[str]]:
    """``{variable: files}``: the variables the installed torch's Python
    source reads through ``os.environ.get``, ``os.getenv``, ``environ[...]``
    or a config's ``env_name_default``/``env_name_force``."""
    root = os.path.dirname(os.path.abspath(torch.__file__))
    out: dict[str, set[str]] = {}
    for folder, _, files in os.walk(root):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(folder, f)
            try:
                with open(path, encoding="utf-8") as fh:
                    text = fh.read()
            except (OSError, UnicodeDecodeError):
                continue
            for m in _READ.finditer(text):
                out.setdefault(m.group(1), set()).add(os.path.relpath(path, root))
    return out


def inductor_env_options() -> dict[str, str]:
    """``{variable: option}`` for variables ``torch/_inductor/config.py``
    reads into an option (its dotted name, class sections as prefixes)."""
    path = os.path.join(os.path.dirname(torch.__file__), "_inductor", "config.py")
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    out: dict[str, str] = {}

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                walk(node.body, f"{prefix}{node.name}.")
                continue
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                target = node.target
            else:
                continue
            if not isinstance(target, ast.Name):
                continue
            src = ast.get_source_segment(text, node) or ""
            for m in _READ.finditer(src):
                out.setdefault(m.group(1), prefix + target.id)

    walk(ast.parse(text).body, "")
    return out


def test_every_variable_torch_reads_is_classified() -> None:
    reads = torch_env_reads()
    assert len(reads) > 100, "the scan found too few variables: is the pattern broken?"
    missing = sorted(n for n in reads if not env_classes.is_classified(n))
    assert not missing, f"torch {torch.__version__} reads unclassified variables: " + ", ".join(
        f"{n} ({sorted(reads[n])[0]})" for n in missing
    )
    both = env_classes.ENV_CHANGES_CODE & env_classes.ENV_NOT_CODE
    assert not both, f"classified both ways: {sorted(both)}"
    print(f"torch {torch.__version__} reads {len(reads)} classified variables")


@pytest.mark.slow
def test_inductor_deny_list_agrees_with_the_table() -> None:
    """A variable classified as not changing code must not change the key
    through the Inductor config either (its option is denied), and a
    code-changing one must (its option is keyed)."""
    options = _torch_compat.inductor_option_names()
    bad = []
    for var, option in sorted(inductor_env_options().items()):
        if option not in options:
            continue
        denied = option in _torch_compat.INDUCTOR_NOT_IN_KEY
        if var in env_classes.ENV_NOT_CODE and not denied:
            bad.append(f"{var} -> {option} is keyed, but the table says it changes no code")
        if var in env_classes.ENV_CHANGES_CODE and denied:
            bad.append(f"{var} -> {option} is denied, but the table says it changes code")
    assert not bad, "\n".join(bad)


def test_file_lock_timeout_keeps_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch._inductor.config as cfg

    before = (env_factors({}), inductor_factors({}))
    env = {"TORCHINDUCTOR_FILE_LOCK_TIMEOUT": "1234"}
    if hasattr(cfg, "file_lock_timeout"):
        monkeypatch.setattr(cfg, "file_lock_timeout", 1234)
    assert (env_factors(env), inductor_factors({})) == before
    assert env_factors({"TORCHINDUCTOR_CPP_MIN_CHUNK_SIZE": "1"}) != before[0]
