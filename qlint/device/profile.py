"""Read an ETDump, ExecuTorch's on-device profile, and put its measured cycles on a program's ops.

ExecuTorch's runtime (`runtime/executor/method.cpp`) opens one event block named "Execute" a
`Method::execute` call and records, for every instruction of the plan, a profile event named for
the instruction's kind (`OPERATOR_CALL` for a kernel call, `MOVE_CALL`, `FREE_CALL`) with the chain
and instruction index it ran, stamped by the platform's `et_pal_current_ticks()` (a cycle counter on a
Cortex-M port that counts cycles, which is how qlint reads them). So an
event maps to exactly one instruction of the `.pte` the profile was recorded from, and a profile
of another program shows as an event on an instruction the plan does not have or has of another
kind, or a kernel call without its event: each refused in one line (`ProfileMismatch`), never a
partial mapping. Both ways in hold a profile to the instructions of that `.pte` (`check_profile`):
the `.pte` checked, or the one `--fix` wrote beside the ETRecord that maps it to a `.pt2`.

The file is untrusted. It is read by ExecuTorch's schema (`etdump_schema_flatcc.fbs`) straight from
the flatbuffer, and only what qlint uses: each run's profile events' name, chain, instruction and
times. A flatbuffer may point at one table from every slot of a vector, so the runs and events read
are counted (`limits.profile_entries`); nothing else of the file (strings, debug values, tensors)
is expanded, so a small file cannot cost more than its count of events.
"""

from __future__ import annotations

import statistics
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from torch.fx import Node

from qlint.device.cost import OpCost, ProgramCost
from qlint.io.limits import Limits
from qlint.io.reads import ReadError
from qlint.loading.view import DELEGATE_CALL, GraphView, base_name, op_name
from qlint.settings.sizes import MAX_AMOUNT

# The event each instruction kind records (`Method::execute_instruction`): what the plan must hold there.
INSTRUCTION_EVENTS = {"OPERATOR_CALL": "KernelCall", "MOVE_CALL": "MoveCall", "FREE_CALL": "FreeCall",
                      "DELEGATE_CALL": "DelegateCall"}
# What ExecuTorch's Ethos-U backend records inside a delegate call (`EthosUBackend::execute`,
# backends/arm/runtime/EthosUBackend.cpp), on the call's own chain and instruction: the whole call, and
# its steps, named `+EthosUBackend::execute()<step>` (copying each input, reading the command stream,
# the NPU's run), each within the call's DELEGATE_CALL event.
BACKEND_EVENT = "EthosUBackend::execute()"
# The step that runs the command stream: the core waits on the NPU (`platform_execute`) for its length.
NPU_EVENT = "+EthosUBackend::execute()NPU"
# The DWT/PMU cycle counter a Cortex-M runner reads is 32 bits wide: an event that spans its wrap
# ends at a smaller count than it started, and no event can measure 2**32 cycles or more.
COUNTER_WRAP = 1 << 32
NAME_SHOWN = 60  # the characters of an event's name an error shows


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
    npu: dict[int, int] = field(default_factory=dict)  # a delegate call's instruction -> its NPU run's median


def read_profile(data: bytes, limits: Limits) -> Profile:
    """The profile in the bytes of an ETDump, or a ReadError saying why not."""
    read = [_run(index, events) for index, events in enumerate(_runs(data, limits), start=1)]
    read = [(found, npu) for found, npu in read if found]  # blocks without instruction events: loading, init
    runs = [found for found, _ in read]
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
    ran_first = read[0][1]
    for number, (_, ran) in enumerate(read[1:], start=2):
        if ran.keys() != ran_first.keys():  # a median over runs that lack it would be a figure no run recorded
            raise ProfileMismatch(f"run {number} records the NPU's run in {len(ran)} delegate calls, run 1 in "
                                  f"{len(ran_first)}: the runs are not of one program")
    cycles = {i: int(statistics.median_low(run[i][1] for run in runs)) for i in sorted(first)}
    npu = {i: int(statistics.median_low(ran[i] for _, ran in read)) for i in sorted(ran_first)}
    if sum(cycles.values()) > MAX_AMOUNT:
        raise ProfileError(f"its instructions measure {sum(cycles.values()):,} cycles together, over 2**53: "
                           "no figure compares exactly past it")
    calls = [cycles[i] for i, name in kinds.items() if name in ("OPERATOR_CALL", "DELEGATE_CALL")]
    if calls and not any(calls):  # (none at all: not of the program, which `check_profile` says)
        # every kernel takes time: a profile that says none measured nothing, and would pass any budget
        raise ProfileError("every kernel call measures 0 cycles: the runner's timer did not count (a cycle "
                           "counter that is off, or a timer too coarse for one operator)")
    return Profile(len(runs), kinds, cycles, npu)


