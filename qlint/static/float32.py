"""float32 arithmetic without torch: what quantize(x op c ... (dequantize(q))) gives, bit for bit.

The static tier decides whether a constant scale island is an exact identity
without importing torch. Every step rounds to float32 as torch's CPU kernels do:
operands are first converted to float32 (a Python scalar too), one `+ - * /` is
rounded once, `round` is half-to-even, the quantize clamps. A scalar (a constant
the graph computes) is computed in double and rounded once (exact: double has
more than twice float32's precision, so the double rounding is innocuous); the
exhaustive verdict runs every integer of the dtype at once in numpy float32
(numpy is a dependency of ExecuTorch; torch is not imported).
`tests/full/test_static.py` compares both with torch on every integer of every island
of the test corpus.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from qlint.io.wellformed import QUANT_RANGES
from qlint.rules.qparams import QParams

_F32 = struct.Struct("<f")


def f32(x: float) -> float:
    """`x` rounded to the nearest float32 (ties to even); beyond float32's range, infinity."""
    try:
        return float(_F32.unpack(_F32.pack(x))[0])
    except OverflowError:
        return math.copysign(math.inf, x)


def binary(op: str, a: float, b: float) -> float:
    """One float32 `a op b` (op: add, sub, mul, div, rsub)."""
    a, b = f32(a), f32(b)
    if op == "add":
        return f32(a + b)
    if op == "sub":
        return f32(a - b)
    if op == "rsub":
        return f32(b - a)
    if op == "mul":
        return f32(a * b)
    if op == "div":
        if b == 0.0:
            return math.nan if a == 0.0 or math.isnan(a) else math.copysign(math.inf, a) * math.copysign(1.0, b)
        return f32(a / b)
    raise ValueError(op)


def dequantize(q: int, qp: QParams) -> float:
    """`(q.to(float32) - zero_point) * scale`, in float32."""
    return binary("mul", binary("sub", float(q), float(qp.zero_point)), qp.scale)


def quantize(x: float, qp: QParams) -> int:
    """`clamp(round(x * (1.0 / scale)) + zero_point, qmin, qmax)`, in float32."""
    scaled = binary("mul", x, 1.0 / qp.scale)
    if math.isnan(scaled):
        raise ValueError("NaN reaches a quantize")
    rounded = scaled if math.isinf(scaled) else float(round(scaled))
    shifted = binary("add", rounded, float(qp.zero_point))
    return int(min(max(shifted, qp.qmin), qp.qmax))


def every_output(qp_in: QParams, steps: Sequence[tuple[str, float]], qp_out: QParams) -> tuple[Any, Any]:
    """The island on every integer of the input dtype at once, in numpy float32 (IEEE like the
    scalar steps above, 65,536 integers in well under a millisecond): the output integers (int64)
    and where a NaN reached the quantize."""
    import numpy as np

    low, high = QUANT_RANGES[qp_in.dtype]
    with np.errstate(all="ignore"):
        x = (np.arange(low, high + 1).astype(np.float32) - np.float32(qp_in.zero_point)) * np.float32(qp_in.scale)
        for op, constant in steps:
            c = np.float32(constant)
            x = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}[op](x, c) \
                if op != "rsub" else np.subtract(c, x)
        scaled = x * np.float32(1.0 / qp_out.scale)
        nan = np.isnan(scaled)
        shifted = np.rint(np.where(nan, np.float32(0), scaled)) + np.float32(qp_out.zero_point)
        return np.clip(shifted, qp_out.qmin, qp_out.qmax).astype(np.int64), nan


@lru_cache(maxsize=4096)
def is_identity(qp_in: QParams, steps: tuple[tuple[str, float], ...], qp_out: QParams) -> bool:
    """quantize(f(dequantize(q))) == q for every q the input's producer can emit ([qmin, qmax]),
    and no NaN reaches the quantize for any integer of the dtype. Islands with the same qparams
    and constants are decided once."""
    import numpy as np

    if qp_out.dtype != qp_in.dtype:
        return False
    outputs, nan = every_output(qp_in, steps, qp_out)
    low = QUANT_RANGES[qp_in.dtype][0]
    inside = outputs[qp_in.qmin - low: qp_in.qmax - low + 1]
    return not nan.any() and bool(np.array_equal(inside, np.arange(qp_in.qmin, qp_in.qmax + 1)))
