"""The Finding record every rule produces and every reporter consumes."""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from qlint._compat import StrEnum
from qlint.io.reads import printable
from qlint.io.vela import NpuBlob, NpuPartition
from qlint.rules.qparams import QParams
from qlint.rules.table import Code

# A shape or argument list in a cause (`conv2d output [1, 8, 8, 8] is NCHW`).
_SHAPE = re.compile(r"\[-?\d+(?:, -?\d+)*\]")


def shapes_elided(reason: str) -> str:
    """A cause with its shape lists elided: causes that differ only in these are one root cause
    (a network of NCHW convolutions of many sizes)."""
    return _SHAPE.sub("[...]", reason)


class Severity(StrEnum):
    """How much a finding matters; `off` deselects its rule."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"
    OFF = "off"


@dataclass(frozen=True)
class Location:
    """Where in the user's model source a graph node was created."""

    path: str
    line: int
    code: str = ""
    file: str = field(default="", compare=False)  # absolute path, to read the line's comments

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass
class Finding:
    code: Code
    severity: Severity
    message: str
    artifact: str
    node: str = ""
    location: Location | None = None
    fixable: bool = False
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["location"] = asdict(self.location) if self.location else None
        return data


@dataclass(frozen=True)
class ProfileRow:
    """One operator of a profiled program: how many calls, and their cycles as estimated and measured."""

    op: str
    calls: int
    estimated: int
    measured: int
    npu: int | None = None  # delegate calls: the NPU's runs within the measured cycles (the Ethos-U backend's event)

    @property
    def ratio(self) -> float | None:
        """Measured over estimated: above 1, the estimate is short."""
        return self.measured / self.estimated if self.estimated else None


@dataclass
class ArtifactStats:
    """Per-artifact numbers for the summary table."""

    artifact: str
    nodes: int = 0
    int_kernels: int = 0
    fp32_islands: int = 0
    fp32_elements: int = 0
    coverage: float = 1.0
    coverage_counts: str = "ops"   # with an NPU read from a `.pte`, "calls": each partition counted as one op
    lowered: bool = True
    graph: str = "graph"   # the id Model Explorer's adapter gives the program's graph
    static: bool = False   # read by `--static`: no lowering, so no kernels or coverage
    cycles: int | None = None         # estimated for the run's core (`qlint.device.cost`); None: not lowered
    fp32_cycles: int | None = None    # of which on float values
    latency_ms: float | None = None   # at the board's clock, when a board is set
    core: str = ""                    # what the estimate is for (`Core.describe`)
    costliest: tuple[Contributor, ...] = ()  # the ops that take the most of the estimate, costliest first
    node_cycles: dict[str, int] = field(default_factory=dict)  # by the checked program's node ids (Model Explorer)
    measured_runs: int = 0            # 0: the cycles are estimated; else the median of this many runs of a profile
    profile: tuple[ProfileRow, ...] = ()  # with a profile: the estimate beside the measurement, per operator
    target: str = ""                  # the NPU the program was lowered for; "": the Cortex-M CPU alone
    partitions: int | None = None     # delegate calls (NPU partitions); None: not lowered for an NPU
    delegates: tuple[NpuPartition, ...] = ()  # each delegate call's command stream, flash, SRAM, cycles, in order
    npu_cycles: int | None = None     # of `cycles`, the NPU's (Vela's estimates, on the NPU's clock)
    cpu_cycles: int | None = None     # of `cycles`, the core's (every op but the delegate calls)
    npu_nodes: dict[str, int] = field(default_factory=dict)  # node id (Model Explorer) -> its NPU partition, from 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class InputError:
    """A path or target that could not be read: reported in one line, exit code 2."""

    artifact: str
    message: str

    def __str__(self) -> str:
        return printable(f"{self.artifact}: {self.message}")


@dataclass(frozen=True)
class AppliedFold:
    """One fold `--fix` applied (or, with `--diff`, would apply)."""

    code: Code
    node: str
    kind: str      # identity | table | rescale
    change: str    # what was rewritten, in words


