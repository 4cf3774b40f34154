"""Can the lowered program run, and does it compute what the quantized program computes?

ExecuTorch 1.5.1's Cortex-M lowering can leave programs that look lowered but
cannot run: a float op such as `aten.hardswish` left on an int8 tensor (an NCHW
conv -> batch-norm -> hardswish block), a dequantize fed by an fp32 tensor, a
Cortex-M integer kernel reading a float tensor (the lowering folded the quantize
after a constant op such as `aten.full` away, expecting a pass that computes it
ahead of time, which the Cortex-M passes never run; the reference kernels
convert the floats, the device reads their bytes as integers). The check is
static first, from the dtypes recorded on the graph: a quantize of an integer
tensor, a dequantize of a float one, an integer kernel with a float input, and
an elementwise aten op probed on one-element tensors of its input dtypes. Only
an aten op on integer tensors that is not elementwise leaves the question open;
then the program is run once on seeded inputs with the reference kernels and
the first node that fails is named. A program that runs is then run against the
quantized program it was lowered from (`qlint.analysis.values`): a lowering that
changes the values cannot run correctly either.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, overload

import torch
from torch.fx import Node

from qlint.analysis.values import (
    DelegateRunner,
    Divergence,
    NotRun,
    OverBudget,
    Runnable,
    Stepper,
    Unchecked,
    by_name,
    first_divergence,
    held,
    read_as,
    same_reading,
)
from qlint.io.reads import first_line
from qlint.loading.inputs import made_up_inputs
from qlint.loading.view import (
    GraphView,
    Kind,
    base_name,
    folded_qparams,
    known_operator,
    op_name,
    output_dtype,
    output_value,
    torch_dtype,
)
from qlint.rules.qparams import QParams

INTEGER = (torch.int8, torch.int16, torch.int32, torch.uint8)


@dataclass(frozen=True)
class FloatRead:
    """A Cortex-M integer kernel reading a float tensor, and the quantize the lowering folded away
    between them: its qparams, as the lowering recorded them on the producer (`output_qparams`),
    when it did. Putting that quantize back makes the kernel read what the quantized program gives it."""

    kernel: Node
    producer: Node            # the op whose output quantize was folded away
    qparams: QParams | None
    through: tuple[Node, ...] = ()  # data movement between them that the lowering meant to run on the integers


@dataclass(frozen=True)
class Invalid:
    """The first node the program cannot execute (or computes wrongly), and why."""

    node: Node
    dtypes: list[str]     # its tensor inputs' dtypes
    reason: str
    float_read: FloatRead | None = None     # when it is an integer kernel reading a float
    divergence: Divergence | None = None    # when it runs but computes other values


FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def float_reads(view: GraphView) -> list[FloatRead]:
    """Every Cortex-M integer kernel input that is a float tensor, in graph order."""
    return [read for node in view.nodes for read in float_reads_of(view, node)]


@dataclass(frozen=True)
class IntegerClamp:
    """An activation the lowering left on the integers with the float model's bounds (a relu clamps
    the integers at 0, not at the zero point), and the bounds that compute it there: the float bounds
    quantized as its input and output are read (one way: a clamp of integers cannot requantize)."""

    node: Node
    bounds: tuple[float | None, float | None]   # as the model wrote them (min, max)
    integers: tuple[int | None, int | None]     # quantized
    qparams: QParams


# Activations that clamp, and the (min, max) they clamp at from their arguments after the input (None:
# arguments these are not).
CLAMP_BOUNDS: dict[str, Callable[[tuple[Any, ...], dict[str, Any]], tuple[Any, Any] | None]] = {
    "relu": lambda args, kwargs: None if args or kwargs else (0.0, None),
    "clamp": lambda args, kwargs: (args[0] if args else kwargs.get("min"),
                                   args[1] if len(args) > 1 else kwargs.get("max")),
    "hardtanh": lambda args, kwargs: (args[0] if args else kwargs.get("min_val", -1.0),
                                      args[1] if len(args) > 1 else kwargs.get("max_val", 1.0)),
}


def _activation(node: Node) -> str:
    """`relu` for `aten.relu_.default` too."""
    return base_name(op_name(node)).removesuffix("_")


def _bounds(node: Node) -> tuple[float | None, float | None] | None:
    """The (min, max) a clamping activation's arguments say, or None when it is none or a bound is no number."""
    name = op_name(node)
    clamp = CLAMP_BOUNDS.get(_activation(node))
    if clamp is None or not name.startswith("aten.") or not name.endswith(".default"):
        return None
    bounds = clamp(tuple(node.args[1:]), dict(node.kwargs))
    if bounds is None or any(b is not None and (isinstance(b, bool) or not isinstance(b, int | float)) for b in bounds):
        return None
    return bounds


