"""Shipped programs: a .pte is read with ExecuTorch's deserializer and checked with the same rules."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import run_json

from qlint.config import Config
from qlint.program import lint_program


@pytest.fixture(scope="module")
def attention_pte(tmp_path_factory: pytest.TempPathFactory, quantized: Callable[..., Any]) -> Path:
    from executorch.backends.cortex_m.edge_compile_config import cortex_m_edge_compile_config
    from executorch.exir import EdgeProgramManager

    checked = lint_program(quantized("make_attention"), "a", Config())  # to_executorch changes it: not the shared one
    manager = EdgeProgramManager({"forward": checked.lowered}, compile_config=cortex_m_edge_compile_config())
    path = tmp_path_factory.mktemp("pte") / "attention.pte"
    path.write_bytes(manager.to_executorch().buffer)
    return path


def test_pte_islands_match_the_lowered_program(
    attention_pte: Path, pt2_dir: Callable[[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, pte = run_json(["check", str(attention_pte)], capsys)
    _, pt2 = run_json(["check", str(pt2_dir("make_attention"))], capsys)
    assert code == 1
    assert [f["code"] for f in pte["findings"]] == [f["code"] for f in pt2["findings"]] == ["QL001", "QL004", "QL005"]
    ql001 = pte["findings"][0]
    assert ql001["details"]["ops"] == ["aten.div.Tensor"]
    assert ql001["details"]["constants"][0]["value"] == pytest.approx(4.0)  # read from the constant buffer
    assert ql001["details"]["identity"] == pt2["findings"][0]["details"]["identity"]
    assert ql001["location"] is None  # a .pte carries no source lines
    [stats] = pte["artifacts"]
    assert stats["int_kernels"] == 3 and stats["fp32_islands"] == 1 and stats["fp32_elements"] == 128
