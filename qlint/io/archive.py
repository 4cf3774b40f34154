"""What a `.pt2` may contain, decided before torch reads a byte of it (no torch here).

`torch.export.load` trusts its archive: it unpickles weights, constants and
opaque objects of every program the archive names, loads AOTInductor shared
libraries, `sympify`s (evaluates) symbolic-shape strings, resolves any
`torch.*` attribute as a node target, and compiles `guards_code` into Python.
qlint therefore parses the archive itself, allows only what a quantized
program saved by `torch.export.save` needs, and gives torch a *new* archive
rebuilt from exactly the entries it checked. Torch never sees the original
file, so two zip parsers cannot disagree about it (duplicate names, prepended
data, a second central directory): what was checked is what is loaded.

Allowed: the archive's small metadata entries; one program, `models/model.json`
(static shapes, operators of the allowed namespaces only); the weights and
constants configs; the raw tensor payloads they name; and the sample inputs,
which torch never unpickles (qlint loads them with the weights-only unpickler).
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from dataclasses import dataclass
from typing import Any

from qlint.io.limits import Limits
from qlint.io.reads import ReadError
from qlint.io.wellformed import MODEL, SCALAR_TYPES, check_payloads, check_program

# Operator namespaces a quantized Cortex-M program is made of.
NAMESPACES = ("aten", "quantized_decomposed", "cortex_m")
# `<op>.<overload>`: names may start with one underscore (`aten._softmax`), never two (`__class__`
# would walk Python attributes instead of naming an operator).
_NAME = r"(?!__)[A-Za-z_][A-Za-z0-9_]*"
_OP_TARGET = re.compile(rf"^torch\.ops\.({'|'.join(NAMESPACES)})\.{_NAME}\.{_NAME}$")
_PYTHON_TARGETS = frozenset({"_operator.getitem"})
_METADATA = frozenset({"archive_format", "archive_version", ".data/version", "byteorder", ".data/serialization_id"})
_PAYLOAD_DIRS = {"weights": re.compile(r"^weight_\d+$"), "constants": re.compile(r"^tensor_\d+$")}
SAMPLE_INPUTS = "data/sample_inputs/model.pt"
_INT64 = (-(1 << 63), (1 << 63) - 1)
# Argument kinds that would make torch build something other than plain values.
_REFUSED_ARGS = {
    "as_expr": "a symbolic shape (qlint reads static-shape programs: export without dynamic_shapes)",
    "as_graph": "a subgraph (higher-order operators are not part of a Cortex-M program)",
    "as_custom_obj": "a custom object (it would be unpickled)",
    "as_operator": "an operator passed as a value",
}


@dataclass
class Pt2Archive:
    """A checked `.pt2`: its entries (relative to the archive's folder), its program, and its
    weights and constants configs (`weights`/`constants` -> FQN -> payload entry)."""

    prefix: str
    entries: dict[str, bytes]
    program: dict[str, Any]
    configs: dict[str, dict[str, Any]]

    @property
    def sample_inputs(self) -> bytes:
        return self.entries.get(SAMPLE_INPUTS, b"")

    def for_torch(self) -> bytes:
        """The archive torch loads: the checked entries only, the program without
        guard code, and no sample inputs (qlint loads those itself)."""
        program = dict(self.program, guards_code=[])
        replaced = {MODEL: json.dumps(program).encode(), SAMPLE_INPUTS: b""}
        return write_zip({f"{self.prefix}/{name}": data for name, data in {**self.entries, **replaced}.items()})


def write_zip(entries: dict[str, bytes]) -> bytes:
    """A plain stored zip of `entries`: the only archive bytes torch is ever given."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name, data in entries.items():
            archive.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)
    return buffer.getvalue()