def _quantized(bound: float | None, qp: QParams) -> int | None:
    """A bound as the quantized program's quantize writes it (its own op, on a float32 bound)."""
    if bound is None:
        return None
    quantize = torch.ops.quantized_decomposed.quantize_per_tensor.default
    return int(quantize(torch.tensor([float(bound)]), qp.scale, qp.zero_point, qp.qmin, qp.qmax, torch_dtype(qp))[0])


def integer_clamps(view: GraphView) -> list[IntegerClamp]:
    """Every clamping activation of the lowered program that clamps integers at the bounds the quantized
    program clamps the floats at, where quantizing them changes them: in graph order."""
    found = []
    for node in view.nodes:
        bounds = _bounds(node) if node.op == "call_function" and node.args else None
        source = node.args[0] if bounds is not None else None
        if bounds is None or not isinstance(source, Node) or output_dtype(source) not in INTEGER:
            continue
        twin = view.as_quantized(node)
        if twin is node or _activation(twin) != _activation(node) or _bounds(twin) != bounds:
            continue  # not the model's activation, or a pass changed its bounds
        read, written = read_as(view, source), read_as(view, node)
        if read is None or written is None or not same_reading(read, written):
            continue
        integers = (_quantized(bounds[0], read), _quantized(bounds[1], read))
        if integers != bounds:
            found.append(IntegerClamp(node, bounds, integers, read))
    return found


def restorable(view: GraphView, invalid: Invalid) -> bool:
    """Whether `--fix` can make the program valid: the problem is a float read, and the lowering
    recorded the qparams of every quantize it folded away before an integer kernel; or it is a
    clamping activation on the integers with the float model's bounds (`integer_clamps`)."""
    if invalid.float_read is not None:
        return all(read.qparams is not None for read in float_reads(view))
    return any(clamp.node is invalid.node for clamp in integer_clamps(view))


def _float_read_problem(read: FloatRead) -> Invalid:
    integers = read.qparams.dtype if read.qparams is not None else "integers"
    return Invalid(
        read.kernel, _dtype_names(_tensor_inputs(read.kernel)),
        f"it reads the {_dtype_names([read.producer])[0]} output of {op_name(read.producer)} "
        f"({read.producer.name}) where its kernel expects {integers}: the lowering folded the quantize "
        "between them away and no Cortex-M pass computes it ahead of time, so the device reads the "
        "float's bytes as integers",
        float_read=read,
    )


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
    read = next((r for r in float_reads_of(view, node)), None)
    if read is not None:
        return _float_read_problem(read)
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


def float_reads_of(view: GraphView, node: Node) -> list[FloatRead]:
    """The float inputs of one Cortex-M integer kernel."""
    if node.op != "call_function" or not op_name(node).startswith("cortex_m.") \
            or view.kind(node) in (Kind.QUANTIZE, Kind.DEQUANTIZE):  # a dequantize of floats: static_problem's
        return []
    reads = [_float_read(view, node, arg) for arg in _tensor_inputs(node) if output_dtype(arg) in FLOATS]
    return [read for read in reads if not _integer_kernel(view, read.producer)]


