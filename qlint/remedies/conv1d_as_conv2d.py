"""The `conv1d-as-conv2d` remedy: each 1-D convolution run as a channels_last 2-D convolution over
`[N, C, 1, L]`, before `prepare_pt2e`.

CortexMQuantizer has no `conv1d` pattern outside its experimental explicit-layout mode, so an
audio front end's `Conv1d` (Whisper's two, a keyword spotter's) stays fp32. A 1-D convolution is a
2-D one with a kernel of height 1, and `CortexMConv2DCheck` takes a 2-D convolution whose tensors
are channels_last, which `cortex_m.quantized_conv2d` then runs:

    x4 = unsqueeze(x, 2).clone(memory_format=channels_last)   [N, C, 1, L], NHWC in memory
    y4 = conv2d(x4, weight.unsqueeze(2), bias, [1, s], [0, p], [1, d], groups)   (`padding="same"`
         with an odd total: the input zero-padded first, `constant_pad_nd`, and p = 0)
    y  = squeeze(y4.clone(memory_format=contiguous_format), 2)

The two clones are int8 copies that change the layout (`_clone_dim_order`), so every view on
either side keeps ExecuTorch's default dim order. Exact in float up to the convolution's own
summation order; the quantized program is not, which is why it is an unsafe fix measured like the
others. `conv1d_as_conv2d` is public: the line a user adds to their own export script.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from qlint.loading import stack

stack.load()

import torch  # noqa: E402
from torch.fx import GraphModule, Node  # noqa: E402

from qlint.remedies.remedy import SitedRemedy, node_for, rewrite_each  # noqa: E402
from qlint.settings.config import RemedyName  # noqa: E402

_aten = torch.ops.aten
_CONV1D = (_aten.conv1d.default, _aten.conv1d.padding)  # `.padding`: "same" or "valid"
# conv1d's arguments after input and weight, with their defaults
_DEFAULTS = (("bias", None), ("stride", [1]), ("padding", [0]), ("dilation", [1]), ("groups", 1))


class Conv1dAsConv2d(SitedRemedy):
    """Run every 1-D convolution as a channels_last 2-D convolution of kernel height 1."""

    name = RemedyName.CONV1D_AS_CONV2D
    public = "conv1d_as_conv2d"
    none_found = "the exported model has no 1-D convolution"

    def nodes(self, graph: Any) -> list[Any]:
        return conv1d_nodes(graph)

    def why_not(self, graph: Any, node: Any) -> str | None:
        return not_rewritable(graph, node)

    def on_graph(self, graph: Any) -> Any:
        return conv1d_as_conv2d(graph, skip_unsupported=True, skip=self.skip)


def conv1d_nodes(graph: Any) -> list[Node]:
    """The graph's 1-D convolutions (numeric or string padding), in graph order."""
    return [n for n in graph.graph.nodes if n.op == "call_function" and n.target in _CONV1D]


def _padding(node: Node, weight: torch.Tensor) -> tuple[int, int]:
    """The zeros the convolution pads on the left and on the right: `"valid"` none, `"same"`
    `dilation * (kernel - 1)` in all, the odd one on the right (as torch pads it)."""
    args = _conv_args(node)
    padding, dilation = args["padding"], args["dilation"]
    if not isinstance(padding, str):
        each = int(padding[0] if isinstance(padding, (list, tuple)) else padding)
        return each, each
    if padding == "valid":
        return 0, 0
    total = int(dilation[0] if isinstance(dilation, (list, tuple)) else dilation) * (weight.shape[-1] - 1)
    return total // 2, total - total // 2


def _conv_args(node: Node) -> dict[str, Any]:
    names = ("input", "weight", *(name for name, _ in _DEFAULTS))
    return {**dict(_DEFAULTS), **dict(zip(names, node.args, strict=False)), **node.kwargs}


def _parameter(graph: GraphModule, node: Any) -> torch.Tensor | None:
    """The tensor a `get_attr` node reads, or None for anything else (a weight computed in the graph)."""
    if not isinstance(node, Node) or node.op != "get_attr":
        return None
    value: Any = graph
    for part in str(node.target).split("."):
        value = getattr(value, part, None)
    return value if isinstance(value, torch.Tensor) else None


def not_rewritable(graph: GraphModule, node: Node) -> str | None:
    """Why this `conv1d` cannot run as a 2-D convolution here, or None when it can."""
    args = _conv_args(node)
    value = args["input"].meta.get("val") if isinstance(args["input"], Node) else None
    if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.dim() != 3:
        return f"{node.name}: its input has no float [N, C, L] value recorded"
    weight = _parameter(graph, args["weight"])
    if weight is None or weight.dim() != 3:
        return f"{node.name}: its weight is computed in the graph, not a parameter"
    if args["bias"] is not None and not isinstance(args["bias"], Node):
        return f"{node.name}: its bias {args['bias']!r} is not a tensor"
    return None


def conv1d_as_conv2d(graph: GraphModule, *, skip_unsupported: bool = False,
                     skip: Collection[str] = ()) -> GraphModule:
    """The graph module with each `conv1d` run as a channels_last `conv2d` over `[N, C, 1, L]`.

    For an export script: call it on `torch.export.export(...).module()` before `prepare_pt2e`.
    Raises ValueError naming one that cannot be rewritten, unless `skip_unsupported`, which leaves
    that one as it is. `skip` names (by module path, `site_name`) the ones to leave as they are.
    """
    return rewrite_each(graph, conv1d_nodes(graph), lambda node: not_rewritable(graph, node),
                        lambda node, index: _rewrite(graph, node, f"_qlint_conv1d_{index}_weight"),
                        skip_unsupported=skip_unsupported, skip=skip, verb="rewrite")


def _rewrite(graph: GraphModule, node: Node, weight_name: str) -> None:
    args = _conv_args(node)
    weight = _parameter(graph, args["weight"])
    assert weight is not None  # `not_rewritable` said so
    graph.register_buffer(weight_name, weight.detach().unsqueeze(2).clone())

    def add(target: Any, args_: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> Node:
        return node_for(graph, node, target, args_, kwargs)

    def pair(values: Any, first: int) -> list[int]:
        """conv2d's [height, width] for conv1d's one value: `first` over the height of 1."""
        return [first, int(values[0] if isinstance(values, (list, tuple)) else values)]

    left, right = _padding(node, weight)
    with graph.graph.inserting_before(node):
        x = args["input"]
        if left != right:  # "same" with an odd total: conv2d pads both sides alike, so pad the input first
            x = add(_aten.constant_pad_nd.default, (x, [left, right]))
            left = 0
        rows = add(_aten.unsqueeze.default, (x, 2))
        nhwc = add(_aten.clone.default, (rows,), {"memory_format": torch.channels_last})
        conv = add(_aten.conv2d.default, (nhwc, add("get_attr", (weight_name,)), args["bias"],
                                          pair(args["stride"], 1), [0, left],
                                          pair(args["dilation"], 1), args["groups"]))
        nchw = add(_aten.clone.default, (conv,), {"memory_format": torch.contiguous_format})
        result = add(_aten.squeeze.dim, (nchw, 2))
    node.replace_all_uses_with(result)
    graph.graph.erase_node(node)
