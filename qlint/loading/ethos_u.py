"""Quantizing and lowering for a Cortex-M with an Arm Ethos-U NPU, as Arm's own flow does it
(`executorch/backends/arm/scripts/aot_arm_compiler.py --delegate --quantize`): `EthosUQuantizer`
with the symmetric per-channel config, `EthosUPartitioner` over `EthosUCompileSpec`, then the
cortex_m `ReplaceQuantNodesPass` for the quantize and dequantize ops left outside the delegates.

The partitioner's own reporter keeps one reason per rejected node, the first its check chain
returns, and for a float op that is the generic "Not included in BaseTOSASupportList". So while it
partitions, every check of the chain it composes (`tosa_support_factory`: any positive check and
all negative checks) also runs alone on each node, and every reason is kept with the check that
gave it (`Rejection`): the cause a finding states is derived from those.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qlint.io.reads import ReadError, first_line
from qlint.io.vela import NpuBlob, NpuEstimate, read_vela_blob, read_vela_estimate
from qlint.loading import speedups, stack
from qlint.loading.lowering import LoweringError
from qlint.settings.npus import vela_missing

if TYPE_CHECKING:
    from qlint.settings.npus import Npu

# The sentence `tosa_support_factory` wraps around its positive checks: says only that no check
# accepted the node; a finding states it only when no check said more.
GENERIC_REASON = "Not included in BaseTOSASupportList or a registered tosa_support_check"
# How a check that raised on a node is recorded (`_run`): every check runs on every node, also those
# ExecuTorch's chain would have stopped before, so a raise is kept with the reasons but is no cause.
RAISED = "the check raised "
# The check that refuses an op the quantizer did not annotate: quantized, the NPU may run it.
UNQUANTIZED = "CheckArmQuantized"


class NpuSetupError(ReadError):
    """The NPU flow cannot run on this machine (Vela is not installed): one line for the input, exit 2
    (the command line refuses the run before it starts; a program calling the API gets it per input)."""


@dataclass(frozen=True)
class Rejection:
    """One reason ExecuTorch's TOSA support checks give for not delegating a node."""

    check: str        # the check's class: `CheckArmQuantized`, `EthosU55NotSupported`, ...
    positive: bool    # a support list that did not include the node (else a check that rejected it)
    reason: str       # the check's own words


@dataclass(frozen=True)
class Compiled:
    """One NPU partition as ExecuTorch's Arm backend compiled it: the TOSA it lowered the partition to,
    the node each TOSA operator was lowered from (by the tensor the operator writes: the name Vela's
    per-layer estimate gives), Vela's estimate, and the bytes the delegate call holds (what matches
    the two)."""

    tosa: bytes
    writers: dict[str, Any]
    estimate: NpuEstimate
    processed: bytes
    # the nodes a writer's provenance names (`meta["from_node"]`) may be: the partition's nodes before
    # Arm's passes, and every node those passes erased, by name (the first node of a name kept)
    origins: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class OnNpu:
    """A program compiled with one op it left on the CPU quantized onto the NPU instead."""

    partitions: int
    npu_cycles: int   # Vela's, every partition together
    clock_hz: int     # the NPU's clock Vela estimated for


