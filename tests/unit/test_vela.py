"""The Ethos-U delegate blob reader (`qlint.io.vela`) on blobs built here with struct, as
ExecuTorch's Arm backend lays them out (`arm_vela.py`): a good one read to its sizes and shapes,
and every lie in a header or a count refused with one line. Torch-free."""

from __future__ import annotations

import struct

import pytest

from qlint.io.reads import ReadError
from qlint.io.vela import NpuBlob, NpuLayer, read_vela_blob, read_vela_estimate


def block(name: str, data: bytes, external: bool = False) -> bytes:
    """One block: a 32-byte header (`<16sIB11s`), then the data padded to 16 bytes."""
    return struct.pack("<16sIB11s", name.encode(), len(data), external, b"") + data + bytes(-len(data) % 16)


def tensors(*shapes: tuple[int, ...]) -> bytes:
    """An `inputs`/`outputs` block's data: a count, then per tensor a 6-D shape, element size, offset, region."""
    return struct.pack("<i", len(shapes)) + b"".join(struct.pack("<9i", *shape, 1, 0, 1) for shape in shapes)


BODY = {
    "cmd_data": bytes(100),
    "weight_data": bytes(48),
    "scratch_size": struct.pack("<I", 3392),
    "inputs": tensors((1, 1, 16, 1, 1, 32)),
    "outputs": tensors((1, 1, 1, 1, 16, 16)),
}


def blob(body: dict[str, bytes] = BODY, external: bool = False) -> bytes:
    blocks = [block(name, data, external and name == "weight_data") for name, data in body.items()]
    return block("vela_bin_stream", b"") + b"".join(blocks) + block("vela_end_stream", b"")


def refused(data: bytes) -> str:
    with pytest.raises(ReadError) as raised:
        read_vela_blob(data)
    return str(raised.value)


def test_a_blob_as_vela_writes_it_is_read_to_its_sizes_and_shapes() -> None:
    assert read_vela_blob(blob()) == NpuBlob(command_stream=100, flash=48, sram=3392,
                                             inputs=((1, 1, 16, 1, 1, 32),), outputs=((1, 1, 1, 1, 16, 16),))
    assert read_vela_blob(blob(external=True)).external_weights is True


def test_a_truncated_header_is_refused() -> None:
    whole = blob()
    assert refused(whole[:20]) == "Ethos-U delegate blob ends inside a block header at byte 0 of 20"
    assert refused(whole[:-16]) == (f"Ethos-U delegate blob ends inside a block header at byte {len(whole) - 32} "
                                    f"of {len(whole) - 16}")


def test_a_block_claiming_more_bytes_than_follow_is_refused() -> None:
    data = bytearray(blob())
    struct.pack_into("<I", data, 32 + 16, 1 << 31)  # cmd_data, the block after vela_bin_stream
    assert refused(bytes(data)) == (f"Ethos-U delegate blob's 'cmd_data' block claims {1 << 31} bytes; "
                                    f"{len(data) - 64} follow it")


def test_a_repeated_block_is_refused() -> None:
    data = block("vela_bin_stream", b"") + block("cmd_data", b"") + block("cmd_data", bytes(4))
    assert refused(data) == "Ethos-U delegate blob repeats its 'cmd_data' block"


def test_a_blob_that_does_not_start_with_its_stream_header_is_refused() -> None:
    assert refused(blob()[32:]) == "Ethos-U delegate blob does not start with vela_bin_stream"


def test_missing_blocks_are_named() -> None:
    body = {k: v for k, v in BODY.items() if k not in ("weight_data", "outputs")}
    assert refused(blob(body)) == "Ethos-U delegate blob has no weight_data, outputs block"


def test_a_scratch_size_of_another_width_is_refused() -> None:
    assert refused(blob({**BODY, "scratch_size": bytes(8)})) == (
        "Ethos-U delegate blob's scratch_size block is 8 bytes, not 4")


@pytest.mark.parametrize(("inputs", "message"), [
    (b"", "Ethos-U delegate blob's inputs block is empty"),
    (struct.pack("<i", 1 << 30) + bytes(36),
     "Ethos-U delegate blob's inputs block claims 1073741824 tensors in 40 bytes"),
    (struct.pack("<i", -1), "Ethos-U delegate blob's inputs block claims -1 tensors in 4 bytes"),
    (tensors((1, 1, 1, 1, 1, 2)) + bytes(4), "Ethos-U delegate blob's inputs block claims 1 tensors in 44 bytes"),
])
def test_a_lying_tensor_count_is_refused(inputs: bytes, message: str) -> None:
    assert refused(blob({**BODY, "inputs": inputs})) == message


def test_a_negative_size_is_refused() -> None:
    assert refused(blob({**BODY, "outputs": tensors((1, 1, -16, 1, 1, 16))})) == (
        "Ethos-U delegate blob's outputs block has a negative size")


SUMMARY = ("experiment,network,accelerator_configuration,system_config,memory_mode,core_clock,cycles_npu,cycles_total\n"
           "default,out,Ethos_U55_128,Ethos_U55_High_End_Embedded,Shared_Sram,500000000.0,11296,12800\n")
PER_LAYER = ("Original Operator,NNG Operator,Target,Op Cycles,MAC Count,Name\n"
             "Conv2D,Conv2D,NPU,1360,1024,tosa_rescale_default_1\n"
             "MatMul,MatMul,NPU,11440,8192,tosa_rescale_default_2\n")


def test_vela_estimate_reads_the_partitions_cycles_clock_and_each_layer() -> None:
    estimate = read_vela_estimate(SUMMARY, PER_LAYER)
    assert (estimate.cycles, estimate.compute_cycles, estimate.clock_hz) == (12800, 11296, 500_000_000)
    assert estimate.system_config == "Ethos_U55_High_End_Embedded"
    assert estimate.layers == (NpuLayer("tosa_rescale_default_1", "Conv2D", 1360, 1024),
                               NpuLayer("tosa_rescale_default_2", "MatMul", 11440, 8192))
    assert estimate.seconds == 12800 / 500e6


def test_vela_estimate_without_a_number_is_one_read_error() -> None:
    with pytest.raises(ReadError, match="no number in column 'cycles_total'"):
        read_vela_estimate(SUMMARY.replace(",12800", ",n/a"), PER_LAYER)
