"""The `expand-broadcasts` remedy: each elementwise add, sub, mul or div whose operands broadcast
gets them expanded to its output shape, before `prepare_pt2e`.

CortexMQuantizer's add/mul and div checks take operands of one shape (add/mul also a per-channel
`[N, C, 1, 1]` operand of a channels_last tensor), so `x + pos_embedding[:T]` with `x` `[1, T, C]`
and the embedding `[T, C]`, or `scores + mask` with a `[1, 1, 1, T]` mask, stays fp32 although
both operands could be int8. `expand` is a view the quantizer passes qparams through, and the op
then lowers to `cortex_m.quantized_add` / `quantized_mul`. Exact in float; the quantized program
is not (the operand gets quantized, and an expanded runtime operand takes arena bytes), which
is why it is an unsafe fix measured like the others. A one-element constant operand is left
alone: `x * c` is a constant-scale island (QL001) that `--fix` folds, not a broadcast to materialize.
`expand_broadcasts` is public: the line a user adds to their own export script.
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
_OPS = (_aten.add.Tensor, _aten.sub.Tensor, _aten.mul.Tensor, _aten.div.Tensor)
_CHANNEL_BROADCAST_OPS = (_aten.add.Tensor, _aten.mul.Tensor)  # what the add/mul check accepts on channels_last


class ExpandBroadcasts(SitedRemedy):
    """Expand the broadcast operands of every elementwise add, sub, mul and div to the op's output shape."""

    name = RemedyName.EXPAND_BROADCASTS
    public = "expand_broadcasts"
    none_found = ("no add, sub, mul or div of the exported model has operands that broadcast "
                  "(one-element constants aside)")

    def nodes(self, graph: Any) -> list[Any]:
        return broadcast_nodes(graph)

    def on_graph(self, graph: Any) -> Any:
        return expand_broadcasts(graph, skip=self.skip)


def _value(arg: Any) -> torch.Tensor | None:
    value = arg.meta.get("val") if isinstance(arg, Node) else None
    return value if isinstance(value, torch.Tensor) and value.is_floating_point() else None


def _constant_scalar(arg: Any) -> bool:
    """A one-element constant: `x * c` is a constant-scale island (QL001) `--fix` folds, no broadcast to expand."""
    value = _value(arg)
    return value is not None and value.numel() == 1 and arg.op == "get_attr"


def _to_expand(node: Node) -> list[int]:
    """Which of the op's two operands to expand to its output shape (none when the Cortex-M check
    already takes the operands as they are, or one is a one-element constant)."""
    from executorch.backends.cortex_m.passes.passes_utils import is_channel_broadcast, is_channels_last

    if node.op != "call_function" or node.target not in _OPS or len(node.args) < 2:
        return []
    values = [_value(a) for a in node.args[:2]]
    out = node.meta.get("val")
    if any(v is None for v in values) or not isinstance(out, torch.Tensor):
        return []
    first, second = values[0], values[1]
    assert first is not None and second is not None
    if first.shape == second.shape or any(_constant_scalar(a) for a in node.args[:2]):
        return []
    if node.target in _CHANNEL_BROADCAST_OPS and is_channel_broadcast(first, second) and is_channels_last(first):
        return []
    return [i for i, v in enumerate(values) if v is not None and v.shape != out.shape]


def broadcast_nodes(graph: Any) -> list[Node]:
    """The graph's elementwise ops whose operands this remedy expands, in graph order."""
    return [n for n in graph.graph.nodes if _to_expand(n)]


def expand_broadcasts(graph: GraphModule, *, skip: Collection[str] = ()) -> GraphModule:
    """The graph module with the broadcast operands of each add, sub, mul and div expanded to the op's
    output shape, so CortexMQuantizer's checks take it as an int8 op.

    For an export script: call it on `torch.export.export(...).module()` before `prepare_pt2e`.
    `skip` names (by module path, `site_name`) the ops to leave as they are.
    """
    return rewrite_each(graph, broadcast_nodes(graph), lambda node: None, lambda node, _: _expand(graph, node),
                        skip_unsupported=False, skip=skip, verb="expand")


def _expand(graph: GraphModule, node: Node) -> None:
    shape = list(node.meta["val"].shape)
    args = list(node.args)
    for index in _to_expand(node):
        with graph.graph.inserting_before(node):
            args[index] = node_for(graph, node, _aten.expand.default, (args[index], shape))
    node.args = tuple(args)