def _run(number: int, events: Iterable[_Event]) -> tuple[dict[int, tuple[str, int]], dict[int, int]]:
    """One event block's instruction events, index -> (event name, cycles), and the NPU's run within
    each delegate call that records one (the Ethos-U backend's events, `_backend_event`)."""
    found: dict[int, tuple[str, int]] = {}
    npu: dict[int, int] = {}
    inside: dict[int, str] = {}  # an instruction the backend recorded events on -> one of their names
    for event in events:
        if event.chain == -1:  # Method::execute, Method::init: not an instruction
            continue
        name, index = event.name, event.instruction
        if event.chain != 0:
            raise ProfileMismatch(f"run {number} has an event on chain {event.chain}; the program has one chain")
        if _backend_event(name):
            inside.setdefault(index, name)
            if name == NPU_EVENT:
                npu[index] = npu.get(index, 0) + _elapsed(number, index, event.start, event.end)
            continue
        if name not in INSTRUCTION_EVENTS:
            raise ProfileMismatch(f"run {number} records {name[:NAME_SHOWN]!r} at instruction {index}; "
                                  f"the program's instructions record {', '.join(INSTRUCTION_EVENTS)}")
        if index < 0:
            raise ProfileMismatch(f"run {number} records {name} at instruction {index}, which is no instruction")
        if index in found:
            raise ProfileMismatch(f"run {number} records instruction {index} twice")
        found[index] = (name, _elapsed(number, index, event.start, event.end))
    for index, name in inside.items():
        if found.get(index, ("",))[0] != "DELEGATE_CALL":
            raise ProfileMismatch(f"run {number} records the Ethos-U backend's {name[:NAME_SHOWN]!r} at instruction "
                                  f"{index}, where it records no DELEGATE_CALL")
    return found, npu


def _backend_event(name: str) -> bool:
    """An event ExecuTorch's Ethos-U backend records inside a delegate call (`BACKEND_EVENT`)."""
    return name == BACKEND_EVENT or name.startswith("+" + BACKEND_EVENT)


def _elapsed(number: int, index: int, start: int, end: int) -> int:
    """The cycles from `start` to `end` of a 32-bit counter, across one wrap; more than it can count
    (from a port whose ticks are wider, or a forged file) is refused, not carried into every figure."""
    if end >= start:
        elapsed = end - start
    elif start >= COUNTER_WRAP:
        raise ProfileError(f"run {number}'s event on instruction {index} ends ({end}) before it starts ({start}) "
                           "and is not a 32-bit counter's wrap")
    else:
        elapsed = end + COUNTER_WRAP - start
    if elapsed >= COUNTER_WRAP:
        raise ProfileError(f"run {number}'s event on instruction {index} spans {elapsed:,} cycles: a 32-bit "
                           f"cycle counter measures at most {COUNTER_WRAP - 1:,}")
    return elapsed


def check_profile(profile: Profile, steps: list[str], program: str = "the program") -> None:
    """Refuse a profile that is not of `program`, whose instructions are `steps` (an operator name for
    a kernel call, else the instruction's kind, as `pte.plan_steps` reads them): an event on an
    instruction the plan does not have or has of another kind, or a kernel call without its event."""
    for index, name in sorted(profile.kinds.items()):
        if index >= len(steps):
            raise ProfileMismatch(f"instruction {index} is past the {len(steps)} instructions of {program}")
        kind = _kind(steps[index])
        if INSTRUCTION_EVENTS[name] != kind:
            what = steps[index] if kind == "KernelCall" else f"a {kind}"
            raise ProfileMismatch(f"instruction {index} is {what} in {program}; the profile records {name} there")
    for index, step in enumerate(steps):
        if _kind(step) in ("KernelCall", "DelegateCall") and index not in profile.kinds:
            event = "DELEGATE_CALL" if _kind(step) == "DelegateCall" else "OPERATOR_CALL"
            raise ProfileMismatch(f"instruction {index} ({step}) has no {event} event: "
                                  f"the profile is not of {program}, or the runner's event buffer was full")


def _kind(step: str) -> str:
    return step if step in ("MoveCall", "FreeCall", "DelegateCall") else "KernelCall"