def read_zip(data: bytes, limits: Limits) -> dict[str, bytes]:
    """Every entry of a zip, decompressed within the limits; ambiguous archives are refused."""
    if not zipfile.is_zipfile(io.BytesIO(data)):
        raise ReadError("not a zip archive")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = archive.infolist()
            names = [i.filename for i in infos]
            if len(set(names)) != len(names):
                twice = sorted({n for n in names if names.count(n) > 1})
                raise ReadError(f"entry {twice[0]!r} appears more than once (zip readers disagree on which is read)")
            entries, total = {}, 0
            for info in infos:
                if info.flag_bits & 0x1:
                    raise ReadError(f"entry {info.filename!r} is encrypted")
                if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                    raise ReadError(f"entry {info.filename!r} uses compression method {info.compress_type}")
                if info.file_size > limits.entry_bytes:
                    raise ReadError(f"entry {info.filename!r} inflates to {info.file_size} bytes, over the "
                                    f"{limits.entry_bytes}-byte entry limit (limits in .qlint.yaml)")
                with archive.open(info) as handle:
                    body = handle.read(limits.entry_bytes + 1)  # never trust the declared size
                    if len(body) > limits.entry_bytes:
                        raise ReadError(
                            f"entry {info.filename!r} inflates past the {limits.entry_bytes}-byte entry limit"
                        )
                    handle.read(1)  # reach the end: zipfile checks the CRC there
                total += len(body)
                if total > limits.total_bytes:
                    raise ReadError(f"entries inflate past the {limits.total_bytes}-byte archive limit")
                entries[info.filename] = body
    except zipfile.BadZipFile as exc:
        raise ReadError(f"corrupt zip archive: {exc}") from None
    except (NotImplementedError, EOFError, OSError, ValueError) as exc:
        raise ReadError(f"corrupt zip archive: {type(exc).__name__}: {exc}") from None
    return entries


def parse_pt2(data: bytes, limits: Limits) -> Pt2Archive:
    """Check a `.pt2` against the allow-list; the archive torch may load, or a ReadError."""
    try:
        raw = read_zip(data, limits)
    except ReadError as exc:
        if str(exc) == "not a zip archive":
            raise ReadError("not a .pt2 archive (not a zip file)") from None
        raise
    if not any("/models/" in name for name in raw):
        raise ReadError("not a .pt2 archive from torch.export.save (no models/*.json)")
    prefixes = {name.split("/", 1)[0] for name in raw}
    if len(prefixes) != 1 or any("/" not in name for name in raw):
        raise ReadError("not a .pt2 archive from torch.export.save (entries are not in one folder)")
    prefix = prefixes.pop()
    entries = {name.split("/", 1)[1]: body for name, body in raw.items()}
    models = sorted(n for n in entries if n.startswith("models/"))
    if not models:
        raise ReadError("not a .pt2 archive from torch.export.save (no models/*.json)")
    if len(models) > 1:
        raise ReadError(f"holds {len(models)} programs; qlint reads archives with one")
    if models != [MODEL]:
        raise ReadError(f"holds a program named {models[0]!r}; torch.export.save writes {MODEL!r}")
    allowed = {MODEL, SAMPLE_INPUTS}
    configs: dict[str, dict[str, Any]] = {}
    for kind, pattern in _PAYLOAD_DIRS.items():
        config_name = f"data/{kind}/model_{kind}_config.json"
        if f"data/{kind}/model.pt" in entries:
            raise ReadError("uses the legacy pickled weight format; re-save it with torch.export.save")
        if config_name not in entries:
            raise ReadError(f"not a .pt2 archive from torch.export.save (no {config_name})")
        allowed.add(config_name)
        configs[kind] = _payload_config(entries[config_name], kind, pattern)
        for payload in configs[kind].values():
            path_name = payload["path_name"]
            if f"data/{kind}/{path_name}" not in entries:
                raise ReadError(f"{kind[:-1]} payload {path_name!r} is missing")
            allowed.add(f"data/{kind}/{path_name}")
    for name, body in entries.items():
        if name in _METADATA:
            if len(body) > 64:
                raise ReadError(f"entry {name!r} is {len(body)} bytes; torch writes a few")
        elif name not in allowed:
            raise ReadError(
                f"unexpected entry {name!r}; qlint loads programs, weights, constants and sample inputs only"
            )
    # Counted before parsing (braces inside strings too, an overestimate): what the parsed graph costs.
    objects = entries[MODEL].count(b"{") + entries[MODEL].count(b"[")
    if objects > limits.graph_objects:
        raise ReadError(f"its program holds {objects} JSON objects and lists, over the {limits.graph_objects} "
                        "limit (graph_objects, about 9,000 nodes; limits in .qlint.yaml)")
    program = _json(entries[MODEL], MODEL)
    validate_program_json(program, limits)
    check_payloads(program, configs, entries)
    return Pt2Archive(prefix, entries, program, configs)


def _json(body: bytes, name: str) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise ReadError(f"corrupt {name}: {type(exc).__name__}: {str(exc)[:200]}") from None