@dataclass(frozen=True)
class LeftIsland:
    """An island or requantize pair `--fix` leaves, and why."""

    code: Code
    node: str
    reason: str


@dataclass(frozen=True)
class Buffer:
    """One tensor of a planned arena: live from step `start` to step `end` (inclusive), at `offset`.
    A reader records it (`loading.pte`, `device.memory.planned_buffers`); `device.memory` sums it."""

    start: int
    end: int
    offset: int
    size: int
    fp32: bool
    input: bool
    name: str = ""                 # the value: a graph node, or a `.pte` value index
    what: str = ""                 # its dtype, shape and the op that writes it
    location: Location | None = None  # the model source line of that op, when known


@dataclass(frozen=True)
class LivePeak:
    """The most bytes a program's memory plan holds at one step: a floor under any plan."""

    bytes: int                  # live at the peak step
    fp32_bytes: int             # of which fp32 tensors
    input_bytes: int            # of which graph inputs
    node: str                   # the operator that runs at that step
    location: str | None = None  # the model source line that created it
    step: int = 0               # its index in the timeline


@dataclass(frozen=True)
class MemoryTimeline:
    """Planned arena bytes live at every step of a program (a step is a node of the planned graph):
    what `--write memory-plot:` draws, and where the live peak is read from."""

    total: tuple[int, ...]
    fp32: tuple[int, ...]      # of which fp32 tensors; the rest are integer


@dataclass(frozen=True)
class PlanMemory:
    """The memory plan a shipped `.pte` carries: its arena, and the bytes live at every instruction."""

    artifact: str
    arena_bytes: int            # planned (non_const_buffer_sizes)
    timeline: MemoryTimeline    # step 0: the inputs; step i: the i-th instruction
    peak: LivePeak

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _op_counts(ops: list[str]) -> str:
    """`aten.convolution.default x9, aten.relu.default x8`: an island's ops, each once with its count."""
    counts: dict[str, int] = {}
    for op in ops:
        counts[op] = counts.get(op, 0) + 1
    return ", ".join(op if n == 1 else f"{op} x{n}" for op, n in counts.items())


@dataclass(frozen=True)
class Contributor:
    """A part of a budgeted figure that the user can change: a tensor live at the SRAM peak, a constant
    in flash, an fp32 island."""

    name: str                    # a graph node, a parameter's module path, an island's ops
    amount: int                  # bytes (fp32 work: elements per inference)
    what: str = ""               # dtype, shape, what writes it
    location: Location | None = None  # the model source line, when known

    @staticmethod
    def islands(findings: list[Finding], shown: int = 5) -> tuple[Contributor, ...]:
        """The fp32 islands of these findings by elements per inference, largest first: what the fp32
        budgets are made of."""
        found = sorted((f for f in findings if f.details.get("fp32_elements")),
                       key=lambda f: (-int(f.details["fp32_elements"]), f.node))
        return tuple(Contributor(f"{f.code} island at {f.node}", int(f.details["fp32_elements"]),
                                 _op_counts(f.details.get("ops") or []), f.location) for f in found[:shown])

    def __str__(self) -> str:
        where = f" at {self.location}" if self.location else ""
        what = f" ({self.what})" if self.what else ""
        return f"{self.name}{what}{where}: {self.amount:,}"