@dataclass(frozen=True)
class Delegation:
    """What the rules know of a program's NPU side: the target, the TOSA specification ExecuTorch's
    support checks ran for, every reason each node left on the CPU was not delegated (by node name:
    the names of the ops left on the CPU survive the lowering; none for a `.pte`, which does not
    record them) and each delegate call's blob (by the call's node name)."""

    npu: str                                       # the accelerator, `ethos-u55-128`
    tosa_spec: str                                 # `TOSA-1.0+INT+int16+int4+u55`; "" when unknown
    rejections: dict[str, tuple[Rejection, ...]]
    blobs: dict[str, NpuBlob]
    ops: dict[str, int]       # the compute ops each delegate call runs (a `.pte`: 1 each, it does not say)
    recorded: bool = True     # a lowering: the partitioner's reasons and the partitions' ops (a `.pte`: neither)
    # each delegate call's TOSA and Vela's estimate (by the call's node name): none for a `.pte`,
    # which holds only the command stream Vela made
    compiled: dict[str, Compiled] = field(default_factory=dict)
    # for an op left in float on the CPU (by its node name), the program compiled the other way, with
    # the op quantized onto the NPU: its partitions and Vela's cycles for them (`with_on_npu`)
    on_npu: dict[str, OnNpu] = field(default_factory=dict)

    @property
    def npu_cycles(self) -> int | None:
        """Vela's cycles for every partition; None when a call was not compiled here (a `.pte`)."""
        if len(self.compiled) != len(self.blobs):
            return None
        return sum(c.estimate.cycles for c in self.compiled.values())

    @property
    def npu_ops(self) -> int:
        return sum(self.ops.values())

    @property
    def counts(self) -> str:
        """What `ops` counts: "ops", the compute ops each partition runs, or "calls", one per delegate
        call (a `.pte`, whose blobs do not say how many ops a partition holds)."""
        return "ops" if self.recorded else "calls"


@dataclass
class NpuLowering:
    """A program lowered for an Ethos-U and what its delegation says."""

    program: Any        # the lowered edge ExportedProgram
    edge: Any           # its EdgeProgramManager (what `to_executorch` serializes)
    delegation: Delegation


def require_vela(npu: Npu) -> None:
    """Raise NpuSetupError unless Vela, which compiles each NPU partition, can be imported."""
    missing = vela_missing(npu)
    if missing is not None:
        raise NpuSetupError(missing)


def compile_spec(npu: Npu) -> Any:
    from executorch.backends.arm.ethosu import EthosUCompileSpec

    return EthosUCompileSpec(npu.accelerator, system_config=npu.system_config, memory_mode=npu.memory_mode)


def quantizer(npu: Npu) -> Any:
    """`EthosUQuantizer` as Arm's flow sets it: symmetric, per-channel weights, for the whole graph."""
    from executorch.backends.arm.quantizer import EthosUQuantizer, get_symmetric_quantization_config

    quantizer = EthosUQuantizer(compile_spec(npu))
    quantizer.set_global(get_symmetric_quantization_config(is_per_channel=True))
    transform = quantizer.transform_for_annotation

    def transform_for_annotation(model: Any) -> Any:
        with _decompositions_keep_provenance(), _lines_carried():
            return transform(model)

    quantizer.transform_for_annotation = transform_for_annotation
    return quantizer


@contextlib.contextmanager
def _decompositions_keep_provenance() -> Iterator[None]:
    """Arm's decompositions before annotation (`GetDecompositionPass`: `matmul` into expand, view,
    `bmm`) trace the op anew with `make_fx`, so the nodes they add have no stack trace and no
    `from_node`: the NPU's MatMul would name no source line. Traced with torch's
    `preserve_node_meta` and the decomposed node as the current node, they carry its stack trace and
    name it in `from_node`, as the nodes a torch decomposition adds do."""
    import executorch.backends.arm._passes.get_decomposition_pass as decomposition
    from torch.fx import traceback as fx_traceback

    input_tensors = decomposition.GetDecompositionPass._get_input_tensors
    make_fx = decomposition.make_fx
    current: list[Any] = []

    def inputs_of(self: Any, node: Any) -> Any:  # called with each node the pass decomposes, before make_fx
        current[:] = [node]
        return input_tensors(self, node)

    def traced_from_current(*args: Any, **kwargs: Any) -> Any:
        trace = make_fx(*args, **kwargs)

        def run(*inputs: Any) -> Any:
            if not current:
                return trace(*inputs)
            with fx_traceback.preserve_node_meta(), fx_traceback.set_current_meta(current[0], "decomposition"):
                return trace(*inputs)
        return run

    decomposition.GetDecompositionPass._get_input_tensors = inputs_of
    decomposition.make_fx = traced_from_current
    try:
        yield
    finally:
        decomposition.GetDecompositionPass._get_input_tensors = input_tensors
        decomposition.make_fx = make_fx


