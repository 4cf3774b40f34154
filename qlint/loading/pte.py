"""Read a shipped `.pte` with ExecuTorch's own deserializer: the program it runs, as a graph.

The execution plan is rebuilt as a torch.fx graph so the same GraphView, island
finder and rules apply: no second copy of the logic. The reader follows
ExecuTorch's schema (`executorch/exir/schema.py`) and emitter:

- a `KernelCall`'s args are the operator's schema arguments in order (out
  arguments included), then its return: one tensor, or a `TensorList` of them;
  each call becomes a node on the functional overload with the same non-out
  arguments, kwarg-only ones as keywords;
- a program input need not be a tensor: a model that takes a Python number is
  exported with the example's value, which the emitter
  (`exir/emit/_emitter.py`, `_TopLevelEmitter.placeholder`) lists among the
  plan's inputs as an `Int`, `Double` or `Bool`; an instruction reads it as
  any scalar argument, and it is no node;
- a static view is not an instruction: its value shares the memory of the tensor
  it views, so a value read before any instruction writes it is a view of the
  last value written at the same planned offset (it becomes `aten.view_copy`);
- constants live in `constant_buffer`, padded to an alignment and laid out in the
  tensor's `dim_order`;
- a `DelegateCall`'s args are the delegate's inputs, then its outputs (the emitter's
  `_emit_delegate`); how many of each its Ethos-U blob says (Arm's runtime reads
  them so), and the call becomes an `executorch_call_delegate` node, its outputs
  `getitem`s of it, as in the lowered graph. Only `EthosUBackend` delegates are
  read: each one's blob (`qlint.io.vela`), inline or in a segment, every index
  and length checked;
- every recorded shape is checked against the operator's meta kernel (or, where
  the device decides it, what the operator computes on the CPU export traced
  on), so the in-graph constants qlint computes are computed at the shapes the
  operators produce, never at sizes the file merely claims.
"""

from __future__ import annotations

import operator as pyop
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from types import SimpleNamespace
from typing import Any

from qlint.io.limits import MAX_TENSOR_DIMS, Limits
from qlint.io.reads import ReadError, first_line
from qlint.io.vela import NpuBlob, read_vela_blob
from qlint.loading import stack
from qlint.loading.ethos_u import Delegation
from qlint.records.results import Buffer, Contributor

# ExecuTorch's ScalarType codes (executorch/exir/scalar_type.py) that a quantized program holds.
_SCALAR_TYPES = {
    0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32", 7: "float64",
    11: "bool", 15: "bfloat16", 27: "uint16", 28: "uint32", 29: "uint64",
}
_ARENA = 1      # memory id of the planned activation arena (0 is reserved)
_FLOAT32 = 6
_LISTS = frozenset({"IntList", "DoubleList", "BoolList", "TensorList", "OptionalTensorList"})  # value types with items
_ETHOS_U = "EthosUBackend"  # the backend id of ExecuTorch's Arm Ethos-U delegates, the only one read
_INLINE = 0     # DataLocation.INLINE: a delegate's data in program.backend_delegate_data
_DELEGATE_STEP = "DelegateCall"  # what `plan_steps` lists for a delegate call


class _Malformed(ReadError):
    """A table the schema allows but no program can hold (an index out of range, short data)."""


def _dtype(code: int) -> Any:
    import torch

    name = _SCALAR_TYPES.get(code)
    if name is None:
        raise ReadError(f"unsupported tensor scalar type {code}")
    return getattr(torch, name)


def load_pte(data: bytes, limits: Limits) -> Any:
    """A deserialized program from the bytes of a .pte, refused unread when it declares more
    than `limits` allow."""
    return _load(data, _Budget(limits))


def _load(data: bytes, budget: _Budget) -> Any:
    if len(data) < 8 or data[4:6] != b"ET":  # flatbuffer file identifier, e.g. "ET12"
        raise ReadError("not a valid .pte program: no ExecuTorch file identifier")
    stack.load()
    from executorch.exir._serialize._program import deserialize_pte_binary

    try:
        _declared(data, budget)
        return deserialize_pte_binary(data).program
    except (MemoryError, ReadError):
        raise  # the child's memory budget, or a limit, reported as such
    except Exception as exc:

        raise ReadError(f"not a valid .pte program: {first_line(exc)}") from None


