"""Estimated cycles of each op of a lowered program on one Cortex-M core.

Users act on time on their board, not on op counts: a 16-element fp32 div is noise on a
Cortex-M55 with an FPU, a 200k-element LayerNorm in soft float is most of an inference. The work
of each op is read from the program (MACs of a convolution or matrix product from its operand
shapes, elements of everything else) and priced with `qlint.settings.cycles` for the CMSIS-NN
backend ExecuTorch picks for the CPU (`CortexMTargetConfig`) and for the core's FPU, or soft float
without one. Ops that run no code on the device (views ExecuTorch turns into aliases, planning)
cost nothing; work on constants is priced like any op, since the device computes it every inference.

On a core with an Ethos-U NPU, each delegate call costs what Vela estimated for its partition when
qlint compiled it (`qlint.io.vela.NpuEstimate`: the NPU's cycles on its own clock), counted on the
core's clock so that the program's cycles are one inference's: the NPU's cycles times the core's
clock over the NPU's, or as they are when no board gives the core's clock. A delegate call with no
estimate (a `.pte` holds only the command stream) leaves the inference unpriced: its CPU ops still are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch.fx import Node

from qlint.analysis.islands import constant_fp32
from qlint.io.vela import NpuEstimate
from qlint.loading.view import GraphView, Kind, base_name, numel, op_name, output_value
from qlint.records.results import ProfileRow
from qlint.settings.config import Config
from qlint.settings.cycles import Core, CostTable, cost_table, default_fpu

# ExecuTorch replaces these with aliases of their input at to_executorch (no copy, no kernel call).
ALIASES = frozenset({"view_copy", "_unsafe_view", "view", "squeeze_copy", "unsqueeze_copy", "alias_copy",
                     "detach_copy", "getitem", "alloc", "_assert_tensor_metadata", "_assert_scalar"})
# Data movement: a copy an element.
COPIES = frozenset({"transpose", "permute_copy", "permute", "clone", "_clone_dim_order", "_to_dim_order_copy",
                    "cat", "slice_copy", "expand_copy", "pad", "constant_pad_nd", "select_copy",
                    "split_with_sizes_copy", "split_copy", "repeat", "index_select", "_to_copy", "contiguous"})
MATMULS = frozenset({"quantized_linear", "quantized_batch_matmul"})
CONVS = frozenset({"quantized_conv2d", "quantized_depthwise_conv2d", "quantized_transpose_conv2d"})
FP32_MATMULS = frozenset({"linear", "mm", "bmm", "addmm", "matmul", "convolution", "conv2d", "conv1d"})
# Quantize and dequantize convert between int8 and float: their float arithmetic (cycles.yaml's
# `fp32.conversion`) is soft float on a core without an FPU. An fp32 op's is `fp32.arithmetic`.
CONVERSIONS = frozenset({"quantize_per_tensor", "dequantize_per_tensor"})


@dataclass(frozen=True)
class OpCost:
    """One op's estimate: its work (MACs for matrix products and convolutions, else elements)."""

    node: str
    op: str
    work: int
    unit: str          # "MAC" or "element"
    cycles: float
    fp32: bool
    npu: bool = False  # a delegate call: `work` is Vela's cycles on the NPU's clock, `cycles` on the core's


@dataclass
class ProgramCost:
    """Each op's cycles on one core: the estimate, or what a profile measured (`runs` > 0)."""

    core: Core
    ops: list[OpCost] = field(default_factory=list)
    runs: int = 0   # 0: estimated; else the median of this many measured runs (`qlint.device.profile`)
    unpriced: tuple[str, ...] = ()  # delegate calls with no estimate: the inference's time is unknown
    # measured: each delegate call's NPU run, on the core's clock, where the Ethos-U backend recorded one
    npu_runs: dict[str, int] = field(default_factory=dict)

    # Every figure is a sum of whole cycles an op, so an island's, its nodes' and the program's add up.
    @property
    def cycles(self) -> int:
        return sum(round(o.cycles) for o in self.ops)

    @property
    def fp32_cycles(self) -> int:
        return sum(round(o.cycles) for o in self.ops if o.fp32)

    @property
    def npu_cycles(self) -> int | None:
        """The NPU's cycles, on its own clock: Vela's estimates of the delegate calls; None when a call has
        none (a `.pte`'s, measured by a profile on the core's clock alone)."""
        calls = [o for o in self.ops if o.npu]
        return None if any(o.unit != NPU_CYCLE for o in calls) else sum(o.work for o in calls)

    @property
    def cpu_cycles(self) -> int:
        """The core's cycles: every op that is not a delegate call."""
        return sum(round(o.cycles) for o in self.ops if not o.npu)

    def of(self, nodes: Iterable[str]) -> int:
        """Cycles of the ops named `nodes` (an island's, a finding's)."""
        names = set(nodes)
        return sum(round(o.cycles) for o in self.ops if o.node in names)

    def by_node(self, view: GraphView) -> dict[Node, int]:
        """Each estimated op's cycles by its node in `view`'s graph."""
        nodes = {n.name: n for n in view.nodes}
        return {nodes[o.node]: round(o.cycles) for o in self.ops if o.node in nodes}

    def latency_ms(self, cycles: int | None = None) -> float | None:
        clock = self.core.clock_hz
        return None if not clock else (self.cycles if cycles is None else cycles) / clock * 1e3


