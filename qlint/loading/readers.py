"""Turn the bytes of a `.pt2` into a program qlint can analyse, without running code from it.

`qlint.io.archive` decides, without torch, what the archive holds and rebuilds it
from the allowed entries only; torch loads that rebuilt archive, after torch's own
zip reader has been asked to list the original and agreed. Sample inputs
are loaded here with torch's weights-only unpickler (torch's own loader would
fall back to a full unpickle when that refuses them), and torch is forced into
weights-only mode while it loads, in case any other path reaches `torch.load`.
After loading, every node target is checked to be a registered operator before
anything runs the graph.
"""

from __future__ import annotations

import contextlib
import io
import operator
import os
from collections.abc import Iterator
from typing import Any

from qlint.io.archive import parse_pt2, read_zip, write_zip
from qlint.io.limits import Limits
from qlint.io.reads import ReadError, first_line
from qlint.loading import stack

__all__ = ["ReadError", "is_quantized", "read_pt2"]


@contextlib.contextmanager
def _weights_only() -> Iterator[None]:
    old = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"]
        else:
            os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = old


def read_pt2(data: bytes, limits: Limits) -> Any:
    """A quantized ExportedProgram from the bytes of a .pt2."""
    archive = parse_pt2(data, limits)
    stack.load()
    import torch


    _torch_reads_the_same_entries(data, archive.entries)
    example = _sample_inputs(archive.sample_inputs, limits)
    try:
        with _weights_only():
            program = torch.export.load(io.BytesIO(archive.for_torch()))
    except Exception as exc:  # torch raises many types for a bad archive
        raise ReadError(f"torch.export.load failed: {first_line(exc)}") from None
    for node in program.graph.nodes:
        if node.op == "call_function" and not (
            isinstance(node.target, torch._ops.OpOverload) or node.target is operator.getitem
        ):
            raise ReadError(f"node {node.name} calls {node.target!r}, which is not a registered operator")
    if example is not None:
        try:
            program.example_inputs = example
        except Exception as exc:
            raise ReadError(f"sample inputs do not match the program: {first_line(exc)}") from None
    if not is_quantized(program):
        raise ReadError("not a quantized program (no quantize/dequantize nodes); run convert_pt2e first")
    return program


def _torch_reads_the_same_entries(data: bytes, entries: dict[str, bytes]) -> None:
    """Torch is only ever given the rebuilt archive; still, an original that torch's own zip
    reader lists differently from Python's (prepended data, a second directory) is crafted."""
    import torch

    try:
        records = torch._C.PyTorchFileReader(io.BytesIO(data)).get_all_records()
    except Exception as exc:
        reason = str(exc).split(". ")[0].strip()
        raise ReadError(f"torch's zip reader rejects it: {reason[:160]}") from None
    if sorted(records) != sorted(entries):
        raise ReadError("torch's zip reader lists other entries than Python's (a crafted zip directory)")


def _sample_inputs(data: bytes, limits: Limits) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """The archive's sample inputs, unpickled by the weights-only unpickler only: tensors, no objects."""
    if not data:
        return None
    import torch

    # A torch.save archive inside the .pt2: checked like the outer one, and rebuilt.
    try:
        nested = write_zip(read_zip(data, limits))
    except ReadError as exc:
        raise ReadError(f"sample inputs: {exc}") from None
    try:
        value = torch.load(io.BytesIO(nested), weights_only=True)
    except Exception as exc:
        raise ReadError(f"sample inputs are not plain tensors: {_unpickler_reason(exc)}") from None
    if not (
        isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], tuple) and isinstance(value[1], dict)
    ):
        raise ReadError("sample inputs are not (args, kwargs)")
    return value


def _unpickler_reason(exc: Exception) -> str:
    """The line of a weights-only refusal that says what was refused (its first line is advice)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    specific = [line for line in lines[1:] if not line.startswith("Check the documentation")]
    return specific[0] if specific else (lines[0] if lines else type(exc).__name__)


def is_quantized(program: Any) -> bool:
    from qlint.loading.view import DEQUANTIZE_OPS, op_name, packet

    return any(packet(op_name(n)) in DEQUANTIZE_OPS for n in program.graph.nodes if n.op == "call_function")