def _declared(data: bytes, budget: _Budget) -> None:
    """Count the tables the flatbuffer declares, through its lazy accessors, before anything
    decodes it: decoding costs time and memory per table, and a few MB declare millions."""
    from executorch.exir._serialize._flatbuffer_program import _patch_generated_flatbuffer_aliases
    from executorch.exir._serialize.generated.executorch_flatbuffer.Program import Program

    _patch_generated_flatbuffer_aliases()  # as ExecuTorch's decoder does: the generated tables name modules
    root = Program.GetRootAs(data, 0)
    budget.declare(root.ExecutionPlanLength() + root.ConstantBufferLength() + root.BackendDelegateDataLength()
                 + root.SegmentsLength() + root.MutableDataSegmentsLength() + root.NamedDataLength())
    for i in range(root.ExecutionPlanLength()):  # bounded: each plan was counted
        plan = root.ExecutionPlan(i)
        budget.declare(plan.ValuesLength() + plan.OperatorsLength() + plan.DelegatesLength() + plan.ChainsLength()
                     + plan.NonConstBufferDeviceLength())
        for k in range(plan.DelegatesLength()):
            budget.declare(plan.Delegates(k).CompileSpecsLength())
        for j in range(plan.ChainsLength()):
            chain = plan.Chains(j)
            budget.instructions(chain.InstructionsLength())
            budget.declare(chain.InstructionsLength() + chain.StacktraceLength())


class _Budget:
    """What reading one .pte may visit (`limits.pte_instructions`, `limits.pte_entries`): one
    error line naming the limit instead of minutes of decoding and rebuilding."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.entries = self.declared_instructions = 0

    def instructions(self, count: int) -> None:
        self.declared_instructions += count
        if self.declared_instructions > self.limits.pte_instructions:
            raise ReadError(f"declares over {int(self.limits.pte_instructions)} instructions "
                            "(limits.pte_instructions in .qlint.yaml)")

    def declare(self, count: int) -> None:
        if self.over(count):
            raise ReadError(f"declares over {int(self.limits.pte_entries)} values, instructions and other tables "
                            "(limits.pte_entries in .qlint.yaml)")

    def read(self, count: int) -> None:
        """Values about to be read: one list can be an argument of every instruction, so they are
        counted as the instructions read them, not as the file stores them."""
        if self.over(count):
            raise ReadError(f"its tables and the values its instructions read, list items one by one, are over "
                            f"{int(self.limits.pte_entries)} entries (limits.pte_entries in .qlint.yaml)")

    def over(self, count: int) -> bool:
        self.entries += count
        return self.entries > self.limits.pte_entries


@cache
def _operator(name: str, overload: str) -> tuple[Any, Any]:
    """(the out variant's schema, the functional overload with the same non-out arguments),
    either None when torch does not know the operator."""
    import torch

    namespace, _, op = name.partition("::")
    try:
        packet = getattr(getattr(torch.ops, namespace), op)
        schema = getattr(packet, overload or "default")._schema
    except (AttributeError, RuntimeError):
        return None, None

    def positional(s: Any) -> list[tuple[str, str]]:
        return [(a.name, str(a.type)) for a in s.arguments if not a.is_out and not a.kwarg_only]

    def keywords(s: Any) -> dict[str, str]:
        return {a.name: str(a.type) for a in s.arguments if not a.is_out and a.kwarg_only}

    wanted, wanted_keywords = positional(schema), keywords(schema)
    for choice in packet.overloads():
        candidate = getattr(packet, choice)._schema
        if any(a.is_out or (a.alias_info is not None and a.alias_info.is_write) for a in candidate.arguments):
            continue
        extra = [a for a in candidate.arguments if a.kwarg_only and a.name not in wanted_keywords]
        # `full.out` lacks `full`'s dtype/layout/device keywords: the defaults stand for them.
        if (positional(candidate) == wanted and wanted_keywords.items() <= keywords(candidate).items()
                and all(a.has_default_value() for a in extra)):
            return schema, getattr(packet, choice)
    return schema, None


def _unknown(name: str) -> Callable[..., Any]:
    """A stand-in target for an operator torch does not know: named, never run."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{name} is not registered with torch")

    kernel.__name__ = name.replace("::", ".")
    return kernel


