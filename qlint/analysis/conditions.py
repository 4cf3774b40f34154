"""The conditions of ExecuTorch's Cortex-M checks, one by one, with the values that fail them.

`CortexMQuantizer` accepts or refuses a pattern with one boolean per checker
(`executorch/backends/cortex_m/quantizer/pattern_checkers.py`), and the Cortex-M
lowering keeps some accepted ops in fp32 (`aten_to_cortex_m_pass.py`). A user told
"refused by CortexMConvTranspose2DCheck" does not know which of its four conditions
failed, and a fixed sentence per checker names the wrong one. Here each condition
is written out as executorch 1.5.1 states it (its own predicates are called where
it has them: `is_channels_last`, `is_channel_broadcast`, `is_foldable_alpha`), and
a failed condition carries the node's own values and the export change that meets
it, or says that none does. `tests/slow/test_executorch_corpus.py` holds these against
the checkers themselves on every node of ExecuTorch's own Cortex-M test models: a
checker that refuses what these accept (or the reverse) fails the suite, which is
how a new executorch release gets noticed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:  # annotations only: the docs test reads the table without torch
    from torch.fx import Node

EXECUTORCH = "executorch 1.5.1"
CHANNELS_LAST = ("export with model.to(memory_format=torch.channels_last) and channels_last example inputs "
                 "(for a config target: the channels-last remedy, qlint fix --unsafe-fixes)")


@dataclass(frozen=True)
class Failed:
    """One condition a node does not meet: its values, what the check requires, the change that meets it
    ("" when no change to the export gives the op an int8 path)."""

    values: str
    requires: str
    change: str = ""

    def __str__(self) -> str:
        return f"{self.values} ({self.requires})"


def remedy(failed: list[Failed]) -> str:
    """The changes that meet every failed condition, or that none can: one unmet condition keeps the op fp32."""
    if any(not f.change for f in failed):
        return f"no export change gives it an int8 path in {EXECUTORCH}"
    changes = list(dict.fromkeys(f.change for f in failed))
    return "fix: " + "; and ".join(changes)


def tensor(node: Node) -> Any:
    """The node's recorded output (the first one of several), as ExecuTorch's `get_first_fake_tensor` reads it."""
    val = node.meta.get("val")
    return val[0] if isinstance(val, (list, tuple)) and val else val


def shape(node: Node) -> list[int]:
    return [int(s) for s in tensor(node).shape]


def layout(value: Any) -> str:
    """`channels_last` or `NCHW (dim order 0, 1, 2, 3)`, as ExecuTorch's `is_channels_last` sees the tensor."""
    from executorch.backends.cortex_m.passes.passes_utils import is_channels_last

    if is_channels_last(value):
        return "channels_last"
    order = ", ".join(str(d) for d in value.dim_order())
    return f"{value.ndim}-D, dim order {order}" if value.ndim != 4 else f"NCHW (dim order {order})"


def _alpha(node: Node) -> list[Failed]:
    from executorch.backends.cortex_m.passes.passes_utils import is_foldable_alpha

    alpha = node.kwargs.get("alpha", 1)
    if is_foldable_alpha(alpha):
        return []
    sign = "-" if "sub" in str(node.target) else "+"
    return [Failed(f"alpha={alpha!r}", "quantized_add folds only an integer alpha into its operand multiplier",
                   f"scale the second operand instead of passing alpha: `x {sign} y * {alpha!r}` (the {_op(node)} "
                   "becomes quantized_add; the scale is a constant-scale island, QL001, that qlint check --fix folds "
                   "when exact)")]


def _broadcast_change(a: list[int], b: list[int]) -> str:
    """Expand whichever operands need it to the shape the op broadcasts them to."""
    import torch

    full = list(torch.broadcast_shapes(tuple(a), tuple(b)))
    which = [name for name, s in (("the first operand", a), ("the second operand", b)) if s != full]
    return (f"expand {' and '.join(which)} to {full} (`.expand({', '.join(map(str, full))})`) before the op "
            "(for a config target: the expand-broadcasts remedy, qlint fix --unsafe-fixes)")