def core_of(config: Config) -> Core:
    """The core a run estimates for: the config's CPU, with the selected board's FPU, clock and
    flash read cost."""
    board = config.selected_board()
    if board is None:
        return core_for(config.target_cpu)
    return core_for(config.target_cpu, board.fpu, board.clock_hz, board.flash_read or 0.0)


def core_for(cpu: str, fpu: bool | None = None, clock_hz: int | None = None, flash_read: float = 0.0) -> Core:
    """The core of `cpu`: the CMSIS-NN backend the pinned ExecuTorch builds for it, its FPU (the
    architecture's default unless a board says; a board cannot give one to a core whose architecture
    has none, which the config and the command line refuse: `boards.fpu_error`), its clock and flash
    read cost when a board gives them."""
    from qlint.loading.lowering import target_config

    backend = target_config(cpu).backend.name.lower()
    return Core(cpu, backend, default_fpu(cpu) and fpu is not False, clock_hz, flash_read)


def _tensor(value: object) -> torch.Tensor | None:
    if isinstance(value, (tuple, list)):
        value = value[0] if value else None
    return value if isinstance(value, torch.Tensor) else None


def _arg(node: Node, index: int) -> torch.Tensor | None:
    arg = node.args[index] if len(node.args) > index else None
    return _tensor(output_value(arg)) if isinstance(arg, Node) else None


def _macs(node: Node, name: str) -> int:
    """Multiply-accumulates of a matrix product or a float convolution: each output element sums over
    the reduced dimension (a matrix product's inner one, a convolution's kernel window times its input
    channels per group). An int8 convolution's are `_conv_macs`."""
    out = numel(node)
    if name in ("convolution", "conv2d", "conv1d"):
        weight, result = _arg(node, 1), _tensor(output_value(node))
        if weight is None or result is None or result.dim() < 2 or not result.shape[1]:
            return 0
        return out * int(weight.numel()) // int(result.shape[1])
    if name in ("quantized_linear", "linear", "addmm"):
        weight = _arg(node, 1) if name != "addmm" else _arg(node, 2)
        inner = int(weight.shape[-1]) if name != "addmm" and weight is not None else (
            int(weight.shape[0]) if weight is not None else 0)
        return out * inner
    first = _arg(node, 0)
    return out * int(first.shape[-1]) if first is not None and first.dim() else 0


class ConvShape(NamedTuple):
    """An int8 convolution as CMSIS-NN reads it: input and output as (N, C, H, W), the kernel's
    (H, W) and its weights (OHWI; IHWO for a depthwise one)."""

    source: tuple[int, int, int, int]
    result: tuple[int, int, int, int]
    kernel: tuple[int, int]
    weights: int


def _nchw(tensor: torch.Tensor | None, nhwc: bool) -> tuple[int, int, int, int] | None:
    if tensor is None or tensor.dim() != 4:
        return None
    n, a, b, c = (int(d) for d in tensor.shape)
    return (n, c, a, b) if nhwc else (n, a, b, c)


def _conv_shape(node: Node, nhwc: bool) -> ConvShape | None:
    """ExecuTorch's explicit-layout kernels (`..._nhwc`) take NHWC-shaped activations, the others
    NCHW-shaped ones (their memory is channels_last either way)."""
    weight = _arg(node, 1)
    source, result = _nchw(_arg(node, 0), nhwc), _nchw(_tensor(output_value(node)), nhwc)
    if weight is None or weight.dim() != 4 or source is None or result is None or not result[1]:
        return None
    return ConvShape(source, result, (int(weight.shape[1]), int(weight.shape[2])), int(weight.numel()))


