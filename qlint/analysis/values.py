"""Does the lowering keep the values? The lowered program against the quantized program it came from.

A dtype check cannot see a lowering that computes the wrong integers: ExecuTorch 1.5.1 lowers an
int16 `clamp(-1, 1)` to an `aten.clamp` on the int16 integers with the float model's bounds, so
every output is clamped to [-1, 1] *integers*. Both programs are run on the same inputs, the
lowered one with the Cortex-M reference kernels, and compared wherever the lowered program holds
the integers a quantize of the quantized program writes: a node lowered from the op that quantize
reads (export records the op in `from_node`), or from the op before an activation the lowering
fused into its kernel, read with the same qparams. An op several lowered nodes claim (a
decomposition copies its provenance onto every part) is not compared.

Each compared node is judged alone: the lowered graph is run with every tensor the quantized
program also computes replaced, once computed, by the quantized program's value, so a node sees the
inputs the quantized program gives it and a difference is its own, not one it inherited. The kernels
requantize in fixed point where the quantized program rounds floats, so a node may differ by a
quantization step; it diverges when it differs by more than `DIVERGED_STEPS`. The first such node
in graph order is where the lowering changed the values.

The two programs run in step, node by node, and each value is dropped as soon as neither run needs it
(a node's last user has run, the lowered run has taken the quantized program's value), so the check
holds what is live, never every tensor of both programs; a compared node is judged a slice at a time.
What it holds at once is bounded (`RUN_BUDGET_BYTES`): a node whose recorded output would not fit is
not run, and the check says where it stopped (`Unchecked`), never nothing.

A delegate call (an Ethos-U partition) is computed by the runner the check is given
(`qlint.analysis.tosa`: its TOSA on the reference model) and judged at its outputs as any compared
node; a call the runner cannot compute stops the check, which says so (`NotRun`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import torch
from torch.fx import Interpreter, Node

from qlint.io.limits import RUN_BUDGET_BYTES
from qlint.loading.view import (
    DELEGATE_CALL,
    QUANTIZE_OPS,
    GraphView,
    Kind,
    base_name,
    folded_qparams,
    graph_arguments,
    literal_qparams,
    op_name,
    output_value,
    packet,
    recorded_bytes,
)
from qlint.rules.qparams import QParams

# More quantization steps than fixed-point requantization explains. Measured on every program of the
# test store and ExecuTorch's Cortex-M test models (docs/checks.md, "Values"): where the lowering is
# right a node judged alone differs by at most 1 step; where it is wrong, by 7 to thousands.
DIVERGED_STEPS = 2


@dataclass(frozen=True)
class Divergence:
    """The first node of the lowered program whose integers are not the quantized program's."""

    node: Node          # in the lowered program
    reference: Node     # the quantized program's node it was lowered from
    steps: float        # the largest difference, in quantization steps
    lowered: float      # one value where it is largest, dequantized, in the lowered program ...
    expected: float     # ... and in the quantized program
    batch: int          # which input batch showed it
    differing: int = 0  # how many of its values are more than `tolerance` steps apart ...
    values: int = 0     # ... of how many


@dataclass(frozen=True)
class Unchecked:
    """A run the check could not make within RUN_BUDGET_BYTES: the node it stopped before, in which
    program, and what the run would then have held at once."""

    node: Node          # in the program named by `program`
    program: str        # "lowered" or "quantized"
    held: float         # bytes: what it held, the node's recorded output and the node's comparison
    budget: int         # what it may hold
    check: str          # "values" (against the quantized program) or "run" (whether every op runs)


@dataclass(frozen=True)
class NotRun:
    """A delegate call the check could not compute on the host (`DelegateFailed`): the run stopped there."""

    node: Node          # the call, in the lowered program
    reason: str         # one line


class DelegateFailed(Exception):
    """Raised by a delegate runner that cannot compute the call `node`: `reason` is one line."""

    def __init__(self, node: Node, reason: str) -> None:
        super().__init__(reason)
        self.node, self.reason = node, reason