def _one_shape(node: Node, allow_channel_broadcast: bool) -> list[Failed]:
    """`CortexMAddMulCheck`/`CortexMDivCheck`: operands of one shape (add/mul: or a per-channel operand
    of a channels_last tensor)."""
    from executorch.backends.cortex_m.passes.passes_utils import is_channel_broadcast, is_channels_last

    if len(node.all_input_nodes) != 2:
        return []
    first, second = (tensor(n) for n in node.all_input_nodes)
    if first.shape == second.shape:
        return []
    if allow_channel_broadcast and is_channel_broadcast(first, second) and is_channels_last(first):
        return []
    a, b = [int(s) for s in first.shape], [int(s) for s in second.shape]
    if allow_channel_broadcast:
        requires = ("quantized add/mul take operands of one shape, or a per-channel [N, C, 1, 1] operand "
                    "of a channels_last tensor")
    else:
        requires = "the int8 div kernel takes operands of one shape: division is not commutative, so no broadcast"
    return [Failed(f"operand shapes {a} and {b}", requires, _broadcast_change(a, b))]


def add_mul(pattern: list[Node]) -> list[Failed]:
    return [f for node in pattern for f in (_alpha(node) or _one_shape(node, allow_channel_broadcast=True))]


def div(pattern: list[Node]) -> list[Failed]:
    return [f for node in pattern for f in _one_shape(node, allow_channel_broadcast=False)]


def conv2d(pattern: list[Node]) -> list[Failed]:
    """`CortexMConv2DCheck`: every node of the pattern produces a channels_last tensor."""
    from executorch.backends.cortex_m.passes.passes_utils import is_channels_last

    return [Failed(f"{_op(node)} output {shape(node)} is {layout(tensor(node))}",
                   "CMSIS-NN convolutions run on channels_last tensors", CHANNELS_LAST)
            for node in pattern if not is_channels_last(tensor(node))]


def conv_transpose2d(pattern: list[Node]) -> list[Failed]:
    """`CortexMConvTranspose2DCheck`: channels_last, no output_padding, groups=1, no dilation
    (arguments read at their `aten.conv_transpose2d.input` positions, only when given, as the check does)."""
    from executorch.backends.cortex_m.passes.passes_utils import is_channels_last

    failed = []
    for node in pattern:
        value = tensor(node)
        if not is_channels_last(value):
            failed.append(Failed(f"{_op(node)} output {shape(node)} is {layout(value)}",
                                 "CMSIS-NN's transpose convolution runs on channels_last tensors", CHANNELS_LAST))
        args = node.args
        padding = args[5] if len(args) >= 6 else None
        if isinstance(padding, (list, tuple)) and any(p != 0 for p in padding):
            failed.append(Failed(f"output_padding={list(padding)}",
                                 "CMSIS-NN's transpose convolution takes no output padding"))
        groups = args[6] if len(args) >= 7 else None
        if isinstance(groups, int) and groups > 1:
            failed.append(Failed(f"groups={groups}", "CMSIS-NN's transpose convolution takes groups=1"))
        dilation = args[7] if len(args) >= 8 else None
        if isinstance(dilation, (list, tuple)) and any(d != 1 for d in dilation):
            failed.append(Failed(f"dilation={list(dilation)}",
                                 "CMSIS-NN's transpose convolution gives wrong results with dilation, so the "
                                 "check refuses it"))
    return failed


def softmax(pattern: list[Node]) -> list[Failed]:
    """`CortexMSoftmaxCheck`: over the last dimension of a contiguous tensor, or over the channels of a
    channels_last one."""
    from executorch.backends.cortex_m.passes.passes_utils import is_channels_last

    node = pattern[0]
    value = tensor(node)
    rank = len(value.shape)
    dim = cast(int, node.args[1]) % rank if len(node.args) > 1 else -1 % rank
    if is_channels_last(value):
        wanted = 1 if rank >= 2 else rank - 1
        if dim == wanted:
            return []
        return [Failed(f"softmax over dim={dim} of a channels_last tensor {shape(node)}",
                       "on a channels_last tensor CMSIS-NN's softmax runs over the channels, dim=1")]
    if dim == rank - 1:
        return []
    return [Failed(f"softmax over dim={dim} of a {rank}-D tensor {shape(node)}",
                   "CMSIS-NN's softmax runs over the last dimension",
                   f"move that dimension last: `x.transpose({dim}, -1).softmax(-1).transpose({dim}, -1)`")]