def _strides(sizes: list[int], dim_order: list[int]) -> list[int]:
    """Element strides of a tensor laid out in `dim_order` (outermost dimension first)."""
    strides = [0] * len(sizes)
    step = 1
    for dim in reversed(dim_order):
        strides[dim] = step
        step *= max(sizes[dim], 1)
    return strides


class _PlanReader:
    """Builds one fx graph from one execution plan; raises ReadError on anything malformed."""

    def __init__(self, program: Any, plan: Any, budget: _Budget) -> None:
        from torch.fx import Graph

        self.program, self.plan = program, plan
        self.budget = budget
        self.delegates = delegate_blobs(program, plan)
        self.calls: dict[str, NpuBlob] = {}  # each delegate call's node name -> its delegate's blob
        self.graph = Graph()
        self.env: dict[int, Any] = {}
        self.buffers: dict[str, Any] = {}
        self.last_writer: dict[tuple[int, int], int] = {}  # planned (memory id, offset) -> value index
        # The memory plan as it runs: step 0 holds the inputs, step i the i-th instruction.
        self.step = 0
        self.step_ops = ["<inputs>"]
        self.spans: dict[int, list[int]] = {}  # value index -> [first, last] step it is written or read

    def touch(self, index: int) -> None:
        span = self.spans.setdefault(index, [self.step, self.step])
        span[1] = self.step

    def value(self, index: int) -> Any:
        if not 0 <= index < len(self.plan.values):
            raise _Malformed(f"value index {index} out of range")
        return self.plan.values[index].val

    def tensor_value(self, index: int) -> Any:
        val = self.value(index)
        if type(val).__name__ != "Tensor":
            raise _Malformed(f"value {index} is a {type(val).__name__}, not a tensor")
        return val

    def meta(self, val: Any) -> Any:
        import torch

        if len(val.sizes) > MAX_TENSOR_DIMS:  # measured before converting: every instruction may name this tensor
            raise _Malformed(f"a tensor of {len(val.sizes)} dimensions")
        sizes = [int(s) for s in val.sizes]
        dim_order = [int(d) for d in val.dim_order] if len(val.dim_order) == len(sizes) else []
        if any(s < 0 for s in sizes):
            raise _Malformed(f"invalid tensor sizes {sizes}")
        if sorted(dim_order) != list(range(len(sizes))):
            dim_order = list(range(len(sizes)))  # older programs leave it empty: contiguous
        return torch.empty_strided(sizes, _strides(sizes, dim_order), dtype=_dtype(int(val.scalar_type)), device="meta")

    def allocation(self, val: Any) -> tuple[int, int] | None:
        info = val.allocation_info
        if info is None:
            return None
        return int(info.memory_id), int(info.memory_offset_low) | (int(info.memory_offset_high) << 32)

    def constant_data(self, index: int, val: Any, meta: Any) -> Any:
        import torch

        info = val.extra_tensor_info
        if info is not None and int(getattr(info, "location", 0)) == 1:  # TensorDataLocation.EXTERNAL
            raise ReadError(f"constant {info.fully_qualified_name or index} is stored outside the program (.ptd)")
        if not 0 < val.data_buffer_idx < len(self.program.constant_buffer):
            raise _Malformed(f"value {index}: constant buffer {val.data_buffer_idx} out of range")
        storage = self.program.constant_buffer[val.data_buffer_idx].storage
        start = int(val.storage_offset) * meta.element_size()
        needed = meta.numel() * meta.element_size()
        if start < 0 or start + needed > len(storage):  # buffers are padded, never short
            raise _Malformed(f"value {index}: constant of {needed} bytes in a buffer of {len(storage)}")
        flat = torch.frombuffer(bytearray(storage[start : start + needed]), dtype=meta.dtype) if needed else \
            torch.empty(0, dtype=meta.dtype)
        order = sorted(range(meta.dim()), key=lambda d: -meta.stride(d)) if meta.dim() else []
        physical = flat.reshape([meta.shape[d] for d in order])
        return physical.permute([order.index(d) for d in range(meta.dim())])

    def placeholder(self, index: int) -> Any:
        """A program input or constant: the graph's placeholders."""
        val = self.tensor_value(index)
        meta = self.meta(val)
        constant = val.data_buffer_idx > 0
        name = f"constant_{index}" if constant else f"value_{index}"
        node = self.graph.placeholder(name)
        node.meta["instruction_id"] = None  # Model Explorer shows inputs as one node, constants not at all
        node.meta["val"] = meta
        if constant:
            self.buffers[name] = self.constant_data(index, val, meta)
        self.env[index] = node
        return node

    def tensor(self, index: int) -> Any:
        """The node of a tensor value: produced, a view of one, a constant, or unknown (runtime)."""
        self.touch(index)
        if index in self.env:
            return self.env[index]
        val = self.tensor_value(index)
        if val.data_buffer_idx > 0:
            return self.placeholder(index)
        meta = self.meta(val)
        where = self.allocation(val)
        base = self.last_writer.get(where) if where is not None else None
        if base is None or not self.same_data(self.env[base], meta):
            return self.placeholder(index)  # never written (a kernel's scratch buffer): not a constant
        self.touch(base)  # a view reads its base's bytes
        import torch

        node = self.graph.call_function(torch.ops.aten.view_copy.default, (self.env[base], list(meta.shape)))
        node.meta["instruction_id"] = None  # a static view: no instruction
        node.meta["val"] = meta
        self.env[index] = node
        return node

    @staticmethod
    def same_data(base: Any, meta: Any) -> bool:
        """A static view keeps its base's dtype and element count."""
        recorded = base.meta["val"]
        return recorded.dtype == meta.dtype and recorded.numel() == meta.numel()

    def argument(self, index: int, kind: str) -> Any:
        """A schema argument's Python value; `kind` is its schema type, such as `Tensor?`."""
        val = self.value(index)
        name = type(val).__name__
        if name == "Null":
            return None
        if name == "Tensor":
            return self.tensor(index)
        if name == "Int":
            return _dtype(int(val.int_val)) if kind.startswith("ScalarType") else int(val.int_val)
        if name == "Double":
            return float(val.double_val)  # "inf", "-inf" and "nan" are stored as strings
        if name == "Bool":
            return bool(val.bool_val)
        if name == "String":
            return str(val.string_val)
        if name in _LISTS:
            self.budget.read(len(val.items))
        if name == "IntList":
            return [int(self.value(i).int_val) for i in val.items]
        if name in ("DoubleList", "BoolList"):
            return list(val.items)
        if name == "TensorList":
            return [self.tensor(i) for i in val.items]
        if name == "OptionalTensorList":
            return [None if i < 0 else self.tensor(i) for i in val.items]
        raise _Malformed(f"value {index}: unsupported value type {name}")

    def produced(self, index: int, node: Any) -> None:
        self.touch(index)
        self.env[index] = node
        where = self.allocation(self.tensor_value(index))
        if where is not None:
            self.last_writer[where] = index

    def kernel_call(self, call: Any) -> None:
        if not 0 <= call.op_index < len(self.plan.operators):
            raise _Malformed(f"operator index {call.op_index} out of range")
        operator = self.plan.operators[call.op_index]
        schema, functional = _operator(operator.name, operator.overload)
        args = list(call.args)
        self.budget.read(len(args))
        if not args:
            raise _Malformed(f"{operator.name} called with no arguments")
        *inputs, returned = args
        node_args: list[Any] = []
        kwargs: dict[str, Any] = {}
        if schema is not None and len(inputs) == len(schema.arguments):
            for spec, index in zip(schema.arguments, inputs, strict=True):
                if spec.is_out:
                    continue
                value = self.argument(index, str(spec.real_type))  # `type` says int for a ScalarType
                if spec.kwarg_only:
                    kwargs[spec.name] = value
                else:
                    node_args.append(value)
        else:  # an operator torch does not know: its arguments as they are, never run
            node_args = [self.argument(i, "") for i in inputs]
            functional = None
        result = self.value(returned)
        if functional is not None and "dtype" not in kwargs and type(result).__name__ == "Tensor" and any(
            a.name == "dtype" and a.kwarg_only for a in functional._schema.arguments
        ):  # an out variant takes its dtype from `out` (`full.out`): the functional one is told
            kwargs["dtype"] = _dtype(int(result.scalar_type))
        target = functional or _unknown(f"{operator.name}.{operator.overload}")
        node = self.graph.call_function(target, tuple(node_args), kwargs)
        # The id Model Explorer's .pte adapter gives this instruction: `<plan>_<chain>_<index>`.
        node.meta["instruction_id"] = f"{self.plan.name}_0_{self.step - 1}"
        if type(result).__name__ == "TensorList":
            self.budget.read(len(result.items))
            node.meta["val"] = tuple(self.meta(self.tensor_value(i)) for i in result.items)
            for position, out in enumerate(result.items):
                item = self.graph.call_function(pyop.getitem, (node, position))
                item.meta["instruction_id"] = node.meta["instruction_id"]
                item.meta["val"] = node.meta["val"][position]
                self.produced(out, item)
        elif type(result).__name__ == "Tensor":
            node.meta["val"] = self.meta(result)
            self.produced(returned, node)
        else:
            raise _Malformed(f"{operator.name} returns a {type(result).__name__}")

    def delegate_call(self, call: Any) -> None:
        """A call into an NPU partition: its inputs, then its outputs, as many as its blob says."""
        if not 0 <= call.delegate_index < len(self.delegates):
            raise _Malformed(f"delegate index {call.delegate_index} out of range")
        blob = self.delegates[call.delegate_index]
        args = list(call.args)
        self.budget.read(len(args))
        count = len(blob.inputs)
        if len(args) != count + len(blob.outputs):
            raise _Malformed(f"a call of delegate {call.delegate_index} passes {len(args)} values; its blob reads "
                             f"{count} and writes {len(blob.outputs)}")
        from qlint.loading.view import DELEGATE_CALL

        node = self.graph.call_function(_unknown(DELEGATE_CALL), tuple(self.argument(i, "") for i in args[:count]))
        node.meta["instruction_id"] = f"{self.plan.name}_0_{self.step - 1}"
        node.meta["val"] = tuple(self.meta(self.tensor_value(i)) for i in args[count:])
        for position, out in enumerate(args[count:]):
            item = self.graph.call_function(pyop.getitem, (node, position))
            item.meta["instruction_id"] = node.meta["instruction_id"]
            item.meta["val"] = node.meta["val"][position]
            self.produced(out, item)
        self.calls[node.name] = blob

    def arena_buffers(self) -> list[Buffer]:
        """The plan's arena tensors with the steps they are live at (outputs: to the end)."""
        last = self.step
        for index in self.plan.outputs:
            if index in self.spans:
                self.spans[index][1] = last
        buffers = []
        inputs = set(self.plan.inputs)
        for index, (start, end) in self.spans.items():
            val = self.value(index)
            where = self.allocation(val) if type(val).__name__ == "Tensor" and val.data_buffer_idx == 0 else None
            if where is None or where[0] != _ARENA:
                continue
            meta = self.meta(val)
            writer = "program input" if index in inputs else f"output of {self.step_ops[start]}"
            what = f"{str(meta.dtype).removeprefix('torch.')} {list(meta.shape)}, {writer}"
            buffers.append(Buffer(start, end, where[1], meta.numel() * meta.element_size(),
                                  int(val.scalar_type) == _FLOAT32, index in inputs, f"value {index}", what))
        return buffers

    def constants(self, shown: int = 5) -> tuple[Contributor, ...]:
        """The program's largest constants, with the kernel that reads each (a `.pte` keeps no module paths)."""
        from qlint.loading.view import op_name

        found = []
        for node in self.graph.nodes:
            if node.name not in self.buffers:
                continue
            value = self.buffers[node.name]
            reader = next((op_name(u) for u in node.users), None)
            what = f"{str(value.dtype).removeprefix('torch.')} {list(value.shape)}" + (
                f", read by {reader}" if reader else "")
            found.append(Contributor(node.name.replace("constant_", "constant value "),
                                     value.numel() * value.element_size(), what))
        return tuple(sorted(found, key=lambda c: (-c.amount, c.name))[:shown])

    def read(self) -> Any:
        self.budget.read(len(self.plan.inputs) + len(self.plan.outputs))
        for index in self.plan.inputs:
            if type(self.value(index)).__name__ != "Tensor":
                continue  # a scalar input: an argument where it is read (see the module's docstring)
            self.touch(index)
            self.placeholder(index)
            where = self.allocation(self.tensor_value(index))
            if where is not None:
                self.last_writer[where] = index
        for instruction, step in zip(self.plan.chains[0].instructions, plan_steps(self.plan), strict=True):
            call = instruction.instr_args
            self.step += 1
            self.step_ops.append(step)
            if step == "MoveCall":
                self.budget.read(2)
                self.env[call.move_to] = self.tensor(call.move_from)
                self.touch(call.move_to)
            elif step == _DELEGATE_STEP:
                self.delegate_call(call)
            elif step != "FreeCall":
                self.kernel_call(call)
        outputs = [self.tensor(i) if type(self.value(i)).__name__ == "Tensor" else None for i in self.plan.outputs]
        self.graph.output(tuple(outputs))
        return self.graph


