"""An NPU partition's values, computed on the host: the TOSA flatbuffer Vela compiled for it, run on
the TOSA reference model (`tosa_reference_model`, from tosa-tools, as ExecuTorch's Arm tests run
it). The value check computes each delegate call of a lowered program so (`delegate_values`), and
the CPU ops between them with the reference kernels, against the quantized program.

The reference model computes what the TOSA specifies, bit for bit; Vela compiles that TOSA for the
NPU, so the check sees what the partitioner and the TOSA lowering made of the partition, not Vela's
own compilation of it (that runs only on the Ethos-U).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Node

from qlint.analysis.values import DelegateFailed
from qlint.io.reads import first_line
from qlint.loading.ethos_u import Delegation
from qlint.loading.view import output_value

# What the reference model returns for a graph it ran to the end.
TOSA_VALID = "TOSA_VALID"


def _channels_last(template: torch.Tensor) -> tuple[int, ...] | None:
    """The order a tensor's dimensions lie in memory, when it is not the order of its shape (a
    channels_last input): TOSA holds the tensor in that order."""
    order = tuple(template.dim_order())
    return order if order != tuple(range(template.dim())) else None


def _to_numpy(value: torch.Tensor) -> Any:
    order = _channels_last(value)
    return (value.permute(order) if order is not None else value).detach().contiguous().numpy()


def _to_torch(array: Any, template: torch.Tensor) -> torch.Tensor:
    """A reference model output as the call's recorded output holds it: its dtype, shape and layout."""
    import numpy as np

    dtype = torch.empty((), dtype=template.dtype).numpy().dtype
    values = torch.from_numpy(np.ascontiguousarray(array).view(dtype).copy())
    order = _channels_last(template)
    if order is None:
        return values.reshape(template.shape)
    stored = values.reshape([template.shape[d] for d in order])
    return stored.permute(sorted(range(len(order)), key=lambda d: order[d]))  # channels_last, as recorded


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The reference model's own lines (a TOSA version note, its errors) kept off stdout and stderr:
    it writes them from C++, past Python's streams, and stdout may be the report."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)


def run_tosa(tosa: bytes, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
             call: Node) -> list[torch.Tensor]:
    """One partition's TOSA run on `inputs` (the delegate call's tensor arguments, in order: the order
    of the TOSA graph's inputs); its outputs shaped like `outputs`, the call's recorded ones."""
    try:
        import tosa_reference_model as reference
    except ImportError as exc:
        raise DelegateFailed(call, f"tosa-tools cannot be imported: {first_line(exc)}") from exc
    try:
        with _quiet():
            arrays, status = reference.run(tosa, [_to_numpy(t) for t in inputs], verbosity="NONE",
                                           initialize_variable_tensor_from_numpy=True)
    except Exception as exc:  # the reference model refuses the graph or an input
        raise DelegateFailed(call, first_line(exc)) from exc
    if status.name != TOSA_VALID:
        raise DelegateFailed(call, f"the reference model ends with {status.name}")
    if len(arrays) != len(outputs):
        raise DelegateFailed(call, f"its TOSA writes {len(arrays)} outputs where the call has {len(outputs)}")
    return [_to_torch(array, template) for array, template in zip(arrays, outputs, strict=True)]


def rescaled(values: torch.Tensor, scale: float, zp_in: int, zp_out: int, dtype: torch.dtype,
             tosa_spec: str) -> torch.Tensor:
    """`values` (one dimension) through one TOSA RESCALE by `scale`, from zero point `zp_in` to `zp_out`
    into `dtype`, run on the reference model: what an NPU computes for a dequantize -> quantize pair
    that Arm's lowering (`InsertRescalePass`) turns into a RESCALE. The operator is serialized by Arm's
    own visitor (`RescaleVisitor`), which derives the fixed-point multiplier and shift; its rounding
    is half up where a quantize rounds half to even, so a fold that leaves such a pair for the NPU is
    proven on this, not on the float quantize. Raises what Arm's serialization or the reference model
    raise (a scale whose shift falls outside TOSA's range)."""
    import tosa_reference_model as reference
    import tosa_serializer as ts
    from executorch.backends.arm.operators.node_visitor import get_node_visitors
    from executorch.backends.arm.process_node import process_call_function, process_inputs, process_output
    from executorch.backends.arm.tosa.specification import TosaLoweringContext, TosaSpecification
    from executorch.exir.dialects._ops import ops as exir_ops
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx import Graph

    spec = TosaSpecification.create_from_string(tosa_spec)
    graph = Graph()
    with FakeTensorMode():
        fake_in, fake_out = torch.empty(values.shape, dtype=values.dtype), torch.empty(values.shape, dtype=dtype)
    read = graph.placeholder("values")
    read.meta["val"] = fake_in
    rescale = graph.call_function(exir_ops.backend.tosa.RESCALE.default, (read, dtype, [scale], zp_in, zp_out))
    rescale.meta["val"] = fake_out
    output = graph.output((rescale,))
    version = spec.version
    serializer = ts.TosaSerializer("", targetMajor=version.major, targetMinor=version.minor,
                                   targetPatch=version.micro, targetDraft=False)
    with TosaLoweringContext(spec):
        process_inputs(read, serializer, spec)
        process_call_function(rescale, serializer, get_node_visitors(spec), spec)
        process_output(output, serializer, spec)
    with _quiet():
        arrays, status = reference.run(serializer.serialize(), [_to_numpy(values)], verbosity="NONE",
                                       initialize_variable_tensor_from_numpy=True)
    if status.name != TOSA_VALID:
        raise RuntimeError(f"the reference model ends with {status.name}")
    return _to_torch(arrays[0], fake_out)


@dataclass(frozen=True)
class DelegateValues:
    """Computes a lowered program's delegate calls with their TOSA on the reference model: what the
    value check runs in place of the Ethos-U (`values.first_divergence`'s `delegates`)."""

    delegation: Delegation

    def __call__(self, node: Node, args: Sequence[Any]) -> tuple[torch.Tensor, ...]:
        compiled = self.delegation.compiled.get(node.name)
        if compiled is None:
            raise DelegateFailed(node, "the lowering kept no TOSA for it")
        recorded = output_value(node)
        outputs = list(recorded) if isinstance(recorded, (tuple, list)) else [recorded]
        inputs = [a for a in args if isinstance(a, torch.Tensor)]
        return tuple(run_tosa(compiled.tosa, inputs, outputs, node))

