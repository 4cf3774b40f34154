"""The `int8-io` remedy: the program takes int8 inputs and returns int8 outputs, and how a float
batch crosses that boundary (`feed` in, `read` out) when the search runs and measures it.
"""

from __future__ import annotations

from typing import Any

from qlint.loading import stack

stack.load()

import torch  # noqa: E402
from torch.fx import Node  # noqa: E402

from qlint.records.results import ProgramIO, ProgramPort  # noqa: E402
from qlint.remedies.remedy import Remedy  # noqa: E402
from qlint.rules.qparams import QParams  # noqa: E402
from qlint.settings.config import RemedyName  # noqa: E402


class Int8IO(Remedy):
    """The program takes int8 inputs and returns int8 outputs: ExecuTorch's quantized-IO passes.

    An MCU application usually has integer data already; the fp32 inputs (and the
    quantize that converts them) are what holds SAM's arena at its live peak.
    """

    name = RemedyName.INT8_IO
    user_change = (
        "from executorch.exir.passes.quantize_io_pass import quantize_input, quantize_output",
        "for i in range(len(exported.graph_signature.user_inputs)): quantize_input(exported, i)  # before to_edge",
        "for i in range(len(exported.graph_signature.user_outputs)): quantize_output(exported, i)",
    )

    def not_applicable(self, graph: Any) -> str | None:
        return None  # known only once quantized: `on_program` says which inputs and outputs qualify

    def on_program(self, program: Any) -> ProgramIO:
        from executorch.exir.passes.quantize_io_pass import quantize_input, quantize_output
        from torch.export.graph_signature import TensorArgument

        quant = torch.ops.quantized_decomposed
        signature = program.graph_signature
        inputs = []
        for index, name in enumerate(signature.user_inputs):
            placeholder = next(n for n in program.graph.nodes if n.op == "placeholder" and n.name == name)
            users = list(placeholder.users)
            if len(users) == 1 and users[0].target == quant.quantize_per_tensor.default:
                inputs.append(_io_qparams(name, index, quantize_input(program, index)))
        outputs = []
        output_node = program.graph.output_node()
        specs = [s for s in signature.output_specs if s.kind.name == "USER_OUTPUT"]
        for index, value in enumerate(output_node.args[0]):
            if isinstance(value, Node) and value.target == quant.dequantize_per_tensor.default:
                outputs.append(_io_qparams(value.name, index, quantize_output(program, index)))
                specs[index].arg = TensorArgument(name=output_node.args[0][index].name)  # keep the signature true
        return ProgramIO(tuple(inputs), tuple(outputs))


def _io_qparams(name: str, index: int, args: tuple[Any, ...]) -> ProgramPort:
    scale, zero_point, qmin, qmax, dtype = args
    return ProgramPort(name, index, QParams(float(scale), int(zero_point), int(qmin), int(qmax),
                                            str(dtype).removeprefix("torch.")))


def feed(batch: tuple[Any, ...], io: ProgramIO | None) -> tuple[Any, ...]:
    """A float batch as the program takes it: the inputs `io` made integer, quantized with their qparams."""
    by_index = {p.index: p.qparams for p in io.inputs} if io is not None else {}
    return tuple(
        torch.ops.quantized_decomposed.quantize_per_tensor.default(
            t, q.scale, q.zero_point, q.qmin, q.qmax, getattr(torch, q.dtype))
        if (q := by_index.get(index)) is not None else t
        for index, t in enumerate(batch)
    )


def read(outputs: list[Any], io: ProgramIO | None) -> list[Any]:
    """The program's outputs as floats: the ones `io` made integer, dequantized with their qparams."""
    by_index = {p.index: p.qparams for p in io.outputs} if io is not None else {}
    return [
        torch.ops.quantized_decomposed.dequantize_per_tensor.default(
            t, q.scale, q.zero_point, q.qmin, q.qmax, t.dtype)
        if (q := by_index.get(index)) is not None else t
        for index, t in enumerate(outputs)
    ]