def _check_shapes(graph: Any) -> None:
    """Every recorded shape and dtype must be what the operator computes from its inputs' meta.

    A `.pte` records what `torch.export` computed on the CPU: ExecuTorch makes each value's TensorSpec,
    and each out argument's allocation, from the node's CPU fake tensor (`exir/passes/spec_prop_pass.py`
    SpecPropPass, `exir/passes/__init__.py` ToOutVarPass), and its emitter writes their sizes. A few
    operators' shapes depend on the device, and the meta device is not the CPU: eval-mode batch norm
    keeps no statistics on the CPU, so its saved mean and invstd are [0] there and [C] on any other
    device, meta included (`torch/_decomp/decompositions.py` native_batch_norm_helper, its meta
    kernel; ExecuTorch's portable `_native_batch_norm_legit_no_training.out` resizes them to {0}), and
    meta kernels that branch on the device take meta for CUDA (`torch/_meta_registrations.py`
    device_hint). Where the meta kernel disagrees, the operator is asked again with CPU fake tensors,
    as export asked it (no data, no kernel run); a shape that neither gives is refused.

    Operators without a meta kernel (qlint never computes them) are left as recorded.
    """
    import torch
    from torch.fx import Node

    def meta_of(arg: Any) -> Any:
        return arg.meta["val"] if isinstance(arg, Node) else arg

    mode = None  # the CPU fake tensors' mode, made at the first disagreement
    for node in graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        args, kwargs = torch.utils._pytree.tree_map(meta_of, (node.args, node.kwargs))
        try:
            computed = node.target(*args, **kwargs)
        except Exception:  # no meta kernel, or an operator that inspects data
            continue
        recorded = node.meta["val"]
        differs = _differs(computed, recorded)
        if differs is None:
            continue
        if mode is None:
            from torch._subclasses.fake_tensor import FakeTensorMode

            mode = FakeTensorMode(allow_fallback_kernels=False)  # never a real kernel
        cpu = _on_cpu(mode, node.target, args, kwargs)
        if cpu is None or _differs(cpu, recorded) is not None:
            c, r = differs
            raise _Malformed(
                f"{node.target}: the program records {list(r.shape)} {r.dtype}, "
                f"the operator computes {list(c.shape)} {c.dtype}"
            )


