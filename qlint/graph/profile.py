"""Read an ETDump, ExecuTorch's on-device profile, and put its measured cycles on a program's ops.

ExecuTorch's runtime (`runtime/executor/method.cpp`) opens one event block named "Execute" a
`Method::execute` call and records, for every instruction of the plan, a profile event named for
the instruction's kind (`OPERATOR_CALL` for a kernel call, `MOVE_CALL`, `FREE_CALL`) with the chain
and instruction index it ran, stamped by the platform's `et_pal_current_ticks()` (a cycle counter on a
Cortex-M port that counts cycles, which is how qlint reads them). So an
event maps to exactly one instruction of the `.pte` the profile was recorded from, and a profile
of another program shows as an event on an instruction the plan does not have or has of another
kind, or a kernel call without its event: each refused in one line (`ProfileMismatch`), never a
partial mapping.

The file is untrusted. Before ExecuTorch's own decoder (its bundled `flatc` and `etdump`
dataclasses) expands it to JSON, the tables it would visit are counted (`limits.profile_entries`):
a flatbuffer may point at one table from every slot of a vector, so a small file can decode to
gigabytes.
"""

from __future__ import annotations

import os
import statistics
import struct
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from torch.fx import Node

from qlint.graph.cost import OpCost, ProgramCost
from qlint.graph.view import GraphView, base_name, op_name
from qlint.io.limits import Limits
from qlint.io.reads import ReadError, first_line

# The event each instruction kind records (`Method::execute_instruction`): what the plan must hold there.
INSTRUCTION_EVENTS = {"OPERATOR_CALL": "KernelCall", "MOVE_CALL": "MoveCall", "FREE_CALL": "FreeCall"}
# The DWT/PMU cycle counter a Cortex-M runner reads is 32 bits wide: an event that spans its wrap
# ends at a smaller count than it started.
COUNTER_WRAP = 1 << 32
FLATC_SECONDS = 120  # decoding a file that passed the entry count takes well under a second


class ProfileError(ReadError):
    """A profile that cannot be read."""


class ProfileMismatch(ProfileError):
    """A profile that does not belong to the program it was given with."""


@dataclass(frozen=True)
class Profile:
    """Measured cycles of each instruction: the median over the runs (the lower middle value of an
    even count, so every figure is one the device recorded)."""

    runs: int
    kinds: dict[int, str]     # instruction index -> the event recorded there
    cycles: dict[int, int]    # instruction index -> median cycles


def read_profile(data: bytes, limits: Limits) -> Profile:
    """The profile in the bytes of an ETDump, or a ReadError saying why not."""
    _count_entries(data, limits)
    runs = [_run(index, events) for index, events in enumerate(_decode(data), start=1)]
    runs = [r for r in runs if r]  # blocks without instruction events: loading, init
    if not runs:
        raise ProfileError("no instruction events (OPERATOR_CALL): record it with the runner's event tracer on")
    first = runs[0]
    for number, run in enumerate(runs[1:], start=2):
        if run.keys() != first.keys():
            raise ProfileMismatch(f"run {number} records {len(run)} instructions, run 1 {len(first)}: "
                                  "the runs are not of one program")
    kinds = {i: name for i, (name, _) in first.items()}
    for number, run in enumerate(runs[1:], start=2):
        for i, (name, _) in run.items():
            if name != kinds[i]:
                raise ProfileMismatch(f"run {number} records {name} at instruction {i}, run 1 {kinds[i]}")
    cycles = {i: int(statistics.median_low(run[i][1] for run in runs)) for i in sorted(first)}
    return Profile(len(runs), kinds, cycles)


