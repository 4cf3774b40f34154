"""Can the lowered program run? Every op must receive tensors of dtypes its kernel accepts.

ExecuTorch 1.5.1's Cortex-M lowering can leave programs that look lowered but
cannot run: a float op such as `aten.hardswish` left on an int8 tensor (an NCHW
conv -> batch-norm -> hardswish block), a dequantize fed by an fp32 tensor. The
check is static first, from the dtypes recorded on the graph: a quantize of an
integer tensor, a dequantize of a float one, and an elementwise aten op probed
on one-element tensors of its input dtypes. Only an aten op on integer tensors
that is not elementwise leaves the question open; then the program is run once
on seeded inputs with the reference kernels and the first node that fails is
named.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Interpreter, Node

from qlint.graph.view import GraphView, Kind, known_operator, op_name, output_dtype, output_value, recorded_bytes
from qlint.io.limits import RUN_BUDGET_BYTES
from qlint.io.reads import first_line

INTEGER = (torch.int8, torch.int16, torch.int32, torch.uint8)


@dataclass(frozen=True)
class Invalid:
    """The first node the program cannot execute, and why."""

    node: Node
    dtypes: list[str]     # its tensor inputs' dtypes
    reason: str


def _tensor_inputs(node: Node) -> list[Node]:
    return [a for a in node.all_input_nodes if isinstance(output_value(a), torch.Tensor)]


def _dtype_names(nodes: list[Node]) -> list[str]:
    return [str(output_dtype(n)).removeprefix("torch.") for n in nodes]


def _elementwise(node: Node, inputs: list[Node]) -> bool:
    """Output shape is every tensor input's shape broadcast: one-element probes stand for it."""
    out = output_value(node)
    if not isinstance(out, torch.Tensor) or not inputs:
        return False
    try:
        shape = torch.broadcast_shapes(*(output_value(a).shape for a in inputs))
    except RuntimeError:
        return False
    return tuple(shape) == tuple(out.shape)


def _probe(node: Node, inputs: list[Node]) -> str | None:
    """Run the op on one-element tensors of its input dtypes: the kernel's refusal, or a result
    of another dtype than the graph records (a float-bounded clamp turns int16 into float32)."""

    def small(arg: Any) -> Any:
        if isinstance(arg, Node):
            val = output_value(arg)
            return torch.zeros([1] * val.dim(), dtype=val.dtype) if isinstance(val, torch.Tensor) else arg
        if isinstance(arg, (list, tuple)):
            return type(arg)(small(a) for a in arg)
        return arg

    target = node.target
    assert callable(target)
    try:
        result = target(*small(node.args), **{k: small(v) for k, v in node.kwargs.items()})
    except (NotImplementedError, RuntimeError, TypeError) as exc:
        return first_line(exc)
    expected = output_dtype(node)
    if isinstance(result, torch.Tensor) and expected is not None and result.dtype != expected:
        got, want = (str(d).removeprefix("torch.") for d in (result.dtype, expected))
        return f"it computes {got} where the program expects {want}"
    return None


def static_problem(view: GraphView, node: Node) -> Invalid | str | None:
    """An Invalid when the recorded dtypes decide the node cannot run, the string "open"
    when only running it can tell, None when it is fine."""
    kind = view.kind(node)
    inputs = _tensor_inputs(node)
    if not inputs or view.is_constant(node):
        return None
    first = output_dtype(inputs[0])
    if kind == Kind.DEQUANTIZE and first is not None and first.is_floating_point:
        producer = inputs[0]
        integer_in = [a for a in _tensor_inputs(producer) if output_dtype(a) in INTEGER]
        if producer.op == "call_function" and integer_in:  # the op that turned integers into floats
            return Invalid(
                producer, _dtype_names(_tensor_inputs(producer)),
                f"it computes {_dtype_names([producer])[0]} from {_dtype_names(integer_in)[0]} "
                f"and feeds {op_name(node)}, which needs integers",
            )
        return Invalid(node, _dtype_names(inputs), "a dequantize of a float tensor")
    if kind == Kind.QUANTIZE and first in INTEGER:
        return Invalid(node, _dtype_names(inputs), "a quantize of an integer tensor")
    name = op_name(node)
    if kind in (Kind.QUANTIZE, Kind.DEQUANTIZE, Kind.SHAPE, Kind.OTHER) or not name.startswith("aten."):
        return None
    if not known_operator(node):
        return None  # a `.pte` may name operators torch does not know: nothing to probe
    if not any(output_dtype(a) in INTEGER for a in inputs):
        return None
    if not _elementwise(node, inputs):
        return "open"
    refused = _probe(node, inputs)
    return Invalid(node, _dtype_names(inputs), refused) if refused else None


def find_invalid(view: GraphView) -> Invalid | None:
    """The first node of a lowered program that cannot run, or None."""
    open_question = False
    for node in view.nodes:
        if node.op != "call_function":
            continue
        found = static_problem(view, node)
        if isinstance(found, Invalid):
            return found
        open_question = open_question or found == "open"
    runnable = hasattr(view.program, "module") and view.lowered  # a lowered graph's shapes were re-traced
    if open_question and runnable and sum(recorded_bytes(n) for n in view.nodes) <= RUN_BUDGET_BYTES:
        return _first_failing(view)
    return None


class _Tracking(Interpreter):
    """Runs a graph node by node, remembering which node is running."""

    current: Node | None = None

    def run_node(self, n: Node) -> Any:
        self.current = n
        return super().run_node(n)


def _first_failing(view: GraphView) -> Invalid | None:
    from qlint.graph.readers import seeded_batches

    module = view.program.module()
    templates = []
    for node in module.graph.nodes:
        if node.op != "placeholder":
            continue
        val = output_value(node)
        if not isinstance(val, torch.Tensor):
            return None  # not a tensor input this check can make up
        templates.append(torch.zeros_like(val, device="cpu"))  # keeps the recorded strides
    [inputs] = seeded_batches(tuple(templates), 1, 0)
    runner = _Tracking(module)
    try:
        with torch.no_grad():
            runner.run(*inputs)
    except Exception as exc:  # the reference kernel refused: that is the finding
        failing = runner.current
        if failing is None:
            return None
        original = next((n for n in view.nodes if n.name == failing.name), failing)
        return Invalid(original, _dtype_names(_tensor_inputs(failing)), first_line(exc))
    return None