def _differs(computed: Any, recorded: Any) -> tuple[Any, Any] | None:
    """The first (computed, recorded) pair of output tensors whose shapes or dtypes differ, if any."""
    import torch

    pairs = zip(computed, recorded, strict=False) if isinstance(recorded, tuple) else [(computed, recorded)]
    return next(((c, r) for c, r in pairs
                 if isinstance(c, torch.Tensor) and (tuple(c.shape) != tuple(r.shape) or c.dtype != r.dtype)), None)


def _on_cpu(mode: Any, target: Any, args: Any, kwargs: Any) -> Any:
    """The operator's outputs for CPU fake tensors of its arguments' shapes, strides and dtypes in
    `mode`, as `torch.export` computes them; None when it raises."""
    import torch

    def fake(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="cpu")
        return value

    try:
        with mode:
            args, kwargs = torch.utils._pytree.tree_map(fake, (args, kwargs))
            return target(*args, **kwargs)
    except Exception:
        return None


def _plan(program: Any) -> Any:
    plans = program.execution_plan
    if not plans:
        raise ReadError("the program has no execution plan")
    if len(plans) > 1:
        names = ", ".join(str(p.name) for p in plans[:8])
        raise ReadError(f"{len(plans)} methods ({names}); only single-method programs are read")
    return plans[0]


