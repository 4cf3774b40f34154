"""One view of a quantized graph, whichever dialect it is in.

qlint reads two dialects: the quantized program (`quantized_decomposed` q/dq
around aten ops, also after `to_edge`) and the lowered one (`cortex_m` kernels).
Every rule works on the `Kind` this view assigns to each node, so the island
logic exists once. The only dialect-specific question is "does this aten op run
as an integer kernel?": the lowered graph answers it by dtype; the quantized
graph by whether the Cortex-M lowering has a substitution for the op and the op
sits between dequantize and quantize nodes.
"""

from __future__ import annotations

import enum
import math
import operator
from dataclasses import dataclass
from functools import cached_property
from typing import Any, cast

import torch
from torch.fx import Node

from qlint.io.limits import MAX_COMPUTED_TOTAL_BYTES, MAX_CONSTANT_BYTES
from qlint.io.wellformed import qparams_problem
from qlint.rules.ops import SHAPE_OPS
from qlint.rules.qparams import QParams
from qlint.settings.config import ConstantKind

# Matched on `namespace.name`, whatever the overload (`.default`, `.out`, `.tensor`).
QUANTIZE_OPS = {
    "quantized_decomposed.quantize_per_tensor",
    "quantized_decomposed.quantize_per_channel",
    "cortex_m.quantize_per_tensor",
}
DEQUANTIZE_OPS = {
    "quantized_decomposed.dequantize_per_tensor",
    "quantized_decomposed.dequantize_per_channel",
    "cortex_m.dequantize_per_tensor",
}
IGNORED_FUNCTIONS = {"alloc", "_assert_tensor_metadata", "_assert_scalar"}
# What a lowered graph calls a delegate with (`torch.ops.higher_order.executorch_call_delegate`); a `.pte`'s
# rebuilt graph names its delegate calls the same.
DELEGATE_CALL = "executorch_call_delegate"


class Kind(enum.Enum):
    INPUT = "input"          # a runtime graph input
    CONSTANT = "constant"    # a parameter, buffer or lifted constant
    QUANTIZE = "quantize"
    DEQUANTIZE = "dequantize"
    INT_KERNEL = "int"       # compute that runs on integers
    FP_COMPUTE = "fp32"      # compute that runs in float
    SHAPE = "shape"          # data movement
    DELEGATE = "delegate"    # a call into a delegate: an NPU partition, its compute the accelerator's
    OUTPUT = "output"
    OTHER = "other"          # memory planning and asserts


def torch_dtype(qp: QParams) -> torch.dtype:
    """The torch dtype of a qparams record's dtype name, where a kernel runs on it."""
    return cast(torch.dtype, getattr(torch, qp.dtype))


@dataclass(frozen=True)
class Constant:
    """A constant operand: where it lives, its FQN and its value."""

    name: str
    kind: ConstantKind
    value: torch.Tensor

    @property
    def numel(self) -> int:
        return self.value.numel()

    def uniform(self) -> torch.Tensor | None:
        """The one value every position sees, or None if it varies (NaN != NaN).

        Sizes become 1 but the rank and dtype stay, so type promotion is the graph's.
        """
        flat = self.value.detach().flatten()
        if flat.numel() == 0 or (flat.numel() > 1 and not bool(torch.all(flat == flat[0]))):
            return None
        return flat[0].reshape([1] * self.value.dim())

    def scalar(self) -> float | None:
        """The single value, when every element is the same finite number."""
        uniform = self.uniform()
        value = float(uniform.double().flatten()[0]) if uniform is not None else math.nan
        return value if math.isfinite(value) else None

    def __str__(self) -> str:
        uniform = self.uniform()
        if uniform is None:
            return f"{self.name} ({self.kind}, {self.numel} elements)"
        value = f"{self.name}={float(uniform.double().flatten()[0]):.6g}"
        return f"{value} ({self.kind})" if self.numel == 1 else f"{value} ({self.kind}, all {self.numel} elements)"