@dataclass
class Figures:
    """What one artifact or target measures against its budgets, and what `--write metrics:` records."""

    artifact: str
    measured: str                       # which program: the `.pte` as shipped, or the one `--fix` writes
    findings: dict[str, int] = field(default_factory=dict)   # by code
    fp32_islands: int = 0
    fp32_elements: int = 0
    coverage: float = 1.0
    arena_bytes: int | None = None      # planned (non_const_buffer_sizes)
    live_peak_bytes: int | None = None
    method_allocator_bytes: int | None = None  # Method::init's values, tensor metadata, argument lists
    npu_scratch_bytes: int | None = None  # the largest NPU partition's Vela scratch; None: no NPU partitions
    sram_bytes: int | None = None       # what the SRAM budget holds: the arena, the method allocator, the NPU scratch
    flash_bytes: int | None = None      # the .pte's length
    sram: tuple[Contributor, ...] = ()  # tensors live at the peak, largest first
    flash: tuple[Contributor, ...] = ()  # the largest constants
    fp32: tuple[Contributor, ...] = ()  # the largest fp32 islands (elements per inference)
    sram_budget: int | None = None      # the resolved SRAM budget, which the memory plot draws
    cycles: int | None = None           # the estimate on the run's core (`qlint.device.cost`)
    fp32_cycles: int | None = None
    latency_ms: float | None = None     # at the board's clock
    time: tuple[Contributor, ...] = ()  # the costliest ops (cycles)
    measured_runs: int = 0              # 0: cycles estimated; else measured, the median of this many runs

    METRICS = ("fp32_islands", "fp32_elements", "coverage", "arena_bytes", "live_peak_bytes",
               "method_allocator_bytes", "npu_scratch_bytes", "sram_bytes", "flash_bytes", "cycles", "fp32_cycles",
               "latency_ms")

    @classmethod
    def of(cls, artifact: str, measured: str, checked: list[Finding], stats: ArtifactStats,
           findings: list[Finding]) -> Figures:
        """The figures that need no memory plan: the check's findings by code (`checked`), and the
        fp32 work of the measured program (its `stats` and `findings`)."""
        return cls(artifact, measured, dict(Counter(f.code for f in checked)), stats.fp32_islands,
                   stats.fp32_elements, stats.coverage, fp32=Contributor.islands(findings), cycles=stats.cycles,
                   fp32_cycles=stats.fp32_cycles, latency_ms=stats.latency_ms, time=stats.costliest,
                   measured_runs=stats.measured_runs)

    def timed_by(self, stats: ArtifactStats) -> None:
        """The time figures of `stats` in place of these: a profile measured the program these
        figures are of (the `.pte` `--fix` writes), through the lint of the program it came from."""
        self.cycles, self.fp32_cycles, self.latency_ms = stats.cycles, stats.fp32_cycles, stats.latency_ms
        self.time, self.measured_runs = stats.costliest, stats.measured_runs

    def with_memory(self, arena: int, live_peak: int | None, flash: int, method_bytes: int,
                    at_peak: tuple[Contributor, ...], constants: tuple[Contributor, ...],
                    delegates: tuple[NpuBlob, ...] = ()) -> None:
        """The memory figures of the measured program. SRAM as budgeted is the planned arena plus what
        loading the program takes from the method allocator, which leads the SRAM contributors, plus,
        with NPU partitions (`delegates`, in execution order), the largest partition's Vela scratch:
        ExecuTorch's Ethos-U backend takes each partition's scratch from the temp allocator when the
        partition runs, and the method resets that allocator after every instruction, so partitions,
        which run one at a time, reuse it."""
        scratch = max((d.sram for d in delegates), default=None)
        self.arena_bytes, self.live_peak_bytes, self.npu_scratch_bytes = arena, live_peak, scratch
        self.method_allocator_bytes, self.sram_bytes = method_bytes, arena + method_bytes + (scratch or 0)
        self.sram = (Contributor("method allocator", method_bytes, "values, tensor metadata and kernel argument "
                                 "lists Method::init allocates; 64-bit layout, an upper bound on Cortex-M"),
                     *npu_scratch(delegates), *at_peak)
        self.with_flash(flash, constants, delegates)

    def with_flash(self, flash: int, constants: tuple[Contributor, ...], delegates: tuple[NpuBlob, ...] = ()) -> None:
        """Flash: the `.pte`'s length. Each NPU partition's command stream and weights are inside it (the
        Vela blob the delegate call holds), so they are named beside the largest constants, largest first."""
        self.flash_bytes = flash
        self.flash = tuple(sorted((*npu_flash(delegates), *constants), key=lambda c: -c.amount))

    def to_dict(self) -> dict[str, Any]:
        """The figures `--write metrics:` and `--compare` exchange (contributors are the report's)."""
        return {"measured": self.measured, "findings": dict(sorted(self.findings.items())),
                **{key: getattr(self, key) for key in self.METRICS}, "cycles_measured_runs": self.measured_runs}