def _run(number: int, events: Iterable[object]) -> dict[int, tuple[str, int]]:
    """One event block's instruction events: index -> (event name, cycles)."""
    found: dict[int, tuple[str, int]] = {}
    for event in events:
        profiled = getattr(event, "profile_event", None)
        if profiled is None or profiled.chain_index == -1:  # Method::execute, Method::init: not an instruction
            continue
        name = profiled.name or ""
        if profiled.chain_index != 0:
            raise ProfileMismatch(f"run {number} has an event on chain {profiled.chain_index}; "
                                  "the program has one chain")
        if name not in INSTRUCTION_EVENTS:
            raise ProfileMismatch(f"run {number} records {name[:60]!r} at instruction {profiled.instruction_id}; "
                                  f"the program's instructions record {', '.join(INSTRUCTION_EVENTS)}")
        index = int(profiled.instruction_id)
        if index < 0:
            raise ProfileMismatch(f"run {number} records {name} at instruction {index}, which is no instruction")
        if index in found:
            raise ProfileMismatch(f"run {number} records instruction {index} twice")
        found[index] = (name, _elapsed(int(profiled.start_time), int(profiled.end_time)))
    return found


def _elapsed(start: int, end: int) -> int:
    if end >= start:
        return end - start
    if start >= COUNTER_WRAP:
        raise ProfileError(f"an event ends ({end}) before it starts ({start}) and is not a 32-bit counter's wrap")
    return end + COUNTER_WRAP - start


def measured_cost(view: GraphView, steps: list[str], profile: Profile, plan: str,
                  estimate: ProgramCost) -> ProgramCost:
    """The program's cost as `profile` measured it: each kernel call's median cycles on its node.

    `steps` are the plan's instructions in order (an operator name for a kernel call, else the
    instruction's kind), as the `.pte` reader read them; `plan` the plan's name (its node ids).
    """
    for index, name in sorted(profile.kinds.items()):
        if index >= len(steps):
            raise ProfileMismatch(f"instruction {index} is past the program's {len(steps)} instructions")
        kind = steps[index] if steps[index] in ("MoveCall", "FreeCall") else "KernelCall"
        if INSTRUCTION_EVENTS[name] != kind:
            what = steps[index] if kind == "KernelCall" else f"a {kind}"
            raise ProfileMismatch(f"instruction {index} is {what} in the program; the profile records {name} there")
    nodes = _instruction_nodes(view, plan)
    for index, step in enumerate(steps):
        if step not in ("MoveCall", "FreeCall") and index not in profile.kinds:
            raise ProfileMismatch(f"instruction {index} ({step}) has no OPERATOR_CALL event: "
                                  "the profile is not of this program, or the runner's event buffer was full")
    return _priced(estimate, profile, {node: [index] for index, node in nodes.items()}, [])


def _priced(estimate: ProgramCost, profile: Profile, instructions: dict[Node, list[int]],
            unplaced: list[int]) -> ProgramCost:
    """The measured cost: each node's instructions' cycles on its op (the estimate's work and fp32
    flag kept), and the instructions no node carries on ops of their own."""
    estimated = {o.node: o for o in estimate.ops}
    cost = ProgramCost(estimate.core, runs=profile.runs)
    for node, indices in instructions.items():
        before = estimated.get(node.name) or _unpriced(node)
        cost.ops.append(replace(before, cycles=float(sum(profile.cycles[i] for i in indices))))
    for index in unplaced:
        cost.ops.append(OpCost(f"instruction {index}", UNPLACED, 0, "element", float(profile.cycles[index]), False))
    return cost


# What an instruction the ETRecord maps to no node is: ExecuTorch's passes after the lowering qlint
# checks add a few (a transpose `to_executorch` inserts), and the device runs them all the same.
UNPLACED = "an instruction of no node of the checked program"


@dataclass(frozen=True)
class Record:
    """What an ETRecord says of its program: each instruction's debug handles (`debug_handle_map`),
    and the operators the nodes of each debug handle call (its edge program's graph)."""

    handles: dict[int, tuple[int, ...]]
    ops: dict[int, frozenset[str]]