def op_name(node: Node) -> str:
    """`aten.div.Tensor`, `cortex_m.softmax.default`, or a function name."""
    target = node.target
    if isinstance(target, str):
        return target
    inner: Any = target if isinstance(target, torch._ops.OpOverload) else getattr(target, "_op", None) or target
    if isinstance(inner, torch._ops.OpOverload):
        return f"{inner.namespace}.{inner._opname}.{inner._overloadname}"
    if target is operator.getitem:
        return "getitem"
    return getattr(target, "__name__", str(target))


def run_node(node: Node, *args: Any, **kwargs: Any) -> Any:
    """Call a call_function node's operator on concrete values (its target is never a string here)."""
    target = node.target
    assert callable(target), f"{node.name} has no callable target"
    return target(*args, **kwargs)


def input_node(node: Node, index: int = 0) -> Node:
    """The node feeding argument `index` of `node` (shape ops and quantize nodes take one)."""
    arg = node.args[index]
    assert isinstance(arg, Node), f"argument {index} of {node.name} is not a node"
    return arg


def packet(name: str) -> str:
    """`cortex_m.quantize_per_tensor.default` -> `cortex_m.quantize_per_tensor`."""
    return ".".join(name.split(".")[:2])


def base_name(name: str) -> str:
    """`aten.view_copy.default` -> `view_copy`."""
    parts = name.split(".")
    return parts[1] if len(parts) >= 3 else parts[-1]


def output_value(node: Node) -> Any:
    return node.meta.get("val")


def is_float(node: Node) -> bool:
    val = output_value(node)
    if isinstance(val, (tuple, list)):
        return any(isinstance(v, torch.Tensor) and v.is_floating_point() for v in val)
    return isinstance(val, torch.Tensor) and val.is_floating_point()


def output_dtype(node: Node) -> torch.dtype | None:
    """The dtype a node produces (the first part's, for split and friends)."""
    val = output_value(node)
    if isinstance(val, (tuple, list)):
        val = val[0] if val else None
    return getattr(val, "dtype", None)


def literal_qparams(node: Node) -> QParams | None:
    """The qparams a per-tensor quantize or dequantize call names with literal arguments (any program:
    the caller knows the node is one), None when they are not literals or no kernel runs them."""
    if "per_tensor" not in op_name(node) or len(node.args) < 6:
        return None
    scale, zp, qmin, qmax, dtype = cast(tuple[Any, ...], node.args[1:6])
    if not isinstance(scale, (int, float)) or not isinstance(zp, int):
        return None
    if not isinstance(dtype, torch.dtype) or qparams_problem(scale, zp, qmin, qmax, str(dtype)[6:]):
        return None  # no kernel runs them (a crafted .pte): no verdict is given on them
    return QParams(float(scale), int(zp), int(qmin), int(qmax), str(dtype).removeprefix("torch."))


def folded_qparams(node: Node) -> QParams | None:
    """The per-tensor qparams of the quantize the lowering folded into `node`'s output
    (`FoldAndAnnotateQParamsPass` records them as `output_qparams`), if recorded."""
    args = node.meta.get("output_qparams", {}).get(0)
    if args is None or getattr(args, "per_channel", False):
        return None
    return QParams(float(args.scale), int(args.zp), int(args.qmin), int(args.qmax),
                   str(args.dtype).removeprefix("torch."))


def numel(node: Node) -> int:
    val = output_value(node)
    if isinstance(val, (tuple, list)):
        val = val[0] if val else None
    if isinstance(val, torch.Tensor):
        try:
            return int(val.numel())
        except Exception:  # symbolic shapes
            return 0
    return 0