NPU_PART = "NPU partition"   # how a contributor names a delegate call, counted from 1 in execution order


def npu_scratch(delegates: tuple[NpuBlob, ...]) -> tuple[Contributor, ...]:
    """Each NPU partition's scratch as an SRAM contributor; the largest is what SRAM counts."""
    return tuple(Contributor(f"{NPU_PART} {k} scratch (Vela)", d.sram, "the SRAM the NPU works in, from the temp "
                             "allocator while the partition runs") for k, d in enumerate(delegates, 1))


def npu_flash(delegates: tuple[NpuBlob, ...]) -> tuple[Contributor, ...]:
    """Each NPU partition's weights and command stream as flash contributors. Weights Vela placed in an
    external data file (a `.ptd`) are not in the `.pte`: named with 0 bytes, and said not to be counted."""
    found = []
    for k, d in enumerate(delegates, 1):
        if d.external_weights:
            found.append(Contributor(f"{NPU_PART} {k} weights (Vela)", 0, "in an external data file, not in the "
                                     ".pte: not counted"))
        else:
            found.append(Contributor(f"{NPU_PART} {k} weights (Vela)", d.flash, "read by the NPU, in the .pte"))
        found.append(Contributor(f"{NPU_PART} {k} command stream (Vela)", d.command_stream, "in the .pte"))
    return tuple(found)


@dataclass(frozen=True)
class Delta:
    """One artifact's figures before and after a change (`None` before: a new artifact; after: removed)."""

    artifact: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None

    def changed(self) -> list[tuple[str, Any, Any]]:
        """(figure, before, after) for each figure that differs."""
        if self.before is None or self.after is None:
            return []
        return [(key, self.before.get(key), self.after.get(key)) for key in Figures.METRICS
                if self.before.get(key) != self.after.get(key)]


@dataclass
class FixSummary:
    """What `--fix` did to one artifact (or, with `--diff`, would do)."""

    artifact: str
    folds: list[AppliedFold] = field(default_factory=list)
    left: list[LeftIsland] = field(default_factory=list)
    islands_found: int = 0
    fp32_ops: tuple[int, int] = (0, 0)              # float compute ops before, after
    fp32_elements: tuple[int, int] = (0, 0)
    activation_bytes: tuple[int, int] = (0, 0)      # planned (non_const_buffer_sizes)
    live_peak_bytes: tuple[int, int] = (0, 0)       # the floor under any plan of the program
    live_peak: LivePeak | None = None               # after the fix
    live_peak_before: LivePeak | None = None
    memory: tuple[MemoryTimeline | None, MemoryTimeline | None] = (None, None)  # before, after
    cycles: tuple[int | None, int | None] = (None, None)       # estimated, before and after
    fp32_cycles: tuple[int | None, int | None] = (None, None)
    partitions: tuple[int | None, int | None] = (None, None)   # NPU partitions before, after (None: the CPU flow)
    pte_bytes: int = 0
    lowering_repair: bool = False
    verified_inputs: int = 0
    output: str | None = None
    dry_run: bool = False
    not_written: str = ""   # why no fix was written: the check found what it cannot fix (its findings say it)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Measurement:
    """One build of a target, lowered and fixed: what runs in int8, its memory, how close it is to the float model."""

    coverage: float
    fp32_ops: int
    fp32_elements: int
    arena_bytes: int             # planned activation memory
    live_peak_bytes: int         # the floor under any plan
    table_folds: int             # islands folded into a 256-entry table (an identity needs none)
    sqnr_db: float               # int8 program against the float model (inf: equal outputs)
    kernels: dict[str, int]      # Cortex-M kernels in the lowered program, by name
    cycles: int | None = None    # the inference's, estimated on the run's core (a gain on an NPU target only)
    npu_cycles: int | None = None  # an NPU target's: Vela's for its partitions
    cpu_cycles: int | None = None  # an NPU target's: the CPU's ops
    partitions: int | None = None  # an NPU target's delegate calls