def measured_cost(view: GraphView, steps: list[str], profile: Profile, plan: str,
                  estimate: ProgramCost) -> ProgramCost:
    """The program's cost as `profile` measured it: each kernel call's median cycles on its node.

    `steps` are the plan's instructions in order (`check_profile`), `plan` the plan's name (its node ids).
    """
    check_profile(profile, steps)
    nodes = _instruction_nodes(view, plan)
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
        if any(i in profile.npu for i in indices):
            cost.npu_runs[node.name] = sum(profile.npu.get(i, 0) for i in indices)
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
        index = _index(key)
        if index is None or not listed or not all(type(h) is int and 0 <= h <= MAX_INDEX for h in listed):
            raise ProfileError(f"not a valid ETRecord: debug_handle_map entry {key[:20]!r} is not "
                               "an instruction's debug handles")
        handles[index] = tuple(listed)
    if not handles:
        raise ProfileError("not a valid ETRecord: its debug_handle_map maps no instruction to the program's nodes")
    return Record(handles, _handle_ops(graph))


# The largest instruction index or debug handle read: ExecuTorch records both as 32-bit ints.
MAX_INDEX = (1 << 31) - 1


def _index(text: object) -> int | None:
    """An instruction index or debug handle written as a string of ASCII digits, None for anything
    else (`str.isdigit` takes `²`, which `int` refuses; a long one is past any plan)."""
    if not isinstance(text, str) or not text.isascii() or not text.isdigit() or len(text) > 10:
        return None
    value = int(text)
    return value if value <= MAX_INDEX else None


def check_record(record: Record, steps: list[str], pte: str) -> None:
    """Refuse an ETRecord that is not of the `.pte` `pte` whose instructions are `steps` (`check_profile`):
    it maps debug handles to an instruction that is no kernel call there, or whose operator none of
    the handles' nodes calls."""
    if "DelegateCall" in steps:  # a partition's handles name its nodes inside the delegate, not the .pt2's
        raise ProfileError(f"{pte}, the .pte written with it, calls NPU delegates: through an ETRecord a profile is "
                           "placed on the .pt2's nodes, and a partition is not one of them; check that .pte itself "
                           "with --profile")
    for index, handles in sorted(record.handles.items()):
        if index >= len(steps) or _kind(steps[index]) != "KernelCall":
            what = f"past the {len(steps)} instructions" if index >= len(steps) else f"a {steps[index]}"
            raise ProfileError(f"instruction {index}, which it maps to debug handles, is {what} of {pte}, "
                               "the .pte written with it")
        recorded = frozenset().union(*(record.ops.get(h, frozenset()) for h in handles))
        if recorded and _operator(steps[index]) not in recorded:
            raise ProfileError(f"instruction {index} calls {', '.join(sorted(recorded))} in it, "
                               f"{steps[index]} in {pte}, the .pte written with it")


def _operator(step: str) -> str:
    """A kernel call's operator as the edge program names it: `cortex_m::softmax.out` -> `softmax`."""
    return step.rpartition("::")[2].partition(".")[0]