def constant_inputs(signature: Any) -> dict[str, tuple[ConstantKind, str]]:
    """Placeholder name -> (parameter | buffer | constant, FQN) for a graph signature."""
    table: dict[str, tuple[ConstantKind, str]] = {}
    for kind, mapping in (
        (ConstantKind.PARAMETER, signature.inputs_to_parameters),
        (ConstantKind.BUFFER, signature.inputs_to_buffers),
        (ConstantKind.CONSTANT, signature.inputs_to_lifted_tensor_constants),
    ):
        table.update({name: (kind, fqn) for name, fqn in mapping.items()})
    return table



def recorded_bytes(node: Node) -> float:
    """What a node's recorded outputs hold (inf when a size is symbolic)."""
    val = output_value(node)
    parts = val if isinstance(val, (tuple, list)) else [val]
    try:
        return sum(int(t.numel()) * t.element_size() for t in parts if isinstance(t, torch.Tensor))
    except Exception:  # symbolic sizes
        return math.inf


def known_operator(node: Node) -> bool:
    """A torch or ExecuTorch operator; a `.pte` may name others, whose stand-ins must never run."""
    from executorch.exir.dialects.edge._ops import EdgeOpOverload

    return isinstance(node.target, (torch._ops.OpOverload, EdgeOpOverload))


def computed_constants(program: Any, trusted_shapes: bool) -> dict[Node, torch.Tensor]:
    """The call_function nodes that no runtime input reaches, with their values.

    ExecuTorch's own constant propagation computes them (every op, `aten.full`
    and quantize ops included); the program is not changed, so a fix still
    compares against, and rewrites, the program as lowered. Only shapes that
    lowering recomputed are trusted (`trusted_shapes`), and an op whose recorded
    output exceeds MAX_CONSTANT_BYTES anywhere in the graph is not run.
    """
    if not trusted_shapes:
        return {}
    from executorch.exir.passes.constant_prop_pass import get_propagated_const_tensor_dict

    calls = [n for n in program.graph_module.graph.nodes if n.op == "call_function"]
    skip = {
        n.target for n in calls
        if (n.target is not operator.getitem and not known_operator(n)) or recorded_bytes(n) > MAX_CONSTANT_BYTES
    }
    skip |= _costliest(program, calls, skip)
    values = get_propagated_const_tensor_dict(program, skip)
    return {n: v for n, v in values.items() if n.op == "call_function" and isinstance(v, torch.Tensor)}


def _costliest(program: Any, calls: list[Node], skip: set[Any]) -> set[Any]:
    """The ops left uncomputed so that the others read and write at most MAX_COMPUTED_TOTAL_BYTES
    together, costliest first: an op costs the recorded inputs and outputs of its nodes that no
    runtime input reaches (the nodes constant propagation would run)."""
    from executorch.exir.passes.constant_prop_pass import get_constant_placeholder_dict

    constant: set[Node] = set(get_constant_placeholder_dict(program))
    cost: dict[Any, float] = {}
    for node in calls:
        if node.target in skip or not all(arg in constant for arg in node.all_input_nodes):
            continue
        constant.add(node)
        read = sum(recorded_bytes(arg) for arg in node.all_input_nodes)
        cost[node.target] = cost.get(node.target, 0.0) + read + recorded_bytes(node)
    left, total = set(), 0.0
    for target, bytes_ in sorted(cost.items(), key=lambda item: item[1]):
        total += bytes_
        if total > MAX_COMPUTED_TOTAL_BYTES:
            left.add(target)
    return left


