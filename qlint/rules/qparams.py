"""The one record of per-tensor quantization parameters, the same in both tiers and every output.

The dtype is a name (`int8`), so the record needs no torch; the graph layer turns it into a torch
dtype where it runs kernels (`qlint.loading.view.torch_dtype`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The quantized dtypes whose every value an identity verdict runs (int32 has too many).
EXHAUSTIVE_DTYPES = frozenset({"int8", "uint8", "int16", "uint16"})


@dataclass(frozen=True)
class QParams:
    """Per-tensor quantization parameters, as literal arguments of a quantize/dequantize node."""

    scale: float
    zero_point: int
    qmin: int
    qmax: int
    dtype: str   # int8, uint8, int16, uint16

    def __str__(self) -> str:
        """How a finding prints them: `int8(scale=0.1, zp=-7, range=[-128, 127])`."""
        return f"{self.dtype}(scale={self.scale:.6g}, zp={self.zero_point}, range=[{self.qmin}, {self.qmax}])"

    def to_dict(self) -> dict[str, Any]:
        """As a finding's details hold them (JSON, SARIF properties, the cache)."""
        return {"scale": self.scale, "zero_point": self.zero_point, "qmin": self.qmin, "qmax": self.qmax,
                "dtype": self.dtype}
