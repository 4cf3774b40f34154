"""The cost model's figures: cycles per MAC or element for each kernel class and CMSIS-NN backend,
per fp32 instruction by core (or per soft-float call on a core without an FPU), the arithmetic each
fp32 op does an element and the dispatch cost, read from `cycles.yaml` beside this module.

Data, not code, so each figure carries its source (`fit:` the measurements it was fitted to,
`source:` the manual it is quoted from, or `assumed:` why it is what it is), docs/cost-model.md
renders them and the file is checked when it is read: a table that misses a CPU, a kernel class or
a source fails with one line naming the key, not with a KeyError mid-estimate. torch-free: the
estimator over a program's nodes is `qlint.device.cost`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any, NamedTuple, NoReturn

import yaml

# The CPUs `target_cpu` and --target-cpu accept: cycles.yaml prices each (FPU timings or none).
CPUS = (
    "cortex-m0", "cortex-m0plus", "cortex-m3", "cortex-m4", "cortex-m7", "cortex-m23",
    "cortex-m33", "cortex-m35p", "cortex-m55", "cortex-m85",
)
BACKENDS = ("mve", "dsp", "scalar")   # what `lowering.target_config` picks for a CPU
INT8_CLASSES = ("conv", "pointwise", "depthwise", "transpose", "linear", "pool", "quantize", "elementwise", "copy")
# The classes priced by the MAC: what a core whose pipeline runs its backend's kernels faster scales, one
# factor each (`cores`), since its gain differs by the instructions each class's inner loop issues.
MAC_CLASSES = ("conv", "pointwise", "depthwise", "transpose", "linear")
INT8_UNITS = ("per_mac", "per_output", "per_element", "per_window")
FPU_INSTRUCTIONS = ("add", "mul", "div", "sqrt")   # what an FPU row times; soft float adds `exp`
SOURCES = ("fit", "source", "assumed")


class Source(NamedTuple):
    """Where a figure comes from: `kind` is fit, source or assumed, `text` says what."""

    kind: str
    text: str


class CostTableError(ValueError):
    """`cycles.yaml` is malformed: the message names the key."""


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
    exp_in_fpu_ops: float                           # expf on an FPU, in FPU muls
    mac_factor: Mapping[str, Mapping[str, float]]   # cpu -> MAC class -> its per-MAC figure against its backend's
    no_fpu: frozenset[str]                          # cpus whose architecture has no FPU
    mac: Mapping[str, float]                        # the arithmetic of one fp32 MAC
    conversion: Mapping[str, float]                 # the arithmetic of quantizing or dequantizing an element
    ops: Mapping[str, Mapping[str, float]]          # fp32 op base name -> its arithmetic an element
    other: Mapping[str, float]                      # the arithmetic of an fp32 op not in `ops`
    sources: Mapping[str, Source]                   # each row's key (`int8.mve.conv`) -> its source

    def kernel(self, core: Core, kind: str) -> Coefficient:
        """The coefficient of a kernel class on `core`: its backend's, scaled for its pipeline."""
        base = self.int8[core.backend][kind]
        factor = self.mac_factor.get(core.cpu, {}).get(kind, 1.0)
        return base if factor == 1.0 else replace(base, per_mac=base.per_mac * factor)

    def arithmetic_of(self, op: str) -> Mapping[str, float]:
        """The arithmetic an fp32 op (by its base name) does an element."""
        return self.ops.get(op, self.other)

    def arithmetic(self, core: Core, operation: str) -> float:
        """Cycles of one fp32 add, mul, div, sqrt or exp on `core`."""
        if not core.fpu:
            return self.soft[operation]
        timings = self.fpu[core.cpu]
        if operation == "exp":
            return self.exp_in_fpu_ops * timings["mul"]
        return timings[operation]

    def fp32_work(self, core: Core, counts: Mapping[str, float]) -> float:
        """Cycles of `counts` of each arithmetic operation on `core`."""
        return sum(n * self.arithmetic(core, op) for op, n in counts.items())

    def fp32_element(self, core: Core, counts: Mapping[str, float]) -> float:
        """Cycles of one fp32 element whose op does `counts` of each arithmetic operation."""
        return self.fp32_loop + self.fp32_work(core, counts)


def _fail(key: str, what: str) -> NoReturn:
    raise CostTableError(f"cycles.yaml: {key}: {what}")