class GraphView:
    """Kinds, qparams and constants for the nodes of one ExportedProgram."""

    def __init__(self, program: Any, trusted_shapes: bool | None = None, quantized: Any = None,
                 graph_id: str = "graph") -> None:
        self.program = program
        self.graph_id = graph_id  # what Model Explorer's adapter calls the program's graph
        # The quantized program this one was lowered from: what the quantizer saw, by node name.
        self.quantized = quantized
        self._quantized = {n.name: n for n in quantized.graph.nodes} if quantized is not None else {}
        self.graph = program.graph_module.graph
        self.nodes: list[Node] = list(self.graph.nodes)
        self.lowered = any(op_name(n).startswith("cortex_m.") for n in self.nodes)
        # Lowered graphs were re-traced by ExecuTorch, so their recorded shapes are the real ones
        # (a `.pte` reader checks its shapes against the operators' meta kernels and says so).
        trusted = self.lowered if trusted_shapes is None else trusted_shapes
        self._computed = computed_constants(program, trusted_shapes=trusted)
        self._kinds: dict[Node, Kind] = {}
        for node in self.nodes:
            self._kinds[node] = self._classify(node)

    @cached_property
    def module(self) -> Any:
        """The program as a module that runs (unlifted once: `ExportedProgram.module()` copies the graph)."""
        return self.program.module()

    def as_quantized(self, node: Node) -> Node:
        """The node of the quantized program that `node` was lowered from (export records it in
        `from_node`), or `node` itself."""
        sources = node.meta.get("from_node") or []
        return self._quantized.get(sources[0].name, node) if sources else node

    def source_name(self, node: Node) -> str | None:
        """The node's id in the program the user gave qlint, as Model Explorer's adapter shows it
        (a `.pt2`'s fx node name; a `.pte`'s instruction), or None for a node lowering made."""
        if "instruction_id" in node.meta:
            return node.meta["instruction_id"]
        if not self._quantized:
            return node.name
        name = self.as_quantized(node).name
        return name if name in self._quantized else None

    def is_constant(self, node: Node) -> bool:
        """No runtime input reaches it: a parameter, buffer or literal, or computed from them
        in the graph (`aten.full`, a mask built from constants, even through quantize ops)."""
        return self._kinds[node] == Kind.CONSTANT or node in self._computed

    def kind(self, node: Node) -> Kind:
        return self._kinds[node]

    @cached_property
    def _constant_fqns(self) -> dict[str, tuple[ConstantKind, str]]:
        return constant_inputs(self.program.graph_signature)

    @cached_property
    def _lowerable(self) -> set[str]:
        """Base names of the aten ops the Cortex-M lowering substitutes."""
        from executorch.backends.cortex_m.passes import AtenToCortexMPass

        names = set()
        for target in AtenToCortexMPass._DIALECT_SUBSTITUTIONS:
            names.add(target._op._opname.lstrip("_"))  # keys are EdgeOpOverloads
        return names

    def computed(self, node: Node) -> torch.Tensor | None:
        """The value of a call_function no runtime input reaches, as the graph's own ops compute it."""
        return self._computed.get(node)

    def constant_work(self, node: Node) -> bool:
        """A computed constant that computes (not data movement, planning, quantize or dequantize):
        the device runs it on every inference though its value never changes."""
        return self._kinds[node] == Kind.CONSTANT and self.op_kind(node) in (Kind.INT_KERNEL, Kind.FP_COMPUTE)

    def op_kind(self, node: Node) -> Kind:
        """The kind of a call_function by its op alone, whether or not a runtime input reaches it
        (a computed view is SHAPE here, CONSTANT in `kind`); other nodes' kind."""
        return self._op_kind(node) if node.op == "call_function" else self._kinds[node]

    def _classify(self, node: Node) -> Kind:
        if node in self._computed and packet(op_name(node)) not in QUANTIZE_OPS | DEQUANTIZE_OPS:
            return Kind.CONSTANT  # q/dq keep their kind: the quantized dialect predicts lowering from them
        if node.op == "placeholder":
            return Kind.CONSTANT if node.name in self._constant_fqns else Kind.INPUT
        if node.op == "get_attr":
            return Kind.CONSTANT
        if node.op == "output":
            return Kind.OUTPUT
        if node.op != "call_function":
            return Kind.OTHER
        return self._op_kind(node)

    def _op_kind(self, node: Node) -> Kind:
        """A call_function's kind by its op alone, whether or not a runtime input reaches it."""
        name = op_name(node)
        if packet(name) in QUANTIZE_OPS:
            return Kind.QUANTIZE
        if packet(name) in DEQUANTIZE_OPS:
            return Kind.DEQUANTIZE
        base = base_name(name)
        if base in IGNORED_FUNCTIONS:
            return Kind.OTHER
        if base in SHAPE_OPS or packet(name) == "cortex_m.transpose":
            return Kind.SHAPE
        if base == DELEGATE_CALL:
            return Kind.DELEGATE
        if not is_float(node):
            return Kind.INT_KERNEL
        if not self.lowered and self._predicted_int(node, base):
            return Kind.INT_KERNEL
        return Kind.FP_COMPUTE

    def _predicted_int(self, node: Node, base: str) -> bool:
        """In the quantized dialect: will the lowering turn this op into an int kernel?"""
        if base.lstrip("_") not in self._lowerable:
            return False
        # Operands (args 0 and 1) must be dequantized; later tensor args such as a
        # linear's bias may be plain constants.
        operands = [a for a in node.args[:2] if isinstance(a, Node)]
        extra = [a for a in node.all_input_nodes if a not in operands]
        feeds_ok = bool(operands) and all(self._kinds.get(a) == Kind.DEQUANTIZE for a in operands)
        feeds_ok = feeds_ok and all(self._kinds.get(a) in (Kind.DEQUANTIZE, Kind.CONSTANT) for a in extra)
        users_ok = bool(node.users) and all(packet(op_name(u)) in QUANTIZE_OPS for u in node.users)
        return feeds_ok and users_ok

    def qparams(self, node: Node) -> QParams | None:
        """Per-tensor qparams of a quantize/dequantize node with literal arguments."""
        if self.kind(node) not in (Kind.QUANTIZE, Kind.DEQUANTIZE):
            return None
        return literal_qparams(node)

    def constant(self, arg: Any) -> Constant | None:
        """The constant behind an operand: a lifted tensor, a get_attr or a literal."""
        if isinstance(arg, (int, float)) and not isinstance(arg, bool):
            return Constant(repr(arg), ConstantKind.LITERAL, torch.tensor(float(arg)))
        if isinstance(arg, Node) and arg in self._computed:
            # Named as the program the user gave qlint names it, as the static tier names it too.
            written = self.as_quantized(arg).name
            return Constant(written if written in self._quantized else arg.name, ConstantKind.COMPUTED,
                            self._computed[arg])
        if not isinstance(arg, Node) or self.kind(arg) != Kind.CONSTANT:
            return None
        if arg.op == "get_attr":
            value = getattr(self.program.graph_module, str(arg.target), None)
            kind, fqn = ConstantKind.CONSTANT, str(arg.target)
        else:
            kind, fqn = self._constant_fqns[arg.name]
            value = self.program.state_dict.get(fqn) if kind != ConstantKind.CONSTANT else None
            if value is None:
                value = self.program.constants.get(fqn)
        if not isinstance(value, torch.Tensor):
            return None
        return Constant(fqn, kind, value)


def graph_arguments(program: Any, batch: tuple[Any, ...]) -> list[Any] | None:
    """What `program.graph_module`'s placeholders take for the user inputs `batch`: its lifted
    parameters, buffers and constants in signature order, the inputs where the signature has them.

    Running the graph this way computes what `program.module()` computes, without the copy and the
    generated code that unlifting makes (1.6 s of SAM's check). None for a signature this does not
    read (an input that is not one tensor of `batch`, a kind other than these)."""
    from torch.export.graph_signature import InputKind

    signature = program.graph_signature
    given = list(batch)
    if any(not isinstance(value, torch.Tensor) for value in given):
        return None
    found: list[Any] = []
    for spec in signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            if not given:
                return None
            found.append(given.pop(0))
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            value = program.state_dict.get(spec.target, program.constants.get(spec.target))
            if not isinstance(value, torch.Tensor):
                return None
            found.append(value)
        else:
            return None
    return found if not given else None