@dataclass(frozen=True)
class ProgramPort:
    """One int8 program input or output: the application converts it with `qparams`
    (q = round(x / scale) + zero_point in, x = (q - zero_point) * scale out)."""

    name: str
    index: int        # position among the program's user inputs (or outputs)
    qparams: QParams

    def to_dict(self) -> dict[str, Any]:
        """Flat, as JSON has always carried a port: name, index, then the qparams' fields."""
        return {"name": self.name, "index": self.index, **self.qparams.to_dict()}


@dataclass(frozen=True)
class ProgramIO:
    """The program inputs and outputs the `int8-io` remedy made integer; the others stay float."""

    inputs: tuple[ProgramPort, ...] = ()
    outputs: tuple[ProgramPort, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"inputs": [p.to_dict() for p in self.inputs], "outputs": [p.to_dict() for p in self.outputs]}


class RemedyStatus(StrEnum):
    KEPT = "kept"          # it helped and accuracy stayed within the guard
    SKIPPED = "skipped"    # it does not apply, or it did not help
    REFUSED = "refused"    # it helped, but its SQNR drop is over the guard
    FAILED = "failed"      # export, quantization or lowering raised with it


@dataclass(frozen=True)
class SiteMeasurement:
    """A refused remedy applied at one of its sites alone (one LayerNorm): where the accuracy goes."""

    site: str        # the user's name for it (the module's path in the model), else the graph node's
    sqnr_db: float   # of the build with the remedy at this site only (NaN when that build failed)
    failed: str = ""  # why that build failed
    cycles: int | None = None  # a placement's (an NPU target): the inference's estimated cycles with it there


@dataclass(frozen=True)
class RemedyOutcome:
    remedy: str
    status: RemedyStatus
    reason: str
    measured: Measurement | None = None
    user_change: tuple[str, ...] = ()
    io: ProgramIO | None = None      # int8-io: what the application feeds and reads
    sites: tuple[SiteMeasurement, ...] = ()  # refused or placed, with several sites: each alone


@dataclass
class RemedyReport:
    """What the remedies did to one target, each tried alone against the plain build."""

    artifact: str
    baseline: Measurement
    outcomes: list[RemedyOutcome] = field(default_factory=list)
    final: Measurement | None = None   # every kept remedy together
    io: ProgramIO | None = None        # the final build's integer inputs and outputs (int8-io)
    sqnr_inputs: int = 0               # batches the SQNR was measured on
    max_sqnr_drop_db: float = 1.0
    factory: str = ""                  # `module:function` of a config target
    factory_file: str = ""             # its module's file, for `--write patch:`

    @property
    def kept(self) -> list[RemedyOutcome]:
        return [o for o in self.outcomes if o.status == RemedyStatus.KEPT]

    def to_dict(self) -> dict[str, Any]:
        """JSON has no infinity: equal outputs carry `sqnr_db: null`."""
        data = asdict(self)
        data["io"] = self.io.to_dict() if self.io is not None else None
        for outcome, shown in zip(self.outcomes, data["outcomes"], strict=True):
            shown["io"] = outcome.io.to_dict() if outcome.io is not None else None
        finite: dict[str, Any] = _finite(data)
        return finite


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    stats: list[ArtifactStats] = field(default_factory=list)
    errors: list[InputError] = field(default_factory=list)
    fixes: list[FixSummary] = field(default_factory=list)
    remedies: list[RemedyReport] = field(default_factory=list)
    memory: list[PlanMemory] = field(default_factory=list)   # of the checked .pte files
    figures: list[Figures] = field(default_factory=list)     # measured when budgets or metrics ask
    compared: str | None = None                              # `--compare FILE`: the base run's metrics
    deltas: list[Delta] = field(default_factory=list)        # what changed against it
    checked: int = 0                                # artifacts and targets attempted

    def extend(self, other: Report) -> None:
        self.checked += other.checked
        self.findings.extend(other.findings)
        self.stats.extend(other.stats)
        self.errors.extend(other.errors)
        self.fixes.extend(other.fixes)
        self.remedies.extend(other.remedies)
        self.memory.extend(other.memory)
        self.figures.extend(other.figures)