def read_etrecord(data: bytes, limits: Limits) -> Record:
    """The ETRecord `generate_etrecord` wrote (a zip): only its JSON is read, never its pickles or tensors."""
    import json

    from qlint.io.archive import read_zip

    try:
        entries = read_zip(data, limits)
    except ReadError as exc:
        raise ProfileError(f"not an ETRecord: {exc}") from None
    if "ETRECORD_V0" not in entries or "debug_handle_map" not in entries:
        raise ProfileError("not an ETRecord: no ETRECORD_V0 entry and debug_handle_map")
    try:
        mapped = json.loads(entries["debug_handle_map"]).get("forward")
        graph = json.loads(entries.get("edge_dialect_exported_program/forward", b"{}"))
    except (ValueError, RecursionError, AttributeError):
        raise ProfileError("not a valid ETRecord: its debug_handle_map or edge program is not JSON") from None
    if not isinstance(mapped, dict):
        raise ProfileError("not a valid ETRecord: debug_handle_map has no `forward` method")
    handles = {}
    for key, value in mapped.items():
        listed = value if isinstance(value, list) else [value]
        if not key.isdigit() or not listed or not all(type(h) is int and h >= 0 for h in listed):
            raise ProfileError(f"not a valid ETRecord: debug_handle_map entry {key[:20]!r} is not "
                               "an instruction's debug handles")
        handles[int(key)] = tuple(listed)
    return Record(handles, _handle_ops(graph))


def _handle_ops(graph: object) -> dict[int, frozenset[str]]:
    """The base names of the operators each debug handle's nodes call, from the edge program's JSON
    (any part of it that is not the shape torch's serializer writes is read as absent)."""
    found: dict[int, set[str]] = {}
    for node in _listed(graph, "graph_module", "graph", "nodes"):
        handle, target = _mapping(_mapping(node).get("metadata")).get("debug_handle"), _mapping(node).get("target")
        if isinstance(handle, str) and handle.isdigit() and isinstance(target, str):
            found.setdefault(int(handle), set()).add(base_name(target.removeprefix(EDGE_OPS)))
    return {h: frozenset(ops) for h, ops in found.items()}


# How the edge program's JSON names an operator: `executorch.exir.dialects.edge.ops.cortex_m.softmax.default`.
EDGE_OPS = "executorch.exir.dialects.edge.ops."


def _mapping(value: object) -> dict[str, object]:
    return value if isinstance(value, dict) else {}


def _listed(value: object, *keys: str) -> list[object]:
    for key in keys:
        value = _mapping(value).get(key)
    return value if isinstance(value, list) else []


def measured_through(profile: Profile, record: Record, view: GraphView, estimate: ProgramCost) -> ProgramCost:
    """The cost a profile of the `.pte` `--fix` wrote from this program measured, through that fix's
    ETRecord: an instruction's debug handles name the nodes of this program's lowering it came from.

    The profile is of the fixed program: an island the fix folded has no instruction, so it measured
    nothing. An instruction's cycles go to the nodes of its first debug handle, the k-th instruction
    of a handle to its k-th node in graph order (the emitter writes them in that order).
    """
    by_handle: dict[int, list[Node]] = {}
    for node in view.nodes:
        handle = node.meta.get("debug_handle")
        if node.op == "call_function" and type(handle) is int and op_name(node) != "getitem":
            by_handle.setdefault(handle, []).append(node)
    for index in sorted(record.handles):
        if index not in profile.kinds:
            raise ProfileMismatch(f"instruction {index} of the ETRecord has no event in the profile")
    instructions: dict[Node, list[int]] = {}
    unplaced, seen = [], dict.fromkeys(by_handle, 0)
    for index, kind in sorted(profile.kinds.items()):
        if kind != "OPERATOR_CALL":
            continue
        handles = record.handles.get(index)
        if not handles:
            unplaced.append(index)
            continue
        for handle in handles:
            _same_ops(view, handle, by_handle.get(handle), record.ops.get(handle))
        nodes = by_handle[handles[0]]
        node = nodes[min(seen[handles[0]], len(nodes) - 1)]
        seen[handles[0]] += 1
        instructions.setdefault(node, []).append(index)
    return _priced(estimate, profile, instructions, unplaced)