def delegate_blobs(program: Any, plan: Any) -> list[NpuBlob]:
    """Each of the plan's delegates' Ethos-U blob, in `plan.delegates` order (the runtime initializes
    every one at load). ExecuTorch's deserializer has already moved the data of a delegate stored in
    a segment inline, checking its bounds; a delegate of another backend, a data index out of
    range, or a segment the file does not hold is refused. A blob several delegates share is read once."""
    read: dict[int, NpuBlob] = {}
    blobs = []
    for number, delegate in enumerate(plan.delegates):
        if str(delegate.id) != _ETHOS_U:
            raise ReadError(f"delegate {number} is for backend {str(delegate.id)!r}; only {_ETHOS_U} "
                            "delegates are read")
        where, index = int(delegate.processed.location), int(delegate.processed.index)
        if where != _INLINE:
            raise _Malformed(f"delegate {number}'s data is in segment {index}, which the file does not hold")
        if not 0 <= index < len(program.backend_delegate_data):
            raise _Malformed(f"delegate {number}'s data index {index} out of range")
        if index not in read:
            read[index] = read_vela_blob(bytes(program.backend_delegate_data[index].data))
        blobs.append(read[index])
    return blobs


def _compile_specs(plan: Any) -> dict[str, str]:
    """The first delegate's compile specs as text (EthosUCompileSpec writes `target`, `tosa_spec`,
    `compile_flags` and more; every delegate of one lowering has the same)."""
    if not plan.delegates:
        return {}
    return {str(spec.key): bytes(spec.value).decode("utf-8", "replace") for spec in plan.delegates[0].compile_specs}


