"""What an Ethos-U delegate holds, read from its blob without torch.

ExecuTorch's Arm backend stores each NPU partition as the bytes Vela compiled
(`executorch/backends/arm/arm_vela.py`, `vela_compile`): a sequence of blocks,
each a 32-byte header (`<16sIB11s`: a NUL-padded name, the data's length, an
"external" flag, 11 reserved bytes) and the data padded to 16 bytes. The blocks
are `vela_bin_stream` (empty, first), `cmd_data` (the NPU command stream),
`weight_data` (what the NPU reads from flash), `scratch_size` (a u32: the SRAM
the NPU works in), `inputs`, `outputs` (each a count, then per tensor a 6-D shape,
element size, offset and region: nine i32) and `vela_end_stream` (last).

The `.pte` is an untrusted file: every length is checked against the bytes that
hold it, and anything else is one `ReadError` line.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from qlint.io.reads import ReadError

_HEADER = struct.Struct("<16sIB11s")
_TENSOR = struct.Struct("<9i")
_COUNT = struct.Struct("<i")
_U32 = struct.Struct("<I")
_FIRST, _LAST = "vela_bin_stream", "vela_end_stream"
_REQUIRED = ("cmd_data", "weight_data", "scratch_size", "inputs", "outputs")
_MAX_TENSORS = 256  # per delegate call: ExecuTorch's Arm backend passes a handful


@dataclass(frozen=True)
class NpuBlob:
    """One NPU partition as the device holds it: sizes in bytes, I/O shapes as Vela packed them."""

    command_stream: int   # Vela's command stream (flash, with the rest of the .pte)
    flash: int            # the weights the NPU reads: Vela's flash figure
    sram: int             # the scratch the NPU works in: Vela's SRAM figure
    inputs: tuple[tuple[int, ...], ...]
    outputs: tuple[tuple[int, ...], ...]
    external_weights: bool = False  # the weights live in the program's named data, not the blob


@dataclass(frozen=True)
class NpuPartition(NpuBlob):
    """A delegate call's partition as a report gives it: what its blob holds, and Vela's estimate of its
    cycles on the NPU's clock when qlint compiled it (None from a `.pte`: it holds the command stream only)."""

    npu_cycles: int | None = None


def read_vela_blob(data: bytes) -> NpuBlob:
    """The blob's sizes and I/O shapes; `ReadError` for anything Vela does not write."""
    blocks = _blocks(data)
    missing = [name for name in _REQUIRED if name not in blocks]
    if missing:
        raise ReadError(f"Ethos-U delegate blob has no {', '.join(missing)} block")
    scratch = blocks["scratch_size"][0]
    if len(scratch) != _U32.size:
        raise ReadError(f"Ethos-U delegate blob's scratch_size block is {len(scratch)} bytes, not 4")
    return NpuBlob(
        command_stream=len(blocks["cmd_data"][0]),
        flash=len(blocks["weight_data"][0]),
        sram=_U32.unpack(scratch)[0],
        inputs=_tensors(blocks["inputs"][0], "inputs"),
        outputs=_tensors(blocks["outputs"][0], "outputs"),
        external_weights=blocks["weight_data"][1],
    )


def _blocks(data: bytes) -> dict[str, tuple[bytes, bool]]:
    """Each block's data and external flag by name, from `vela_bin_stream` to `vela_end_stream`."""
    blocks: dict[str, tuple[bytes, bool]] = {}
    pos = 0
    while True:
        if pos + _HEADER.size > len(data):
            raise ReadError(f"Ethos-U delegate blob ends inside a block header at byte {pos} of {len(data)}")
        raw, length, external, _ = _HEADER.unpack_from(data, pos)
        name = raw.rstrip(b"\0").decode("ascii", "replace")
        if pos == 0 and name != _FIRST:
            raise ReadError("Ethos-U delegate blob does not start with vela_bin_stream")
        if name in blocks:
            raise ReadError(f"Ethos-U delegate blob repeats its {name!r} block")
        pos += _HEADER.size
        if length > len(data) - pos:
            raise ReadError(f"Ethos-U delegate blob's {name!r} block claims {length} bytes; "
                            f"{len(data) - pos} follow it")
        blocks[name] = (data[pos:pos + length], bool(external))
        pos += (length + 15) // 16 * 16
        if name == _LAST:
            return blocks


def _tensors(raw: bytes, what: str) -> tuple[tuple[int, ...], ...]:
    """The shapes of an `inputs`/`outputs` block (the element size, offset and region are Vela's)."""
    if len(raw) < _COUNT.size:
        raise ReadError(f"Ethos-U delegate blob's {what} block is empty")
    (count,) = _COUNT.unpack_from(raw)
    if not 0 <= count <= _MAX_TENSORS or len(raw) != _COUNT.size + count * _TENSOR.size:
        raise ReadError(f"Ethos-U delegate blob's {what} block claims {count} tensors in {len(raw)} bytes")
    shapes = [_TENSOR.unpack_from(raw, _COUNT.size + k * _TENSOR.size)[:6] for k in range(count)]
    if any(size < 0 for shape in shapes for size in shape):
        raise ReadError(f"Ethos-U delegate blob's {what} block has a negative size")
    return tuple(tuple(shape) for shape in shapes)


@dataclass(frozen=True)
class NpuLayer:
    """One NPU operation of Vela's per-layer performance estimate (`--verbose-performance`)."""

    name: str        # the TOSA tensor the operation writes (Vela's `Name` column)
    operator: str    # the TOSA operator Vela compiled it from (`Original Operator`)
    cycles: int      # `Op Cycles`: its share of the partition's cycles, memory access included
    macs: int


@dataclass(frozen=True)
class NpuEstimate:
    """Vela's performance estimate of one partition: its summary CSV and per-layer CSV.

    `cycles` is Vela's `cycles_total`, the partition's time on the NPU's clock with memory access
    (the per-layer cycles add up to it); `compute_cycles` is `cycles_npu`, without the memory
    access Vela counts apart on U55 (10-25 % less there; equal on U85)."""

    cycles: int
    compute_cycles: int
    clock_hz: int          # `core_clock` of the system config Vela compiled for
    system_config: str
    layers: tuple[NpuLayer, ...]

    @property
    def seconds(self) -> float:
        return self.cycles / self.clock_hz


def read_vela_estimate(summary: str, per_layer: str) -> NpuEstimate:
    """Vela's estimate from the text of its two CSVs; `ReadError` when a column is missing or not a number."""
    import csv
    import io

    rows = list(csv.DictReader(io.StringIO(summary)))
    if len(rows) != 1:
        raise ReadError(f"Vela's summary has {len(rows)} rows, not 1")
    row = rows[0]
    layers = tuple(
        NpuLayer(r.get("Name") or "", r.get("Original Operator") or "", _count(r, "Op Cycles"), _count(r, "MAC Count"))
        for r in csv.DictReader(io.StringIO(per_layer)))
    return NpuEstimate(_count(row, "cycles_total"), _count(row, "cycles_npu"), _count(row, "core_clock"),
                       row.get("system_config") or "", layers)


def _count(row: dict[str, str], column: str) -> int:
    try:
        return round(float(row[column]))
    except (KeyError, TypeError, ValueError):
        raise ReadError(f"Vela's estimate has no number in column {column!r}") from None
