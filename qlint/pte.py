"""Read a shipped `.pte` with ExecuTorch's own deserializer and check what it runs.

The instruction chain of the first execution plan is rebuilt as a torch.fx
graph (kernel calls become call_function nodes on the functional overload of
each operator, constants become buffers holding their real bytes) so the same
GraphView, island finder and rules apply: no second copy of the logic.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from qlint import backend
from qlint.config import Config
from qlint.findings import ArtifactStats, Finding
from qlint.inputs import ReadError

# ExecuTorch's ScalarType codes for the dtypes a quantized program holds.
_SCALAR_TYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 6: "float32", 7: "float64", 11: "bool"}


def _dtype(code: int) -> Any:
    import torch

    name = _SCALAR_TYPES.get(code)
    if name is None:
        raise ReadError(f"unsupported tensor scalar type {code}")
    return getattr(torch, name)


def _functional(name: str) -> Any:
    """`aten::div` -> torch.ops.aten.div.Tensor (the overload a graph would use)."""
    import torch

    namespace, op = name.split("::")
    try:
        packet = getattr(getattr(torch.ops, namespace), op)
    except (AttributeError, RuntimeError):
        return None
    overloads = packet.overloads()
    for choice in ("Tensor", "default", *overloads):
        if choice in overloads and "out" not in choice:
            return getattr(packet, choice)
    return None


def _out_count(name: str, overload: str) -> int:
    import torch

    namespace, op = name.split("::")
    try:
        schema = getattr(getattr(getattr(torch.ops, namespace), op), overload)._schema
    except (AttributeError, RuntimeError):
        return 1
    return max(1, sum(1 for a in schema.arguments if a.is_out))


def load_pte(data: bytes) -> Any:
    """A deserialized program from the bytes of a .pte."""
    if len(data) < 8 or data[4:6] != b"ET":  # flatbuffer file identifier, e.g. "ET12"
        raise ReadError("not a valid .pte program: no ExecuTorch file identifier")
    backend.load()
    from executorch.exir._serialize._program import deserialize_pte_binary

    try:
        return deserialize_pte_binary(data).program
    except MemoryError:
        raise  # the child's memory budget, reported as such
    except Exception as exc:
        from qlint.lowering import first_line

        raise ReadError(f"not a valid .pte program: {first_line(exc)}") from None


def program_view(program: Any) -> Any:
    """A GraphView over the first execution plan of a deserialized program."""
    import torch
    from torch.fx import Graph, GraphModule

    from qlint.graph_view import GraphView

    if not program.execution_plan:
        raise ReadError("the program has no execution plan")
    plan = program.execution_plan[0]
    if plan.delegates:
        raise ReadError("delegated programs are not supported (the Cortex-M flow does not delegate)")
    graph = Graph()
    env: dict[int, Any] = {}
    buffers: dict[str, Any] = {}

    def meta_tensor(value: Any) -> Any:
        return torch.empty([int(s) for s in value.sizes], dtype=_dtype(int(value.scalar_type)), device="meta")

    def tensor_node(index: int) -> Any:
        if index in env:
            return env[index]
        value = plan.values[index].val
        name = f"constant_{index}" if value.data_buffer_idx > 0 else f"value_{index}"
        node = graph.placeholder(name)
        node.meta["val"] = meta_tensor(value)
        if value.data_buffer_idx > 0:
            storage = bytes(program.constant_buffer[value.data_buffer_idx].storage)
            tensor = torch.frombuffer(bytearray(storage), dtype=_dtype(int(value.scalar_type)))
            buffers[name] = tensor.reshape([int(s) for s in value.sizes]) if tensor.numel() else tensor
        env[index] = node
        return node

    def arg(index: int, as_dtype: bool = False) -> Any:
        val = plan.values[index].val
        kind = type(val).__name__
        if kind == "Tensor":
            return tensor_node(index)
        if kind == "Int":
            return _dtype(val.int_val) if as_dtype else int(val.int_val)
        if kind == "Double":
            return float(val.double_val)
        if kind == "Bool":
            return bool(val.bool_val)
        if kind == "IntList":
            return [int(plan.values[i].val.int_val) for i in val.items]
        if kind in ("Null", "NoneType"):
            return None
        return None

    for index in plan.inputs:
        tensor_node(index)
    for instruction in plan.chains[0].instructions:
        call = instruction.instr_args
        if type(call).__name__ != "KernelCall":
            continue
        operator = plan.operators[call.op_index]
        n_out = _out_count(operator.name, operator.overload)
        args = list(call.args)
        n_schema = len(args) - 1  # the last arg repeats the return value
        inputs, outs = args[: n_schema - n_out], args[n_schema - n_out : n_schema]
        is_qdq = operator.name in ("cortex_m::quantize_per_tensor", "cortex_m::dequantize_per_tensor")
        node_args = tuple(arg(i, as_dtype=is_qdq and pos == 5) for pos, i in enumerate(inputs))
        target = _functional(operator.name) or operator.name
        node = graph.call_function(target if callable(target) else _unknown(operator.name), node_args)
        if len(outs) == 1:
            node.meta["val"] = meta_tensor(plan.values[outs[0]].val)
            env[outs[0]] = node
        else:
            node.meta["val"] = tuple(meta_tensor(plan.values[o].val) for o in outs)
            import operator as pyop

            for position, out in enumerate(outs):
                item = graph.call_function(pyop.getitem, (node, position))
                item.meta["val"] = node.meta["val"][position]
                env[out] = item
    graph.output(tuple(env.get(i) for i in plan.outputs))
    module = GraphModule(torch.nn.Module(), graph)
    shim = SimpleNamespace(
        graph_module=module,
        graph=graph,
        graph_signature=SimpleNamespace(
            inputs_to_parameters={},
            inputs_to_buffers={k: k for k in buffers},
            inputs_to_lifted_tensor_constants={},
            buffers_to_mutate={},
            non_persistent_buffers=set(),
        ),
        state_dict=buffers,
        constants={},
    )
    return GraphView(shim)


def _unknown(name: str) -> Any:
    """A stand-in target for an operator torch does not know: named, never run."""

    def kernel(*args: Any) -> Any:
        raise RuntimeError(f"{name} is not registered with torch")

    kernel.__name__ = name.replace("::", ".")
    return kernel


def lint_pte(data: bytes, artifact: str, config: Config) -> tuple[list[Finding], ArtifactStats]:
    """Run the rules on the program a `.pte` ships (already lowered: nothing to lower)."""
    from qlint.checks import run_rules

    linted = run_rules(program_view(load_pte(data)), artifact, config)
    return linted.findings, linted.stats