# Computes a delegate call of the lowered program on the host, from the call node and its arguments.
DelegateRunner = Callable[[Node, Sequence[Any]], tuple[Any, ...]]


class OverBudget(Exception):
    """Raised before a node whose recorded output does not fit beside what the run holds."""

    def __init__(self, unchecked: Unchecked) -> None:
        super().__init__(f"{unchecked.node.name} needs {unchecked.held} bytes")
        self.unchecked = unchecked


def flatten(value: Any) -> list[torch.Tensor]:
    """The tensors of a (nested) value or output, in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in flatten(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in flatten(v)]
    return []


class Held:
    """What the check's runs hold at once: the values the nodes they ran made and have not dropped,
    each storage once (a program's own constants and inputs are there whether it runs or not). A node
    runs only when its recorded output, and the `extra` it needs to be judged, fit beside them."""

    def __init__(self, budget: int, check: str) -> None:
        self.budget, self.check, self.bytes = budget, check, 0
        self._storages: dict[int, list[int]] = {}  # data pointer -> [bytes, values holding it]

    def reserve(self, node: Node, program: str, extra: float = 0.0) -> None:
        need = self.bytes + recorded_bytes(node) + extra
        if need > self.budget:
            raise OverBudget(Unchecked(node, program, need, self.budget, self.check))

    def add(self, value: Any) -> None:
        for tensor in flatten(value):
            storage = tensor.untyped_storage()
            entry = self._storages.setdefault(storage.data_ptr(), [storage.nbytes(), 0])
            if entry[1] == 0:
                self.bytes += entry[0]
            entry[1] += 1

    def drop(self, value: Any) -> None:
        for tensor in flatten(value):
            key = tensor.untyped_storage().data_ptr()
            entry = self._storages.get(key)
            if entry is None:
                continue
            entry[1] -= 1
            if entry[1] == 0:
                self.bytes -= entry[0]
                del self._storages[key]


@dataclass(frozen=True)
class Runnable:
    """A program as the value check runs it: its own graph with its lifted tensors as arguments
    (`graph_arguments`: no unlifting), or, for a signature that does not read so, its unlifted module."""

    graph: Any
    arguments: Callable[[tuple[Any, ...]], list[Any]]

    @classmethod
    def of(cls, program: Any, batch: tuple[Any, ...], module: Callable[[], Any]) -> Runnable:
        if graph_arguments(program, batch) is not None:
            return cls(program.graph_module, lambda given: graph_arguments(program, given) or [])
        return cls(module(), list)


class Stepper(Interpreter):
    """Runs a program one node at a time within `held`'s budget, each value dropped after its last use:
    what the run holds is what is live, never everything it computed."""

    def __init__(self, runnable: Runnable, batch: tuple[Any, ...], held: Held, program: str,
                 delegates: DelegateRunner | None = None) -> None:
        super().__init__(runnable.graph)  # garbage_collect_values: each node's last uses
        self.held, self.program, self.delegates = held, program, delegates
        self.env: dict[Node, Any] = {}
        self.args_iter = iter(self.graph.process_inputs(*runnable.arguments(batch)))
        self._pending = iter(self.graph.nodes)
        self.current: Node | None = None

    def extra(self, node: Node) -> float:
        """What judging `node` allocates beside its output."""
        return 0.0

    def compute(self, node: Node) -> Any:
        """`node`'s value: a delegate call's by `delegates` (an NPU partition's TOSA, on the host)."""
        if self.delegates is not None and base_name(op_name(node)) == DELEGATE_CALL:
            args, _ = self.fetch_args_kwargs_from_env(node)
            return self.delegates(node, args)
        return self.run_node(node)

    def step(self) -> Node | None:
        """Run the next node; None once the graph has run (its output node is not run)."""
        node = next(self._pending, None)
        if node is None or node.op == "output":
            return None
        self.current = node
        computes = node.op == "call_function"
        if computes:
            self.held.reserve(node, self.program, self.extra(node))
        value = self.env[node] = self.compute(node)
        if computes:
            self.held.add(value)
        for dead in self.user_to_last_uses.get(node, []):
            gone = self.env.pop(dead, None)
            if dead.op == "call_function":
                self.held.drop(gone)
        return node

    def run_all(self) -> None:
        while self.step() is not None:
            pass


def read_as(view: GraphView, node: Node) -> QParams | None:
    """How `node`'s integers read: as the dequantize that reads them does (a pass that decomposes an
    op may leave the op's qparams on a part of it), a quantize's own, or those folded into it."""
    for qp in [view.qparams(u) for u in node.users if view.kind(u) == Kind.DEQUANTIZE]:
        if qp is not None:
            return qp
    return view.qparams(node) if view.kind(node) == Kind.QUANTIZE else folded_qparams(node)


def _twins(view: GraphView) -> dict[Node, str]:
    """Lowered nodes and the one node of the quantized program each was lowered from. A node
    several lowered nodes claim (a pass that decomposed it copied its provenance onto each part)
    stands for none of them."""
    claimed: dict[str, list[Node]] = {}
    for node in view.nodes:
        if node.op == "call_function" and isinstance(output_value(node), torch.Tensor) \
                and view.source_name(node) is not None:
            claimed.setdefault(view.as_quantized(node).name, []).append(node)
    return {nodes[0]: name for name, nodes in claimed.items() if len(nodes) == 1}


# Activations a Cortex-M pass fuses into the kernel before them: the kernel then holds their output.
FUSED_ACTIVATIONS = frozenset({"relu", "relu_", "relu6", "hardtanh", "hardtanh_", "clamp", "clamp_min"})


def _quantize_of(node: Node) -> Node | None:
    """The per-tensor quantize whose integers a lowered node made from `node` holds, in the quantized
    program: `node` itself when it is one, the quantize that reads it, or the one after an activation
    that reads it alone (the lowering fuses it into the kernel). The qparams the lowered node reads
    with must be that quantize's, or the node is not compared (`compared`)."""
    if node.op != "call_function":
        return None
    if packet(op_name(node)) in QUANTIZE_OPS:
        return node
    quantize = next((u for u in node.users if u.op == "call_function" and packet(op_name(u)) in QUANTIZE_OPS
                     and "per_tensor" in op_name(u)), None)
    if quantize is None and len(node.users) == 1:
        [user] = node.users
        if user.op == "call_function" and base_name(op_name(user)) in FUSED_ACTIVATIONS:
            return _quantize_of(user)
    return quantize


def compared(view: GraphView, twins: dict[Node, str]) -> list[tuple[Node, str, QParams]]:
    """The lowered program's nodes whose integers are those of a quantize of the quantized program:
    (node, that quantize's name, its qparams), in graph order. A node is compared only when it reads
    its integers as that quantize writes them."""
    pairs = []
    for node in twins:
        value = output_value(node)
        if not isinstance(value, torch.Tensor) or value.is_floating_point():
            continue
        quantize = _quantize_of(view.as_quantized(node))
        written = literal_qparams(quantize) if quantize is not None else None
        read = read_as(view, node)
        if quantize is None or written is None or read is None:
            continue
        if same_reading(read, written):
            pairs.append((node, quantize.name, written))
    return pairs


def same_reading(one: QParams, other: QParams) -> bool:
    """Whether integers read with `one` mean what they mean read with `other` (a scale a float round trip apart)."""
    return (one.zero_point, one.qmin, one.qmax) == (other.zero_point, other.qmin, other.qmax) \
        and math.isclose(one.scale, other.scale, rel_tol=1e-6)


# Elements a comparison works on at once, so that judging a node of any size allocates a slice's worth
# beside its output: the slice in float64 (lowered, expected, their difference) and its mask.
SLICE = 1 << 18
COMPARE_BYTES = SLICE * (3 * 8 + 1)


def _parts(*tensors: torch.Tensor) -> Iterator[list[torch.Tensor]]:
    """The same slices of tensors of one shape, as views: runs along the largest dimension of at most
    SLICE elements (one index of it, when the other dimensions hold more)."""
    shape = tensors[0].shape
    if len(shape) == 0:
        yield [t.reshape(1) for t in tensors]
        return
    total = math.prod(shape)
    if total == 0:
        return
    dim = max(range(len(shape)), key=lambda d: shape[d])
    step = max(1, SLICE // (total // shape[dim]))
    for start in range(0, shape[dim], step):
        yield [t.narrow(dim, start, min(step, shape[dim] - start)) for t in tensors]


def _integers(value: torch.Tensor, qparams: QParams, dtype: torch.dtype) -> torch.Tensor:
    """The reference's value as the lowered program holds it: its integers, in `dtype`."""
    if not value.is_floating_point():
        return value.to(dtype)
    return torch.clamp(torch.round(value / qparams.scale) + qparams.zero_point, qparams.qmin, qparams.qmax).to(dtype)


def _as_read(value: torch.Tensor, qparams: QParams, dtype: torch.dtype) -> torch.Tensor:
    """`_integers` of the whole value, made a slice at a time."""
    if not value.is_floating_point():
        return value.to(dtype)
    read = torch.empty_like(value, dtype=dtype)
    for source, target in _parts(value, read):
        target.copy_(_integers(source, qparams, dtype))
    return read


def _finite_where_not(value: torch.Tensor) -> torch.Tensor | None:
    """Where a float value is finite, when somewhere it is not (None: it is everywhere, the usual case,
    decided a slice at a time)."""
    if all(math.isfinite(float(low)) and math.isfinite(float(high))  # NaN and inf reach the extremes
           for low, high in (torch.aminmax(part) for [part] in _parts(value) if part.numel())):
        return None
    return torch.isfinite(value)


@dataclass(frozen=True)
class _Worst:
    """The largest difference of a compared node, in quantization steps, and both values there, dequantized."""

    steps: float = 0.0
    lowered: float = 0.0
    expected: float = 0.0
    over: int = 0        # values more than the tolerance apart
    values: int = 0      # values compared


def _worst(got: torch.Tensor, want: torch.Tensor, qparams: QParams, finite: torch.Tensor | None,
           tolerance: float = DIVERGED_STEPS) -> _Worst:
    """|lowered - reference| in quantization steps, the reference quantized as the lowering reads it,
    compared a slice at a time, and how many values differ by more than `tolerance`; elements where
    `finite` is False are not compared."""
    worst, over, values = _Worst(), 0, 0
    for parts in _parts(got, want, *([finite] if finite is not None else [])):
        steps = (parts[0].double() - _integers(parts[1], qparams, torch.float64)).abs()
        if finite is not None:
            steps = torch.where(parts[2], steps, 0.0)
        over += int((steps > tolerance).sum())
        values += steps.numel()
        at = int(steps.argmax())
        largest = float(steps.reshape(-1)[at])
        if largest > worst.steps:
            lowered, expected = float(parts[0].reshape(-1)[at]), float(parts[1].reshape(-1)[at])
            if not parts[1].is_floating_point():
                expected = (expected - qparams.zero_point) * qparams.scale
            worst = _Worst(largest, (lowered - qparams.zero_point) * qparams.scale, expected)
    return replace(worst, over=over, values=values)


def _float_twins(twins: dict[Node, str]) -> dict[Node, str]:
    """Lowered float nodes and the quantized program's nodes they were lowered from (an fp32 island's ops)."""
    return {node: name for node, name in twins.items()
            if cast(torch.Tensor, output_value(node)).is_floating_point()}


class _Reference(Stepper):
    """The quantized program, run only as far as the lowered run has asked: each value it will ask for is
    kept until its last ask (`wanted`: how many), every other one dropped after its last use; of the
    values the compared quantizes read (`reads`), only where they are not finite."""

    def __init__(self, runnable: Runnable, batch: tuple[Any, ...], held: Held, wanted: Counter[str],
                 reads: set[str]) -> None:
        super().__init__(runnable, batch, held, "quantized")
        self.wanted, self.reads = wanted, reads
        self.kept: dict[str, Any] = {}
        self.finite: dict[str, torch.Tensor] = {}
        self.ran: set[str] = set()
        self.finished = False

    def compute(self, node: Node) -> Any:
        value = super().compute(node)
        self.ran.add(node.name)
        if self.wanted[node.name] > 0:
            self.kept[node.name] = value
            self.held.add(value)
        if node.name in self.reads and isinstance(value, torch.Tensor) and value.is_floating_point():
            mask = _finite_where_not(value)
            if mask is not None:
                self.finite[node.name] = mask
                self.held.add(mask)
        return value

    def take(self, name: str) -> Any:
        """The quantized program's value of node `name` (None when it has none), run up to it."""
        while name not in self.ran and not self.finished:
            self.finished = self.step() is None
        value = self.kept.get(name)
        self.wanted[name] -= 1
        if self.wanted[name] <= 0 and name in self.kept:
            self.held.drop(self.kept.pop(name))
        return value


class _Forced(Stepper):
    """Runs the lowered graph with every tensor the quantized program also computes replaced by the
    quantized program's value: each node then sees the inputs the quantized program gives it, so a
    difference is that node's own, not one it inherited (teacher forcing). A float node the quantized
    program computes is not run at all; a compared node is run and judged, and the first that diverges
    is `found`."""

    def __init__(self, pairs: list[tuple[Node, str, QParams]], floats: dict[str, str], reads: dict[str, str],
                 runnable: Runnable, batch: tuple[Any, ...], held: Held, reference: _Reference,
                 delegates: DelegateRunner | None = None, tolerance: float = DIVERGED_STEPS) -> None:
        super().__init__(runnable, batch, held, "lowered", delegates)
        self.pairs = {node.name: (name, qparams) for node, name, qparams in pairs}
        self.floats, self.reads, self.reference = floats, reads, reference
        self.tolerance = tolerance
        self.found: tuple[str, _Worst] | None = None

    def extra(self, node: Node) -> float:
        """A compared node's forced value and its comparison's slices."""
        return recorded_bytes(node) + COMPARE_BYTES if node.name in self.pairs else 0.0

    def compute(self, node: Node) -> Any:
        if node.name in self.floats:
            want, recorded = self.reference.take(self.floats[node.name]), output_value(node)
            if isinstance(want, torch.Tensor) and isinstance(recorded, torch.Tensor) \
                    and want.shape == recorded.shape and want.dtype == recorded.dtype:
                return want
        got = super().compute(node)
        if node.name not in self.pairs:
            return got
        name, qparams = self.pairs[node.name]
        want = self.reference.take(name)
        if not isinstance(got, torch.Tensor) or not isinstance(want, torch.Tensor) or want.shape != got.shape:
            return got
        # Where what the quantize reads is not finite (a division by zero) the quantized program saturates
        # and a kernel may give any value: those elements are not compared.
        finite = self.reference.finite.get(self.reads.get(name, ""))
        worst = _worst(got, want, qparams, finite if finite is not None and finite.shape == got.shape else None,
                       self.tolerance)
        if worst.steps > self.tolerance and self.found is None:
            self.found = (node.name, worst)
        return _as_read(want, qparams, got.dtype)


def device_outputs(view: GraphView, batches: Sequence[tuple[Any, ...]],
                   delegates: DelegateRunner) -> list[list[torch.Tensor]]:
    """The lowered program's outputs on each batch as its device computes them: each delegate call by
    `delegates` (an NPU partition's TOSA on the reference model), the CPU's ops by their kernels, every
    value the program's own (nothing forced). What an NPU fold must leave unchanged, bit for bit.
    Raises OverBudget when a run would hold more than RUN_BUDGET_BYTES, and what `delegates` raises."""
    runnable = Runnable.of(view.program, batches[0], lambda: view.module)
    output = runnable.graph.graph.output_node()  # the graph the run steps through: the program's, or its module's
    found = []
    for batch in batches:
        with torch.no_grad():
            run = Stepper(runnable, batch, held("values"), "lowered", delegates)
            run.run_all()
            found.append(flatten(run.fetch_args_kwargs_from_env(output)[0][0]))
    return found


def held(check: str) -> Held:
    """What one run of the check (`Unchecked.check`) may hold: RUN_BUDGET_BYTES."""
    return Held(RUN_BUDGET_BYTES, check)


def by_name(nodes: Iterable[Node], node: Node) -> Node:
    """`node` as the program's own graph names it (a run of the unlifted module has its own nodes)."""
    return next((n for n in nodes if n.name == node.name), node)


def uncompared_calls(view: GraphView) -> list[Node]:
    """The delegate calls none of whose outputs is paired with a quantize of the quantized program
    (`compared`): a run would compute them and compare nothing, so a check that passed would not have
    checked them."""
    pairs = {node for node, _, _ in compared(view, _twins(view))}
    calls = [n for n in view.nodes if view.kind(n) == Kind.DELEGATE]
    return [c for c in calls if c not in pairs and not any(user in pairs for user in c.users)]


def first_divergence(view: GraphView, batches: Sequence[tuple[Any, ...]], delegates: DelegateRunner | None = None,
                     tolerance: float = DIVERGED_STEPS) -> Divergence | Unchecked | NotRun | None:
    """The first compared node of a lowered program that, given the inputs the quantized program it was
    lowered from (`view.quantized`) gives it, computes integers more than `tolerance` steps from that
    program's on any batch; None when all agree or when either program cannot run on the batches
    (QL007's other checks say why); Unchecked when the runs would hold more than RUN_BUDGET_BYTES at once.
    `delegates` computes each delegate call (an NPU partition) on the host; NotRun when it cannot.

    The two programs run in step, node by node, each value dropped once nothing needs it: they hold
    what is live in both and the quantized program's values the lowered run has yet to ask for."""
    if view.quantized is None or not batches:
        return None
    twins = _twins(view)
    pairs = compared(view, twins)
    if not pairs:
        return None
    quantized = view.quantized
    quantizes = {n.name: n for n in quantized.graph.nodes}
    reads = {name: quantizes[name].args[0].name for _, name, _ in pairs
             if name in quantizes and isinstance(quantizes[name].args[0], Node)}
    floats = {node.name: name for node, name in _float_twins(twins).items()}
    wanted = Counter([name for _, name, _ in pairs] + list(floats.values()))
    reference = Runnable.of(quantized, batches[0], quantized.module)
    lowered = Runnable.of(view.program, batches[0], lambda: view.module)
    for index, batch in enumerate(batches):
        budget = held("values")
        try:
            with torch.no_grad():
                run = _Reference(reference, batch, budget, Counter(wanted), set(reads.values()))
                forced = _Forced(pairs, floats, reads, lowered, batch, budget, run, delegates, tolerance)
                while forced.found is None and forced.step() is not None:
                    pass
        except OverBudget as over:
            stopped = over.unchecked
            graph = view.nodes if stopped.program == "lowered" else quantized.graph.nodes
            return replace(stopped, node=by_name(graph, stopped.node))
        except DelegateFailed as failed:
            return NotRun(by_name(view.nodes, failed.node), failed.reason)
        except Exception:  # noqa: BLE001 - a program that cannot run is the run check's finding
            return None
        if forced.found is not None:
            name, worst = forced.found
            node = next(n for n in view.nodes if n.name == name)
            return Divergence(node, view.as_quantized(node), worst.steps, worst.lowered, worst.expected, index,
                              worst.over, worst.values)
    return None