@contextlib.contextmanager
def _lines_carried() -> Iterator[None]:
    """While the quantizer's own passes rewrite the graph before annotating it, a node that takes a
    model node's place (`replace_all_uses_with`) and carries no model provenance of its own (no
    `nn_module_stack`: made by the pass, not traced from the model) gets the stack trace of the node it
    replaces. `DecomposeEmbeddingPass` makes `nn.Embedding`'s `index_select` that way, with its own
    frame for a stack trace: without this, a finding on it names ExecuTorch, not the model's line."""
    from torch.fx import Node

    replace = Node.replace_all_uses_with

    def replaced(self: Node, replace_with: Node, *args: Any, **kwargs: Any) -> Any:
        if isinstance(replace_with, Node) and "nn_module_stack" not in replace_with.meta \
                and self.meta.get("nn_module_stack") and self.meta.get("stack_trace"):
            replace_with.meta["stack_trace"] = self.meta["stack_trace"]
        return replace(self, replace_with, *args, **kwargs)

    Node.replace_all_uses_with = replaced
    try:
        yield
    finally:
        Node.replace_all_uses_with = replace


def lower(program: Any, npu: Npu) -> NpuLowering:
    """Partition and lower a quantized ExportedProgram for `npu` (each partition compiled by Vela),
    then the cortex_m quantize and dequantize kernels for what stays on the CPU. A step that raises
    becomes LoweringError, as a Cortex-M pass that raises does."""
    stack.load()
    require_vela(npu)
    speedups.share_provenance_snapshots()
    from executorch.backends.arm.ethosu import EthosUPartitioner
    from executorch.backends.cortex_m.passes.replace_quant_nodes_pass import ReplaceQuantNodesPass
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    spec = compile_spec(npu)
    partitioner = EthosUPartitioner(spec)
    rejections: dict[str, tuple[Rejection, ...]] = {}
    compiled: list[Compiled] = []
    try:  # Vela prints its summary to stdout, which is the report's
        with _recording(partitioner, rejections), _compiling(compiled), speedups.registering_py_kernels_directly(), \
                contextlib.redirect_stdout(io.StringIO()):
            edge = to_edge_transform_and_lower(program, partitioner=[partitioner],
                                               compile_config=EdgeCompileConfig(_check_ir_validity=False))
    except NpuSetupError:
        raise
    except Exception as exc:  # a partition Vela or the TOSA lowering refuses is a finding, not a crash
        raise LoweringError("EthosUPartitioner", None, exc) from exc
    try:
        edge = edge.transform([ReplaceQuantNodesPass()])
    except Exception as exc:
        raise LoweringError("ReplaceQuantNodesPass", None, exc) from exc
    program = edge.exported_program()
    blobs, ops = delegates(program)
    by_call = _by_call(program, compiled)
    return NpuLowering(program, edge, Delegation(npu.accelerator, str(spec.tosa_spec), rejections, blobs, ops,
                                                 compiled=by_call))


# Compiling a program the other way costs a lowering; past this many ops a program's findings say
# what their ops cost the CPU, not what moving each to the NPU would save.
MOST_MEASURED = 8