def _mapping(value: Any, key: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        _fail(key, f"expected a mapping, got {value!r}")
    return value


def _get(data: Mapping[str, Any], name: str, key: str) -> Any:
    """`data[name]`, where `key` names `data`'s place in the file."""
    if name not in data:
        _fail(f"{key}.{name}" if key else name, "missing")
    return data[name]


def _number(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        _fail(key, f"expected a number of cycles (0 or more), got {value!r}")
    return float(value)


def _source(row: Mapping[str, Any], key: str, allowed: tuple[str, ...]) -> Source:
    """A row's one fit:, source: or assumed:; a key it does not know is refused, so a misspelt one
    is not silently priced as 0."""
    for name in row:
        if name not in allowed and name not in SOURCES:
            _fail(f"{key}.{name}", f"unknown key (known: {', '.join((*allowed, *SOURCES))})")
    given = [kind for kind in SOURCES if kind in row]
    if len(given) != 1 or not isinstance(row[given[0]], str) or not row[given[0]].strip():
        _fail(key, "needs one of fit:, source: or assumed: saying where its figures come from")
    return Source(given[0], row[given[0]].strip())


class _Reader:
    """Reads rows of figures, keeping each row's source under its key."""

    def __init__(self) -> None:
        self.sources: dict[str, Source] = {}

    def row(self, value: Any, key: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> dict[str, float]:
        """The figures of a row among `allowed` (those in `required` present, at least one)."""
        row = _mapping(value, key)
        self.sources[key] = _source(row, key, allowed)
        for name in required:
            _get(row, name, key)
        figures = {name: _number(v, f"{key}.{name}") for name, v in row.items() if name in allowed}
        if not figures:
            _fail(key, f"no figure (one of {', '.join(allowed)})")
        return figures

    def one(self, data: Mapping[str, Any], name: str, key: str, figure: str) -> float:
        """The single figure of the row `data[name]`."""
        return self.row(_get(data, name, key), f"{key}.{name}" if key else name, (figure,), (figure,))[figure]


def _known(cpu: str, cpus: tuple[str, ...], key: str) -> str:
    if cpu not in cpus:
        _fail(f"{key}.{cpu}", f"not a CPU target_cpu accepts ({', '.join(cpus)})")
    return cpu


def parse_table(data: Any, cpus: Iterable[str]) -> CostTable:
    """The cost table of `data` (cycles.yaml as read), checked: every backend prices every kernel
    class, every CPU of `cpus` has FPU timings or `none: true`, every row has its source."""
    data, cpus = _mapping(data, "cycles.yaml"), tuple(cpus)
    read = _Reader()
    int8 = _int8(read, _mapping(_get(data, "int8", ""), "int8"))
    cores = _mapping(data.get("cores", {}), "cores")
    mac_factor = {cpu: read.row(_get(cores, _known(cpu, cpus, "cores"), "cores"), f"cores.{cpu}", MAC_CLASSES,
                                MAC_CLASSES) for cpu in cores}
    dispatch = read.one(data, "dispatch", "", "per_op")
    fp32 = _mapping(_get(data, "fp32", ""), "fp32")
    loop = read.one(fp32, "loop", "fp32", "per_element")
    fpu, no_fpu = _fpu(read, _mapping(_get(fp32, "fpu", "fp32"), "fp32.fpu"), cpus)
    operations = (*FPU_INSTRUCTIONS, "exp")
    soft = read.row(_get(fp32, "soft", "fp32"), "fp32.soft", operations, operations)
    exp = read.one(fp32, "exp", "fp32", "fpu_muls")
    mac = read.row(_get(fp32, "mac", "fp32"), "fp32.mac", operations)
    conversion = read.row(_get(fp32, "conversion", "fp32"), "fp32.conversion", operations)
    ops = {op: read.row(value, f"fp32.arithmetic.{op}", operations)
           for op, value in _mapping(_get(fp32, "arithmetic", "fp32"), "fp32.arithmetic").items()}
    other = ops.pop("other", None)
    if other is None:
        _fail("fp32.arithmetic.other", "missing (the arithmetic of an op not listed)")
    return CostTable(int8, dispatch, loop, fpu, soft, exp, mac_factor, no_fpu, mac, conversion, ops, other,
                     read.sources)


def _int8(read: _Reader, backends: Mapping[str, Any]) -> dict[str, dict[str, Coefficient]]:
    """Every backend's coefficient of every kernel class."""
    for backend in backends:
        if backend not in BACKENDS:
            _fail(f"int8.{backend}", f"unknown backend (known: {', '.join(BACKENDS)})")
    int8: dict[str, dict[str, Coefficient]] = {}
    for backend in BACKENDS:
        kinds = _mapping(_get(backends, backend, "int8"), f"int8.{backend}")
        for kind in kinds:
            if kind not in INT8_CLASSES:
                _fail(f"int8.{backend}.{kind}", f"unknown kernel class (known: {', '.join(INT8_CLASSES)})")
        int8[backend] = {}
        for kind in INT8_CLASSES:
            key = f"int8.{backend}.{kind}"
            figures = read.row(_get(kinds, kind, f"int8.{backend}"), key, INT8_UNITS)
            int8[backend][kind] = Coefficient(figures.get("per_mac", 0.0), figures.get("per_output", 0.0),
                                              figures.get("per_element", 0.0), figures.get("per_window", 0.0),
                                              read.sources[key].text)
    return int8


def _fpu(read: _Reader, rows: Mapping[str, Any],
         cpus: tuple[str, ...]) -> tuple[dict[str, dict[str, float]], frozenset[str]]:
    """Each CPU's FPU instruction timings, and the CPUs marked `none: true` (no FPU: soft float)."""
    for cpu in rows:
        _known(cpu, cpus, "fp32.fpu")
    fpu: dict[str, dict[str, float]] = {}
    no_fpu: set[str] = set()
    for cpu in cpus:
        key = f"fp32.fpu.{cpu}"
        if cpu not in rows:
            _fail(key, "missing: every CPU target_cpu accepts has FPU timings (add, mul, div, sqrt) or none: true")
        row = _mapping(rows[cpu], key)
        if "none" in row:
            if row["none"] is not True:
                _fail(f"{key}.none", f"expected true (the core has no FPU), got {row['none']!r}")
            read.sources[key] = _source(row, key, ("none",))
            no_fpu.add(cpu)
        else:
            fpu[cpu] = read.row(row, key, FPU_INSTRUCTIONS, FPU_INSTRUCTIONS)
    return fpu, frozenset(no_fpu)


@functools.cache
def cost_table() -> CostTable:
    """`cycles.yaml`, read and checked once, when a program is estimated or a board's FPU is checked
    (not on every start)."""
    text = resources.files("qlint.settings").joinpath("cycles.yaml").read_text(encoding="utf-8")
    return parse_table(yaml.safe_load(text), CPUS)


def default_fpu(cpu: str) -> bool:
    """Whether `cpu`'s architecture has an FPU (cycles.yaml marks those without one `none: true`)."""
    return cpu not in cost_table().no_fpu