def _integer_kernel(view: GraphView, node: Node) -> bool:
    """A Cortex-M kernel that computes integers, whatever dtype its recorded output has (a kernel
    that read floats records a float output, which is only the misread passed on)."""
    return op_name(node).startswith("cortex_m.") and view.op_kind(node) != Kind.DEQUANTIZE


def _float_read(view: GraphView, kernel: Node, arg: Node) -> FloatRead:
    """Back from the kernel's float input through data movement the lowering annotated as running on
    integers (it records `input_qparams` on it) to the op whose quantize it folded away."""
    through: list[Node] = []
    producer = arg
    while (view.op_kind(producer) == Kind.SHAPE and producer.meta.get("input_qparams") and producer.args
           and isinstance(producer.args[0], Node) and output_dtype(producer.args[0]) in FLOATS):
        through.append(producer)
        producer = producer.args[0]
    qparams = folded_qparams(producer)
    if qparams is not None and any(folded_qparams(n) != qparams for n in through):
        qparams = None  # data movement that requantizes: nothing to restore with confidence
    return FloatRead(kernel, producer, qparams, tuple(reversed(through)))


@overload
def find_invalid(view: GraphView, batches: Sequence[tuple[Any, ...]] = (),
                 delegates: None = None) -> Invalid | Unchecked | None: ...
@overload
def find_invalid(view: GraphView, batches: Sequence[tuple[Any, ...]],
                 delegates: DelegateRunner) -> Invalid | Unchecked | NotRun | None: ...
def find_invalid(view: GraphView, batches: Sequence[tuple[Any, ...]] = (),
                 delegates: DelegateRunner | None = None) -> Invalid | Unchecked | NotRun | None:
    """The first node of a lowered program that cannot run, or None. With `batches` and the quantized
    program the view was made with, a program that runs is also run against it on them: the first
    node whose values the lowering changed, each delegate call computed by `delegates` (NotRun where
    it cannot be). Unchecked when a run this needs would hold more than the check may
    (`values.RUN_BUDGET_BYTES`): where it stopped."""
    open_question = False
    for node in view.nodes:
        if node.op != "call_function":
            continue
        found = static_problem(view, node)
        if isinstance(found, Invalid):
            return found
        open_question = open_question or found == "open"
    if not (hasattr(view.program, "module") and view.lowered):  # a lowered graph's shapes were re-traced
        return None
    failing = _first_failing(view) if open_question else None
    if failing is not None or view.quantized is None or not batches:
        return failing
    diverged = first_divergence(view, batches, delegates)
    return _divergence_problem(diverged) if isinstance(diverged, Divergence) else diverged


def _divergence_problem(diverged: Divergence) -> Invalid:
    node = diverged.node
    return Invalid(
        node, _dtype_names(_tensor_inputs(node)),
        f"it computes other values than the quantized program's {diverged.reference.name}: "
        f"{diverged.lowered:.6g} where that gives {diverged.expected:.6g} ({diverged.steps:.0f} quantization "
        f"steps apart, on input {diverged.batch}, its inputs taken from the quantized program where both "
        "programs hold them)",
        divergence=diverged,
    )


def _first_failing(view: GraphView) -> Invalid | Unchecked | None:
    module = view.module
    inputs = made_up_inputs(module)
    if inputs is None:
        return None  # an input this check cannot make up
    runner = Stepper(Runnable(module, list), inputs, held("run"), "lowered")
    try:
        with torch.no_grad():
            runner.run_all()
    except OverBudget as over:
        return replace(over.unchecked, node=by_name(view.nodes, over.unchecked.node))
    except Exception as exc:  # the reference kernel refused: that is the finding
        failing = runner.current
        if failing is None:
            return None
        return Invalid(by_name(view.nodes, failing), _dtype_names(_tensor_inputs(failing)), first_line(exc))
    return None