def avg_pool2d(pattern: list[Node]) -> list[Failed]:
    """`CortexMAvgPool2DCheck`: no divisor_override."""
    node = pattern[0]
    override = node.args[6] if len(node.args) > 6 else None
    if override is None:
        return []
    return [Failed(f"divisor_override={override}", "CMSIS-NN's average pool divides by the window it reads")]


def bmm(pattern: list[Node]) -> list[Failed]:
    """`CortexMBmmCheck`: two 3-D operands of one batch whose inner dimensions match."""
    failed = []
    for node in pattern:
        if len(node.all_input_nodes) != 2:
            continue
        a, b = (shape(n) for n in node.all_input_nodes)
        if len(a) != 3 or len(b) != 3 or a[0] != b[0] or a[2] != b[1]:
            failed.append(Failed(f"operand shapes {a} and {b}",
                                 "CMSIS-NN's batch matmul takes [B, M, K] @ [B, K, N]"))
    return failed


def accepts(pattern: list[Node]) -> list[Failed]:
    """A checker with no pattern condition (linear, the LUT activations, max pool)."""
    return []


# Checker class name -> its pattern conditions, for the checkers of CORTEX_M_QUANTIZER_SUPPORT_DICT.
PATTERN_CONDITIONS: dict[str, Callable[[list[Node]], list[Failed]]] = {
    "CortexMAddMulCheck": add_mul,
    "CortexMDivCheck": div,
    "CortexMConv2DCheck": conv2d,
    "CortexMConvTranspose2DCheck": conv_transpose2d,
    "CortexMSoftmaxCheck": softmax,
    "CortexMAvgPool2DCheck": avg_pool2d,
    "CortexMBmmCheck": bmm,
    "CortexMLinearCheck": accepts,
    "CortexMActivationCheck": accepts,
    "CortexMMaxPool2DCheck": accepts,
}


def _pair(raw: Any, default: tuple[int, int]) -> tuple[int, int]:
    if raw is None:
        return default
    items = [int(v) for v in raw] if isinstance(raw, (list, tuple)) else [int(raw)]
    return (items[0], items[-1]) if items else default


def max_pool2d_lowering(node: Node) -> list[Failed]:
    """The lowering keeps a max pool with dilation or ceil_mode in fp32 (the check accepts it, then tags
    it `skip_quantized_max_pool2d`)."""
    args = node.args
    dilation = _pair(args[4] if len(args) > 4 else None, (1, 1))
    ceil_mode = bool(args[5]) if len(args) > 5 and args[5] is not None else False
    failed = []
    if dilation != (1, 1):
        failed.append(Failed(f"dilation={list(dilation)}", "CMSIS-NN's max pool takes no dilation"))
    if ceil_mode:
        failed.append(Failed("ceil_mode=True", "CMSIS-NN's max pool rounds its output size down"))
    return failed


def avg_pool2d_lowering(node: Node) -> list[Failed]:
    return avg_pool2d([node])


# Pattern op -> conditions the Cortex-M lowering adds after the quantizer accepted the op.
LOWERING_CONDITIONS: dict[str, Callable[[Node], list[Failed]]] = {
    "max_pool2d": max_pool2d_lowering,
    "max_pool2d_with_indices": max_pool2d_lowering,
    "avg_pool2d": avg_pool2d_lowering,
}

# Ops no pattern lists, and the equal form that a pattern does list (fused after conv2d, linear, add).
EQUIVALENT_FORMS = {
    "relu6": ("hardtanh", "write it as `F.hardtanh(x, 0.0, 6.0)` (equal to F.relu6), which CortexMQuantizer's "
                          "conv2d, linear and add patterns fuse"),
}


def _op(node: Node) -> str:
    target = node.target
    name = getattr(target, "_opname", None) or getattr(getattr(target, "_op", None), "_opname", None)
    return str(name or target).lstrip("_")