def _same_ops(view: GraphView, handle: int, nodes: list[Node] | None, recorded: frozenset[str] | None) -> None:
    if not nodes:
        raise ProfileMismatch(f"debug handle {handle} of the ETRecord is no node of this program's lowering")
    here = {base_name(op_name(n)) for n in nodes}
    if recorded and not recorded <= here:
        raise ProfileMismatch(f"debug handle {handle} calls {', '.join(sorted(recorded))} in the ETRecord, "
                              f"{', '.join(sorted(here))} in this program's lowering")


def _instruction_nodes(view: GraphView, plan: str) -> dict[int, Node]:
    """Each kernel call's node by its instruction index (the `.pte` reader's `instruction_id`)."""
    prefix = f"{plan}_0_"
    found = {}
    for node in view.nodes:
        ident = node.meta.get("instruction_id")
        if node.op == "call_function" and op_name(node) != "getitem" and ident and ident.startswith(prefix):
            found[int(ident[len(prefix):])] = node
    return found


def _unpriced(node: Node) -> OpCost:
    """A kernel call the estimate prices at nothing (an alias, work the model skips): the device ran it."""
    return OpCost(node.name, op_name(node), 0, "element", 0.0, False)


# The decoder: ExecuTorch's schema and flatc, bounded first.

def _decode(data: bytes) -> list[list[object]]:
    """Each run's events, decoded by ExecuTorch's own schema, flatc and dataclasses."""
    import importlib.resources

    import executorch.devtools.etdump as package
    from executorch.devtools.etdump.serialize import _deserialize_from_json_to_etdump_flatcc
    from executorch.exir._serialize._flatbuffer import _get_flatc_path

    with tempfile.TemporaryDirectory() as folder:
        for schema in ("etdump_schema_flatcc.fbs", "scalar_type.fbs"):
            (Path(folder) / schema).write_bytes((importlib.resources.files(package) / schema).read_bytes())
        (Path(folder) / "profile.etdp").write_bytes(data)
        try:
            done = subprocess.run(
                [_get_flatc_path(), "--json", "--strict-json", "--defaults-json", "--size-prefixed", "-o", folder,
                 os.path.join(folder, "etdump_schema_flatcc.fbs"), "--", os.path.join(folder, "profile.etdp")],
                capture_output=True, timeout=FLATC_SECONDS, check=False)
        except subprocess.TimeoutExpired:
            raise ProfileError(f"not a valid ETDump: decoding took over {FLATC_SECONDS} s") from None
        decoded = Path(folder) / "profile.json"
        if done.returncode != 0 or not decoded.exists():
            said = done.stderr.decode(errors="replace").strip().splitlines()
            why = said[-1].strip()[:200] if said else "flatc could not decode it"
            raise ProfileError(f"not a valid ETDump: {why}")
        try:
            etdump = _deserialize_from_json_to_etdump_flatcc(decoded.read_bytes())
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ProfileError(f"not a valid ETDump: {type(exc).__name__}: {first_line(exc)[:200]}") from None
    return [list(run.events or []) for run in etdump.run_data or []]


