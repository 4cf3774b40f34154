"""The test suite's program store: programs built by one checkout are read by any other as its own."""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import CHECKOUT, ROOT


@pytest.mark.model("make_attention")
def test_stored_programs_name_no_checkout_and_read_back_as_this_one(
    quantized: Callable[..., Any], program_store: Path
) -> None:
    program = quantized("make_attention")
    with zipfile.ZipFile(program_store / "make_attention.pt2") as archive:
        stored = b"".join(archive.read(name) for name in archive.namelist())
    assert str(ROOT).encode() not in stored and CHECKOUT.encode() in stored
    traces = [n.meta["stack_trace"] for n in program.graph.nodes if n.meta.get("stack_trace")]
    assert any(f'File "{ROOT}/examples/models.py", line 30' in t for t in traces)
    assert not any(CHECKOUT in t for t in traces)