def with_on_npu(program: Any, npu: Npu, delegation: Delegation, nodes: dict[str, Any]) -> Delegation:
    """`delegation` with, for each op of `nodes` (the lowered program's node name -> the quantized
    program's node it came from) that was left in float, the program compiled with that op quantized
    onto the NPU: the dequantize before it and the quantize after it carry the qparams an int8 op
    needs, so marking it quantized, as `EthosUQuantizer` marks what it annotates
    (`ArmAnnotationInfo`), is all the quantizer would have done. An op the partitioner still refuses
    that way, or a lowering that fails, is left out: no figure for it."""
    from executorch.backends.arm.common.annotation_meta import ArmAnnotationInfo

    found: dict[str, OnNpu] = {}
    for name, node in list(nodes.items())[:MOST_MEASURED]:
        custom = node.meta.get("custom")
        node.meta["custom"] = {**(custom or {}), ArmAnnotationInfo.CUSTOM_META_KEY: ArmAnnotationInfo(quantized=True)}
        try:
            other = lower(program, npu).delegation
        except LoweringError:
            continue
        finally:
            if custom is None:
                del node.meta["custom"]
            else:
                node.meta["custom"] = custom
        cycles = other.npu_cycles
        if cycles is not None and name not in other.rejections and other.compiled:  # the NPU runs it now
            clock = next(iter(other.compiled.values())).estimate.clock_hz
            found[name] = OnNpu(len(other.blobs), cycles, clock)
    return replace(delegation, on_npu=found)


@contextlib.contextmanager
def _compiling(into: list[Compiled]) -> Iterator[None]:
    """While ExecuTorch's Arm backend compiles each partition, keep its TOSA, the node each TOSA
    operator came from, and Vela's per-layer estimate, which Vela writes only with
    `--verbose-performance` and only into its output folder: each partition gets a folder of its own
    (ExecuTorch's `vela_compile` writes every partition into the same one). The TOSA is what it was:
    the debug hook that names each operator's node is ExecuTorch's JSON mode, which changes nothing
    in the flatbuffer, and with no intermediate path ExecuTorch writes no file of its own. A node
    visitor also emits operators the hook never sees (the RESCALE to int32 in front of an ADD or a
    REDUCE_MAX): every tensor an operator writes while a node is visited is that node's. Arm's passes
    replace nodes, some (a TABLE) with no `from_node`: the nodes they erase are kept by name."""
    import executorch.backends.arm.ethosu.backend as ethosu_backend
    import executorch.backends.arm.tosa.backend as tosa_backend
    import torch
    from executorch.backends.arm.common.arm_compile_spec import ArmCompileSpec

    preprocess = tosa_backend.TOSABackend._preprocess
    hook_class = tosa_backend.DebugHook
    vela_compile = ethosu_backend.vela_compile
    visit = tosa_backend.process_call_function
    erase = torch.fx.Graph.erase_node
    writers: list[dict[str, Any]] = []
    origins: list[dict[str, Any]] = []

    class Writers(hook_class):  # type: ignore[misc,valid-type]
        def __init__(self, mode: Any) -> None:
            super().__init__(mode)
            writers.append({})

        def add(self, node: Any, tosa_op: Any, tosa_op_id: Any) -> None:
            writers[-1][str(tosa_op)] = node  # only the TOSA mode embeds what this returns

    def visited(node: Any, tosa_graph: Any, *args: Any, **kwargs: Any) -> Any:
        block = tosa_graph.currRegion.currBasicBlock
        before = len(block.operators)
        result = visit(node, tosa_graph, *args, **kwargs)
        written = writers[-1] if writers else {}
        for operator in block.operators[before:]:
            written.update((str(name), node) for name in operator.outputs)
        return result

    def erased(graph: Any, node: Any) -> Any:
        if origins:
            origins[-1].setdefault(node.name, node)
        return erase(graph, node)

    def to_tosa(edge_program: Any, tosa_spec: Any) -> Any:
        tosa_spec.tosa_debug_mode = ArmCompileSpec.DebugMode.JSON
        origins.append({node.name: node for node in edge_program.graph.nodes})
        torch.fx.Graph.erase_node = erased
        try:
            return preprocess(edge_program, tosa_spec)
        finally:
            torch.fx.Graph.erase_node = erase

    def compile_estimated(tosa_flatbuffer: bytes, args: list[str], verbose: bool = False,
                          intermediate_path: str | None = None, block_placements: Any = None) -> Any:
        with tempfile.TemporaryDirectory(prefix="qlint-vela-") as folder:
            result = vela_compile(tosa_flatbuffer, [*args, "--verbose-performance"], verbose, folder, block_placements)
            output = Path(folder, "output")
            summary = next(iter(sorted(output.glob("out_summary_*.csv")))).read_text()
            estimate = read_vela_estimate(summary, (output / "out_per-layer.csv").read_text())
        into.append(Compiled(tosa_flatbuffer, writers[-1] if writers else {}, estimate, result.processed_bytes,
                             origins[-1] if origins else {}))
        return result

    tosa_backend.DebugHook = Writers
    tosa_backend.TOSABackend._preprocess = staticmethod(to_tosa)
    ethosu_backend.vela_compile = compile_estimated
    tosa_backend.process_call_function = visited
    try:
        yield
    finally:
        tosa_backend.DebugHook = hook_class
        tosa_backend.TOSABackend._preprocess = staticmethod(preprocess)
        ethosu_backend.vela_compile = vela_compile
        tosa_backend.process_call_function = visit