def _conv_macs(shape: ConvShape, name: str) -> int:
    """A convolution's output elements times its weights an output channel; a transposed one's
    input pixels times all its weights (each input pixel scatters the whole kernel)."""
    n, _, height, width = shape.result
    if name == "quantized_transpose_conv2d":
        return shape.source[0] * shape.source[2] * shape.source[3] * shape.weights
    return n * height * width * shape.weights


def _ints(node: Node, index: int) -> tuple[int, ...]:
    """An int-list argument (stride, padding, dilation); () for anything else a program may hold."""
    value = node.args[index] if len(node.args) > index else ()
    return tuple(value) if isinstance(value, (list, tuple)) and all(type(v) is int for v in value) else ()


def _conv_route(node: Node, shape: ConvShape) -> str:
    """The kernel `arm_convolve_wrapper_s8` (CMSIS-NN v7.0.0 on) runs a regular convolution with:
    a 1x1 kernel without padding multiplies the input as it lies ("pointwise"); so does a 1xN
    kernel over a one-row input whose stride times channels is a multiple of 4
    (`arm_convolve_1_x_n_s8`); any other copies each window into im2col first ("conv")."""
    (kernel_h, kernel_w), channels, height = shape.kernel, shape.source[1], shape.source[2]
    stride, padding, dilation = _ints(node, 3), _ints(node, 4), _ints(node, 5)
    stride_w, dilation_w = (stride or (1,))[-1], (dilation or (1,))[-1]
    if (kernel_h, kernel_w) == (1, 1) and not any(padding) and set(dilation) <= {1}:
        return "pointwise"
    if height == 1 and kernel_h == 1 and dilation_w == 1 and stride_w * channels % 4 == 0:
        return "pointwise"
    return "conv"


def _conv_class(node: Node, name: str, shape: ConvShape, core: Core) -> str:
    """The CMSIS-NN kernel a convolution runs. On MVE, `arm_depthwise_conv_wrapper_s8` runs a
    depthwise convolution of one input channel into several as a regular convolution (CMSIS-NN
    v7.0.0 on: `CONVERT_DW_CONV_WITH_ONE_INPUT_CH_AND_OUTPUT_CH_ABOVE_THRESHOLD`, 1 with GCC). A
    transposed one (`arm_transpose_conv_s8`: rows of int32 sums, requantized) has no im2col."""
    if name == "quantized_transpose_conv2d":
        return "transpose"
    if name == "quantized_depthwise_conv2d":
        one_into_many = shape.source[1] == 1 and shape.result[1] > 1
        return _conv_route(node, shape) if one_into_many and core.backend == "mve" else "depthwise"
    return _conv_route(node, shape)


def _windows(shape: ConvShape) -> int:
    """Output pixels times kernel positions: the im2col copies of a regular convolution (one a
    kernel position for each output pixel in `arm_convolve_s8`)."""
    n, _, height, width = shape.result
    return n * height * width * shape.kernel[0] * shape.kernel[1]


def _weights_streamed(node: Node, name: str) -> int:
    """Bytes of weights a call reads once from flash: a linear layer's (each weight one MAC an
    inference). A convolution reuses its weights for every output pixel (the data cache holds
    them) and a batch matmul multiplies activations."""
    weight = _arg(node, 1) if name == "quantized_linear" else None
    return int(weight.numel()) * weight.element_size() if weight is not None else 0


def _conv_cost(table: CostTable, core: Core, node: Node, name: str) -> tuple[int, str, float] | None:
    nhwc = name.endswith("_nhwc")
    name = name.removesuffix("_nhwc")
    shape = _conv_shape(node, nhwc)
    if shape is None:
        return None
    kind = _conv_class(node, name, shape, core)
    macs = _conv_macs(shape, name)
    windows = _windows(shape) if kind == "conv" else 0
    return macs, "MAC", table.kernel(core, kind).cycles(macs, numel(node), windows)


def _int8_cost(table: CostTable, core: Core, node: Node, name: str) -> tuple[int, str, float]:
    elements = numel(node)
    if name.removesuffix("_nhwc") in CONVS and (priced := _conv_cost(table, core, node, name)) is not None:
        return priced
    if name in MATMULS:
        kernel, macs = table.kernel(core, "linear"), _macs(node, name)
        # weights read once from flash stream while the MACs run: the slower of the two counts
        streamed = _weights_streamed(node, name) * core.flash_read
        return macs, "MAC", kernel.cycles(macs, elements) + max(0.0, streamed - kernel.per_mac * macs)
    if name in CONVERSIONS and not core.fpu:  # the kernel scales in float: soft float without an FPU
        return elements, "element", elements * table.fp32_element(core, table.conversion)
    if "pool" in name:  # a pool reads every element of its window
        reads = numel(node.args[0]) if node.args and isinstance(node.args[0], Node) else elements
        return reads, "element", table.kernel(core, "pool").cycles(0, reads)
    kind = "quantize" if name in CONVERSIONS else "copy" if name in COPIES else "elementwise"
    return elements, "element", table.kernel(core, kind).cycles(0, elements)