def delegation(plan: Any, calls: dict[str, NpuBlob]) -> Delegation | None:
    """What a delegated plan says of its NPU side; None for a CPU-only plan. The accelerator is the
    compile specs' `target` (`ethos-u55-128`), else Vela's `--accelerator-config` flag, else "";
    a `.pte` records neither why an op stayed on the CPU (no rejections) nor how many ops a
    partition runs (1 per call)."""
    if not plan.delegates:
        return None
    specs = _compile_specs(plan)
    flags = [f for f in specs.get("compile_flags", "").split() if f.startswith("--accelerator-config=")]
    npu = specs.get("target") or (flags[0].partition("=")[2] if flags else "")
    return Delegation(npu, specs.get("tosa_spec", ""), {}, dict(calls), {name: 1 for name in calls}, recorded=False)


def plan_steps(plan: Any) -> list[str]:
    """The plan's instructions in order, as a profile of it records them: the operator's name for
    a kernel call (`cortex_m::softmax.out`), `DelegateCall` for a call into a delegate, else the
    instruction's kind (`MoveCall`, `FreeCall`); a plan of several chains, or with instructions of
    another kind (control flow), is refused."""
    if len(plan.chains) != 1:
        raise ReadError(f"{len(plan.chains)} chains in the plan; only single-chain programs are read")
    steps = []
    for number, instruction in enumerate(plan.chains[0].instructions, start=1):
        call = instruction.instr_args
        if call is None:  # an instruction whose union names no type: no serializer writes one
            raise _Malformed(f"instruction {number} has no arguments")
        kind = type(call).__name__
        if kind not in ("KernelCall", "MoveCall", "FreeCall", _DELEGATE_STEP):
            raise ReadError(f"{kind} instructions (control flow) are not supported")
        steps.append(_operator_name(plan, call) if kind == "KernelCall" else kind)
    return steps