def _by_call(program: Any, compiled: list[Compiled]) -> dict[str, Compiled]:
    """Each delegate call's compiled partition: the one whose bytes the call holds."""
    from qlint.loading.view import DELEGATE_CALL, base_name, op_name

    found = {}
    for node in program.graph.nodes:
        if node.op == "call_function" and base_name(op_name(node)) == DELEGATE_CALL:
            held = bytes(getattr(program.graph_module, str(node.args[0].target)).processed_bytes)
            match = next((c for c in compiled if c.processed == held), None)
            if match is not None:
                found[node.name] = match
    return found


@contextlib.contextmanager
def _recording(partitioner: Any, into: dict[str, tuple[Rejection, ...]]) -> Iterator[None]:
    """While `partitioner` partitions, record every reason for every node it sees (`_all_reasons`),
    on the program it receives (after ExecuTorch's own transforms), and what its own reporter kept
    (the partition-level refusals: a boundary node, a partition of no-ops), which no single check
    gives. Only inside the block: this partitioner's `partition`, and the reporter class ExecuTorch's
    TOSA partitioner module makes while it partitions."""
    import executorch.backends.arm.tosa.partitioner as tosa_partitioner

    partition = partitioner.partition
    reporter_class = tosa_partitioner.WhyNoPartitionReporter
    kept: list[Any] = []

    class KeptReporter(reporter_class):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            super().__init__()
            kept.append(self)

    def recorded(exported_program: Any) -> Any:
        into.update(_all_reasons(partitioner, exported_program))
        tosa_partitioner.WhyNoPartitionReporter = KeptReporter
        try:
            return partition(exported_program)
        finally:
            tosa_partitioner.WhyNoPartitionReporter = reporter_class
            for reporter in kept:
                for node, reason in reporter._rejected_nodes.items():
                    if node.op != "call_function":
                        continue  # inputs, constants and outputs are never delegated: no finding to explain
                    if not any(r.reason == reason for r in into.get(node.name, ())):
                        into[node.name] = (*into.get(node.name, ()), Rejection("TOSAPartitioner", False, reason))

    partitioner.partition = recorded
    try:
        yield
    finally:
        del partitioner.partition