def _fp32_cost(table: CostTable, core: Core, node: Node, name: str) -> tuple[int, str, float]:
    if name in FP32_MATMULS:
        macs = _macs(node, name)
        return macs, "MAC", macs * table.fp32_work(core, table.mac) + numel(node) * table.fp32_loop
    inputs = [numel(a) for a in node.all_input_nodes]
    elements = max([numel(node), *inputs])  # a reduction reads more than it writes
    return elements, "element", elements * table.fp32_element(core, table.arithmetic_of(name))


def op_cost(view: GraphView, node: Node, core: Core, table: CostTable | None = None) -> OpCost | None:
    """The estimate of one call, None for what runs no code on the device."""
    table = table or cost_table()
    if node.op != "call_function":
        return None
    full = op_name(node)
    name = base_name(full)
    if name in ALIASES:
        return None
    kind = view.kind(node)
    if kind in (Kind.CONSTANT, Kind.DELEGATE):  # a delegate call is the NPU's work (`npu_op`)
        return None
    # time spent on float values: float ops (work on constants too: the device computes it every
    # inference, QL008's point), float copies, and converting to and from them
    fp32 = (kind in (Kind.FP_COMPUTE, Kind.QUANTIZE, Kind.DEQUANTIZE) or constant_fp32(view, node)
            or (kind == Kind.SHAPE and _is_float_tensor(node)))
    if fp32 and name not in COPIES and name not in CONVERSIONS:
        work, unit, cycles = _fp32_cost(table, core, node, name)
    elif kind == Kind.SHAPE or name in COPIES:
        elements = numel(node)
        size = _tensor(output_value(node))
        width = size.element_size() if size is not None else 1
        work, unit, cycles = elements, "element", elements * width * table.kernel(core, "copy").per_element
    else:
        work, unit, cycles = _int8_cost(table, core, node, name)
    return OpCost(node.name, full, work, unit, cycles + table.dispatch, fp32)


def _is_float_tensor(node: Node) -> bool:
    tensor = _tensor(output_value(node))
    return tensor is not None and tensor.is_floating_point()


# The unit of a delegate call's work when Vela estimated it: cycles on the NPU's clock.
NPU_CYCLE = "NPU cycle"


def npu_op(node: Node, npu: NpuEstimate, core: Core) -> OpCost:
    """A delegate call priced at Vela's estimate for its partition, on the core's clock."""
    on_core = npu.cycles * core.clock_hz / npu.clock_hz if core.clock_hz and npu.clock_hz else npu.cycles
    return OpCost(node.name, op_name(node), npu.cycles, NPU_CYCLE, on_core, False, npu=True)


def estimate(view: GraphView, core: Core, npu: Mapping[str, NpuEstimate] | None = None) -> ProgramCost:
    """Every op's estimate on `core`, in graph order; each delegate call's from `npu` (by its node name)."""
    table = cost_table()
    cost = ProgramCost(core)
    unpriced = []
    for node in view.nodes:
        if view.kind(node) == Kind.DELEGATE:
            found = (npu or {}).get(node.name)
            if found is None:
                unpriced.append(node.name)
            else:
                cost.ops.append(npu_op(node, found, core))
            continue
        estimated = op_cost(view, node, core, table)
        if estimated is not None:
            cost.ops.append(estimated)
    cost.unpriced = tuple(unpriced)
    return cost


def compare(estimate: ProgramCost, measured: ProgramCost) -> tuple[ProfileRow, ...]:
    """Per operator: calls, estimated and measured cycles, costliest measured first."""
    rows: dict[str, list[int]] = {}
    npu: dict[str, int] = {}
    estimated = {o.node: round(o.cycles) for o in estimate.ops}
    for op in measured.ops:
        name = base_name(op.op) + (" (fp32)" if op.fp32 else "")
        row = rows.setdefault(name, [0, 0, 0])
        row[0] += 1
        row[1] += estimated.get(op.node, 0)
        row[2] += round(op.cycles)
        if op.node in measured.npu_runs:
            npu[name] = npu.get(name, 0) + measured.npu_runs[op.node]
    return tuple(ProfileRow(op, calls, est, got, npu.get(op)) for op, (calls, est, got)
                 in sorted(rows.items(), key=lambda item: (-item[1][2], item[0])))