def _payload_config(body: bytes, kind: str, pattern: re.Pattern[str]) -> dict[str, Any]:
    """A weights/constants config's mapping FQN -> payload entry, all plain tensors."""
    config = _json(body, f"model_{kind}_config.json")
    payloads = config.get("config") if isinstance(config, dict) else None
    if not isinstance(payloads, dict):
        raise ReadError(f"corrupt model_{kind}_config.json: no config mapping")
    for fqn, payload in payloads.items():
        if not isinstance(payload, dict):
            raise ReadError(f"corrupt model_{kind}_config.json: entry {fqn!r} is not a mapping")
        path_name = payload.get("path_name")
        if payload.get("use_pickle") is not False or not isinstance(path_name, str) or not pattern.match(path_name):
            raise ReadError(f"{kind[:-1]} {fqn!r} is a pickled object; qlint loads plain tensors only")
        if not isinstance(payload.get("tensor_meta"), dict):
            raise ReadError(f"corrupt model_{kind}_config.json: {fqn!r} has no tensor_meta")
    return payloads


def validate_program_json(program: Any, limits: Limits) -> None:
    """Refuse what would run code or build unbounded state while torch deserializes or
    lowers the program: foreign node targets, symbolic shapes, subgraphs, custom objects,
    and tensors larger in total than the limit."""
    if not isinstance(program, dict) or not isinstance(program.get("graph_module"), dict):
        raise ReadError(f"corrupt {MODEL}: no graph_module")
    if program.get("range_constraints"):
        raise ReadError("declares symbolic shapes (range_constraints); qlint reads static-shape programs")
    graph = program["graph_module"].get("graph")
    if not isinstance(graph, dict) or not isinstance(graph.get("nodes"), list):
        raise ReadError(f"corrupt {MODEL}: no graph nodes")
    for key in ("sym_int_values", "sym_float_values", "sym_bool_values", "custom_obj_values"):
        if graph.get(key):
            raise ReadError(f"declares {key}; qlint reads static-shape programs without custom objects")
    for node in graph["nodes"]:
        target = node.get("target") if isinstance(node, dict) else None
        if not isinstance(target, str) or not (_OP_TARGET.match(target) or target in _PYTHON_TARGETS):
            shown = target if isinstance(target, str) else type(target).__name__
            raise ReadError(
                f"a node calls {shown[:120]!r}, outside the operator namespaces qlint runs ({', '.join(NAMESPACES)})"
            )
    _check_values(program)
    declared = 0
    tensors = graph.get("tensor_values") or {}
    if not isinstance(tensors, dict):
        raise ReadError(f"corrupt {MODEL}: tensor_values is not a mapping")
    for name, meta in tensors.items():
        declared += _tensor_bytes(name, meta)
        if declared > limits.tensor_bytes:
            raise ReadError(f"its tensors declare over {limits.tensor_bytes} bytes (limits in .qlint.yaml)")
    check_program(program, limits.tensor_bytes)


def _check_values(document: Any) -> None:
    """Every key and number of the program, in one iterative walk (no recursion limit to hit):
    no argument kind that builds objects, no integer outside torch's int64."""
    stack = [document]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is dict:
            for key in item:
                if key in _REFUSED_ARGS:
                    raise ReadError(f"holds {_REFUSED_ARGS[key]}")
            stack.extend(item.values())
        elif kind is list:
            stack.extend(item)
        elif kind is int and not _INT64[0] <= item <= _INT64[1]:
            raise ReadError(f"corrupt {MODEL}: holds an integer outside int64 ({len(str(abs(item)))} digits)")


def _tensor_bytes(name: str, meta: Any) -> int:
    sizes = meta.get("sizes") if isinstance(meta, dict) else None
    if not isinstance(sizes, list):
        raise ReadError(f"corrupt {MODEL}: tensor {str(name)[:80]!r} has no sizes")
    numel = 1
    for size in sizes:
        value = size.get("as_int") if isinstance(size, dict) else None
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ReadError(f"corrupt {MODEL}: tensor {str(name)[:80]!r} has a size that is not a static integer")
        numel *= value
        if numel > 1 << 62:
            break
    code = meta.get("dtype")
    return numel * (SCALAR_TYPES[code][1] if isinstance(code, int) and code in SCALAR_TYPES else 8)