def _all_reasons(partitioner: Any, exported_program: Any) -> dict[str, tuple[Rejection, ...]]:
    """Every check of the partitioner's support chain run alone on each operator node: the lists
    `tosa_support_factory` composes (ExecuTorch's `_positive_checks`, `_negative_checks`), with the
    extras `TOSAPartitioner._create_operator_support` adds for this partitioner."""
    from executorch.backends.arm.operator_support import tosa_supported_operators as support
    from executorch.backends.arm.tosa.partitioner import DecomposableLargeStrideMaxPool2dForU55Supported
    from executorch.backends.arm.tosa.specification import TosaLoweringContext
    from executorch.exir.backend.utils import WhyNoPartitionReporter
    from torch._export.utils import _get_shape_env_from_gm

    class EveryReason(WhyNoPartitionReporter):
        def __init__(self) -> None:
            super().__init__()
            self.check = ""
            self.given: list[tuple[str, str]] = []

        def report_reject(self, node: Any, reason: str) -> None:
            self.given.append((self.check, reason))

    reporter = EveryReason()
    spec = partitioner.tosa_spec
    extra = list(partitioner.additional_checks or ())
    if partitioner._requires_resolved_tensor_shapes:
        extra.append(support.CheckResolvedTensorShapes(reporter))
    positive = [*support._positive_checks(spec, exported_program, reporter), partitioner._decomposable_resize_support,
                DecomposableLargeStrideMaxPool2dForU55Supported(spec)]
    negative = support._negative_checks(spec, exported_program, reporter, extra)
    module = exported_program.graph_module
    found: dict[str, tuple[Rejection, ...]] = {}
    with TosaLoweringContext(spec, _get_shape_env_from_gm(module)):
        for node in module.graph.nodes:
            if node.op != "call_function":
                continue
            rejections = _positive_verdict(node, positive, reporter) + _negative_verdicts(node, negative, reporter)
            if rejections:
                found[node.name] = rejections
    return found


def _run(check: Any, node: Any, reporter: Any) -> tuple[bool, list[tuple[str, str]]]:
    """One check on one node: whether it accepts it, and the reasons it reported (a check that
    raises refuses, with what it raised)."""
    reporter.check, reporter.given = type(check).__name__, []
    try:
        accepted = bool(check.is_node_supported({}, node))
    except Exception as exc:
        accepted = False
        reporter.given.append((reporter.check, f"{RAISED}{type(exc).__name__}: {first_line(exc)}"))
    return accepted, reporter.given


def _positive_verdict(node: Any, checks: list[Any], reporter: Any) -> tuple[Rejection, ...]:
    """No reason when any support list includes the node; else each list's reason, then the generic one."""
    reasons: list[Rejection] = []
    for check in checks:
        accepted, given = _run(check, node, reporter)
        if accepted:
            return ()
        reasons.extend(Rejection(name, True, reason) for name, reason in given)
    return (*reasons, Rejection("tosa_support_factory", True, GENERIC_REASON))


def _negative_verdicts(node: Any, checks: list[Any], reporter: Any) -> tuple[Rejection, ...]:
    reasons: list[Rejection] = []
    for check in checks:
        accepted, given = _run(check, node, reporter)
        if not accepted:
            reasons.extend(Rejection(name, False, reason) for name, reason in given or [(type(check).__name__, "")])
    return tuple(reasons)


def delegates(program: Any) -> tuple[dict[str, NpuBlob], dict[str, int]]:
    """Each delegate call of a lowered program (by node name): what its Vela blob holds, and how many
    compute ops (not quantize, dequantize or data movement) of the partition it runs."""
    from qlint.loading.view import DELEGATE_CALL, DEQUANTIZE_OPS, QUANTIZE_OPS, SHAPE_OPS, base_name, op_name, packet

    blobs, ops = {}, {}
    for node in program.graph.nodes:
        if node.op == "call_function" and base_name(op_name(node)) == DELEGATE_CALL:
            lowered = lowered_module(program, node)  # a lowering's call always names its module
            blobs[node.name] = read_vela_blob(bytes(lowered.processed_bytes))
            ops[node.name] = sum(
                1 for n in lowered.original_module.graph.nodes
                if n.op == "call_function" and packet(op_name(n)) not in QUANTIZE_OPS | DEQUANTIZE_OPS
                and base_name(op_name(n)) not in SHAPE_OPS | {"getitem"})
    return blobs, ops


def lowered_module(program: Any, call: Any) -> Any:
    """The `LoweredBackendModule` a delegate call runs: the program's attribute its first argument
    names. None when there is none: a `.pte`'s call keeps only the compiled blob."""
    target = getattr(call.args[0], "target", None) if call.args else None
    return getattr(program.graph_module, str(target), None) if target is not None else None
