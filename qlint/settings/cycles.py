"""The cost model's coefficients: cycles per MAC or element for each kernel class and CMSIS-NN
backend, and per fp32 element by FPU or soft-float, read from `cycles.yaml` beside this module.

Data, not code, so each figure carries its source (`fit:` the measurements it was fitted to, or
`assumed:` why it is what it is) and docs/cost-model.md can list them. torch-free: the estimator
over a program's nodes is `qlint.graph.cost`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any

import yaml

# Cores with no FPU in their architecture (Armv6-M, Armv7-M without the FP extension, Armv8-M
# Baseline); the others (M4, M7, M33, M35P, M55, M85) have an optional one that nearly every part
# ships: a board says `fpu: false` for one that does not.
NO_FPU = frozenset({"cortex-m0", "cortex-m0plus", "cortex-m3", "cortex-m23"})
INT8_CLASSES = ("conv", "pointwise", "depthwise", "transpose", "linear", "pool", "quantize", "elementwise", "copy")
FP32_ARITHMETIC = ("add", "mul", "div", "sqrt", "exp")


@dataclass(frozen=True)
class Coefficient:
    """Cycles of one int8 kernel class: per MAC, per output element, per element (of its output),
    per window (an output pixel's kernel position, which a convolution's im2col copies)."""

    per_mac: float = 0.0
    per_output: float = 0.0
    per_element: float = 0.0
    per_window: float = 0.0
    source: str = ""

    def cycles(self, macs: int, outputs: int, windows: int = 0) -> float:
        return self.per_mac * macs + (self.per_output + self.per_element) * outputs + self.per_window * windows


@dataclass(frozen=True)
class Core:
    """What the estimate is for: the CPU, the CMSIS-NN backend ExecuTorch picks for it, and its FPU."""

    cpu: str
    backend: str        # "mve", "dsp" or "scalar"
    fpu: bool
    clock_hz: int | None = None
    flash_read: float = 0.0   # cycles a byte of weights read once an inference from the board's flash

    def describe(self) -> str:
        clock = f" at {self.clock_hz / 1e6:g} MHz" if self.clock_hz else ""
        flash = f", flash reads {self.flash_read:g} cycles/byte" if self.flash_read else ""
        return f"{self.cpu} ({self.backend.upper()} kernels, {'FPU' if self.fpu else 'soft float'}{flash}){clock}"


@dataclass(frozen=True)
class CostTable:
    int8: Mapping[str, Mapping[str, Coefficient]]   # backend -> kernel class -> coefficient
    dispatch: float                                 # cycles every executed instruction adds
    fp32_loop: float                                # cycles an fp32 element costs besides its arithmetic
    fpu: Mapping[str, Mapping[str, float]]          # cpu -> add/mul/div/sqrt -> cycles an instruction
    soft: Mapping[str, float]                       # add/mul/div/sqrt/exp -> cycles a library call
    exp_in_fpu_ops: float                           # expf on an FPU, in FPU adds and muls
    mac_factor: Mapping[str, float]                 # cpu -> its MAC coefficients against its backend's

    def kernel(self, core: Core, kind: str) -> Coefficient:
        """The coefficient of a kernel class on `core`: its backend's, scaled for its pipeline."""
        base = self.int8[core.backend][kind]
        factor = self.mac_factor.get(core.cpu, 1.0)
        return base if factor == 1.0 else replace(base, per_mac=base.per_mac * factor)

    def arithmetic(self, core: Core, operation: str) -> float:
        """Cycles of one fp32 add, mul, div, sqrt or exp on `core`."""
        if not core.fpu:
            return self.soft[operation]
        timings = self.fpu[core.cpu]
        if operation == "exp":
            return self.exp_in_fpu_ops * timings["mul"]
        return timings[operation]

    def fp32_element(self, core: Core, counts: Mapping[str, float]) -> float:
        """Cycles of one fp32 element whose op does `counts` of each arithmetic operation."""
        return self.fp32_loop + sum(n * self.arithmetic(core, op) for op, n in counts.items())


def _coefficient(row: Mapping[str, Any]) -> Coefficient:
    return Coefficient(float(row.get("per_mac", 0.0)), float(row.get("per_output", 0.0)),
                       float(row.get("per_element", 0.0)), float(row.get("per_window", 0.0)),
                       str(row.get("fit") or row.get("assumed") or ""))


@functools.cache
def cost_table() -> CostTable:
    """`cycles.yaml`, read once, when a program is estimated (not on every start)."""
    text = resources.files("qlint.settings").joinpath("cycles.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    fp32 = data["fp32"]
    return CostTable(
        int8={backend: {kind: _coefficient(row) for kind, row in kinds.items()}
              for backend, kinds in data["int8"].items()},
        dispatch=float(data["dispatch"]["per_op"]),
        fp32_loop=float(fp32["loop"]["per_element"]),
        fpu={cpu: {k: float(v) for k, v in row.items() if k != "source"} for cpu, row in fp32["fpu"].items()},
        soft={k: float(v) for k, v in fp32["soft"].items() if k != "source"},
        exp_in_fpu_ops=float(fp32["exp_in_fpu_ops"]),
        mac_factor={cpu: float(row["mac"]) for cpu, row in data.get("cores", {}).items()},
    )


def default_fpu(cpu: str) -> bool:
    return cpu not in NO_FPU