def _handle_ops(graph: object) -> dict[int, frozenset[str]]:
    """The base names of the operators each debug handle's nodes call, from the edge program's JSON
    (any part of it that is not the shape torch's serializer writes is read as absent)."""
    found: dict[int, set[str]] = {}
    for node in _listed(graph, "graph_module", "graph", "nodes"):
        handle, target = _mapping(_mapping(node).get("metadata")).get("debug_handle"), _mapping(node).get("target")
        index = _index(handle)
        if index is not None and isinstance(target, str):
            found.setdefault(index, set()).add(base_name(target.removeprefix(EDGE_OPS)))
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

    The profile and the ETRecord have been held to that `.pte`'s instructions (`check_profile`,
    `check_record`). The profile is of the fixed program: an island the fix folded has no instruction,
    so it measured nothing. An instruction's cycles go to the nodes of its first debug handle, the k-th
    instruction of a handle to its k-th node in graph order (the emitter writes them in that order).
    """
    by_handle: dict[int, list[Node]] = {}
    for node in view.nodes:
        handle = node.meta.get("debug_handle")
        if node.op == "call_function" and type(handle) is int and op_name(node) != "getitem":
            by_handle.setdefault(handle, []).append(node)
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
    """A kernel call the estimate prices at nothing (an alias, work the model skips), or a delegate call
    with no estimate (a `.pte`'s): the device ran it."""
    delegated = op_name(node) == DELEGATE_CALL
    return OpCost(node.name, op_name(node), 0, "call" if delegated else "element", 0.0, False, npu=delegated)


# The reader: ExecuTorch's ETDump schema, read from the flatbuffer as any flatbuffers reader does.

class _Event(NamedTuple):
    """What qlint reads of one profile event (`ProfileEvent`)."""

    name: str
    chain: int
    instruction: int
    start: int
    end: int


# Field ids (vtable slots) of `etdump_schema_flatcc.fbs`, and its defaults where qlint reads a scalar.
_RUN_DATA, _EVENTS, _PROFILE = 1, 3, 0    # ETDump.run_data, RunData.events, Event.profile_event
_NAME, _CHAIN, _INSTRUCTION, _START, _END = 0, 1, 2, 6, 7  # ProfileEvent's fields
NAME_BYTES = 64  # an instruction event's name is shorter: a longer one is read this far, to be shown


def _runs(data: bytes, limits: Limits) -> Iterator[Iterator[_Event]]:
    """Each run's profile events, read from the flatbuffer; the runs and events counted as they are
    read (`limits.profile_entries`)."""
    if len(data) < 12 or data[8:12] != b"ED00":
        raise ProfileError("not an ETDump: no size-prefixed ETDump file identifier (ED00)")
    if struct.unpack_from("<I", data, 0)[0] != len(data) - 4:
        raise ProfileError("not a valid ETDump: its size prefix is not its length (a truncated file?)")
    buffer = _Flatbuffer(data[4:], limits)
    for run in buffer.tables(buffer.u32(0), _RUN_DATA):
        yield _events(buffer, run)


def _events(buffer: _Flatbuffer, run: int) -> Iterator[_Event]:
    """One run's profile events (an event of another kind, allocation or debug, is not read)."""
    for event in buffer.tables(run, _EVENTS):
        profiled = buffer.table(event, _PROFILE)
        if profiled is not None:
            yield _Event(buffer.string(profiled, _NAME), buffer.scalar(profiled, _CHAIN, "<i", 0),
                         buffer.scalar(profiled, _INSTRUCTION, "<i", -1),
                         buffer.scalar(profiled, _START, "<Q", 0), buffer.scalar(profiled, _END, "<Q", 0))


class _Flatbuffer:
    """Tables, vectors and fields of an untrusted flatbuffer, every offset checked against the file;
    vector items counted as they are read (one table may be listed a million times over)."""

    def __init__(self, data: bytes, limits: Limits) -> None:
        self.data, self.limit, self.count = data, int(limits.profile_entries), 0
        self.vtables: dict[int, tuple[int, ...]] = {}  # each vtable's field offsets, read once (tables share them)

    def visit(self, count: int) -> None:
        self.count += count
        if self.count > self.limit:
            raise ProfileError(f"holds over {self.limit} runs and events (limits.profile_entries in .qlint.yaml)")

    def at(self, offset: int, size: int) -> int:
        if not 0 <= offset <= len(self.data) - size:
            raise ProfileError("not a valid ETDump: an offset points outside the file")
        return offset

    def u32(self, offset: int) -> int:
        return int(struct.unpack_from("<I", self.data, self.at(offset, 4))[0])

    def field(self, table: int, slot: int) -> int | None:
        """Where field `slot` of the table at `table` is, None when absent."""
        vtable = table - struct.unpack_from("<i", self.data, self.at(table, 4))[0]
        offsets = self.vtables.get(vtable)
        if offsets is None:
            size = struct.unpack_from("<H", self.data, self.at(vtable, 4))[0]
            if size < 4 or size % 2 or vtable + size > len(self.data):
                raise ProfileError("not a valid ETDump: a table's vtable is malformed or outside the file")
            offsets = self.vtables[vtable] = struct.unpack_from(f"<{size // 2 - 2}H", self.data, vtable + 4)
        offset = offsets[slot] if slot < len(offsets) else 0
        return table + offset if offset else None

    def table(self, table: int, slot: int) -> int | None:
        at = self.field(table, slot)
        return None if at is None else at + self.u32(at)

    def scalar(self, table: int, slot: int, layout: str, default: int) -> int:
        at = self.field(table, slot)
        if at is None:
            return default
        return int(struct.unpack_from(layout, self.data, self.at(at, struct.calcsize(layout)))[0])

    def string(self, table: int, slot: int) -> str:
        """A string field's first `NAME_BYTES` bytes ("" when absent): decoded only so far."""
        at = self.table(table, slot)
        if at is None:
            return ""
        length = self.u32(at)
        self.at(at + 4, length)
        text = self.data[at + 4:at + 4 + min(length, NAME_BYTES)].decode("utf-8", errors="replace")
        return text + "..." if length > NAME_BYTES else text

    def tables(self, table: int, slot: int) -> Iterator[int]:
        """The tables a vector field lists (none when absent), counted one by one."""
        at = self.field(table, slot)
        if at is None:
            return
        start = at + self.u32(at)
        length = self.u32(start)
        self.at(start + 4, 4 * length)
        self.visit(length)
        for i in range(length):
            item = start + 4 + 4 * i
            yield item + self.u32(item)