class _Entries:
    """What decoding may visit: tables and vector items one by one, as flatc writes each of them."""

    def __init__(self, data: bytes, limits: Limits) -> None:
        self.data, self.limit, self.count = data, int(limits.profile_entries), 0
        self.text_limit, self.text = limits.file_bytes, 0

    def string(self, table: int | None, slot: int) -> None:
        """A string field: decoded once per reference, so its bytes count each time (`file_mb`)."""
        at = None if table is None else self.field(table, slot)
        if at is not None:
            self.text += self.u32(at + self.u32(at))
            if self.text > self.text_limit:
                raise ProfileError(f"its strings decode to over {self.text_limit} bytes "
                                   "(limits.file_mb in .qlint.yaml)")

    def visit(self, count: int = 1) -> None:
        self.count += count
        if self.count > self.limit:
            raise ProfileError(f"holds over {self.limit} events, tables and values "
                            "(limits.profile_entries in .qlint.yaml)")

    def u32(self, at: int) -> int:
        if not 0 <= at <= len(self.data) - 4:
            raise ProfileError("not a valid ETDump: an offset points outside the file")
        return int(struct.unpack_from("<I", self.data, at)[0])

    def field(self, table: int, slot: int) -> int | None:
        """Where field `slot` of the table at `table` is, None when absent."""
        vtable = table - struct.unpack_from("<i", self.data, table)[0] if 0 <= table <= len(self.data) - 4 else -1
        if not 0 <= vtable <= len(self.data) - 4:
            raise ProfileError("not a valid ETDump: a table's vtable is outside the file")
        size = struct.unpack_from("<H", self.data, vtable)[0]
        if 4 + 2 * slot + 2 > size or vtable + 4 + 2 * slot + 2 > len(self.data):
            return None
        offset = struct.unpack_from("<H", self.data, vtable + 4 + 2 * slot)[0]
        return table + offset if offset else None

    def table(self, table: int, slot: int) -> int | None:
        at = self.field(table, slot)
        return None if at is None else at + self.u32(at)

    def vector(self, table: int, slot: int) -> tuple[int, int]:
        """(first item, length) of a vector field; (0, 0) when absent."""
        at = self.field(table, slot)
        if at is None:
            return 0, 0
        start = at + self.u32(at)
        length = self.u32(start)
        self.visit(length)
        if length > len(self.data):  # no item is under a byte: a length past the file is a lie
            raise ProfileError("not a valid ETDump: a vector is longer than the file")
        return start + 4, length

    def tables(self, table: int, slot: int) -> Iterable[int]:
        first, length = self.vector(table, slot)
        for i in range(length):
            at = first + 4 * i
            yield at + self.u32(at)


# Table slots (field ids) of `etdump_schema_flatcc.fbs` that hold tables or vectors.
_RUN_DATA, _ALLOCATORS, _EVENTS = 1, 2, 3
_PROFILE, _DEBUG = 0, 2
_DEBUG_ENTRY, _TENSOR, _TENSOR_LIST, _SIZES, _STRIDES, _TENSORS = 2, 1, 2, 1, 2, 0


def _count_entries(data: bytes, limits: Limits) -> None:
    """Refuse, before decoding, a file that is no size-prefixed ETDump or decodes to more than the limit."""
    if len(data) < 12 or data[8:12] != b"ED00":
        raise ProfileError("not an ETDump: no size-prefixed ETDump file identifier (ED00)")
    if struct.unpack_from("<I", data, 0)[0] != len(data) - 4:
        raise ProfileError("not a valid ETDump: its size prefix is not its length (a truncated file?)")
    entries = _Entries(data[4:], limits)
    root = entries.u32(0)
    for run in entries.tables(root, _RUN_DATA):
        entries.string(run, 0)
        for allocator in entries.tables(run, _ALLOCATORS):
            entries.string(allocator, 0)
        for event in entries.tables(run, _EVENTS):
            profiled, debug = entries.table(event, _PROFILE), entries.table(event, _DEBUG)
            if profiled is not None:
                entries.string(profiled, 0)
                entries.string(profiled, 4)
                entries.vector(profiled, 5)  # delegate_debug_metadata
            if debug is not None:
                entries.string(debug, 4)
                entries.string(debug, 5)
                value = entries.table(debug, _DEBUG_ENTRY)
                if value is not None:
                    _count_value(entries, value)


def _count_value(entries: _Entries, value: int) -> None:
    tensor = entries.table(value, _TENSOR)
    if tensor is not None:
        entries.vector(tensor, _SIZES)
        entries.vector(tensor, _STRIDES)
    listed = entries.table(value, _TENSOR_LIST)
    if listed is not None:
        for item in entries.tables(listed, _TENSORS):
            entries.vector(item, _SIZES)
            entries.vector(item, _STRIDES)