def _operator_name(plan: Any, call: Any) -> str:
    if not 0 <= call.op_index < len(plan.operators):
        return "?"
    operator = plan.operators[call.op_index]
    return f"{operator.name}.{operator.overload}" if operator.overload else str(operator.name)


def pte_steps(data: bytes, limits: Limits) -> list[str]:
    """The instructions of the `.pte` in `data` (`plan_steps`), counted before it is decoded
    (`limits.pte_instructions`, `limits.pte_entries`), without rebuilding its graph."""
    plan = _plan(load_pte(data, limits))
    try:
        return plan_steps(plan)
    except _Malformed as exc:
        raise ReadError(f"not a valid .pte program: {exc}") from None


def _read(program: Any, budget: _Budget) -> tuple[Any, _PlanReader]:
    from qlint.loading.view import GraphView

    try:
        reader = _PlanReader(program, _plan(program), budget)
        graph = reader.read()
        _check_shapes(graph)
    except _Malformed as exc:
        raise ReadError(f"not a valid .pte program: {exc}") from None
    except ReadError:
        raise
    except (RecursionError, MemoryError):
        raise
    except Exception as exc:  # a malformed table the schema allowed

        raise ReadError(f"not a valid .pte program: {type(exc).__name__}: {first_line(exc)}") from None
    # The graph is only read, never called: a GraphModule would generate and compile Python
    # source for it, a line per node (seconds and hundreds of MB for 50,000 instructions).
    shim = SimpleNamespace(
        graph_module=SimpleNamespace(graph=graph),
        graph=graph,
        graph_signature=SimpleNamespace(
            inputs_to_parameters={},
            inputs_to_buffers={k: k for k in reader.buffers},
            inputs_to_lifted_tensor_constants={},
            buffers_to_mutate={},
            non_persistent_buffers=set(),
            input_specs=[],
        ),
        state_dict=reader.buffers,
        constants={},
    )
    return GraphView(shim, trusted_shapes=True, graph_id=str(reader.plan.name)), reader


@dataclass(frozen=True)
class Shipped:
    """What a `.pte` ships, as read: its program as a graph view (nothing to lower), the instructions
    in order (`steps`, step 0 the inputs), the arena's tensors and size, its largest constants, the
    execution plan (what the method allocator sizes) and its NPU side (`delegation`, None for a
    CPU-only program)."""

    view: Any
    steps: list[str]
    buffers: list[Buffer]
    arena_bytes: int
    constants: tuple[Contributor, ...]
    plan: Any
    delegation: Delegation | None = None

    @property
    def name(self) -> str:
        return str(self.plan.name)


def read_pte(data: bytes, limits: Limits) -> Shipped:
    """A `.pte` read within `limits`: what it declares is counted, then what its instructions read."""
    budget = _Budget(limits)
    view, reader = _read(_load(data, budget), budget)
    return Shipped(view, reader.step_ops, reader.arena_buffers(), int(sum(reader.plan.non_const_buffer_sizes)),
                   reader.constants(), reader.plan, delegation(reader.plan, reader.calls))


__all__ = ["ReadError", "Shipped", "load_pte", "pte_steps", "read_pte"]
