"""Is a `.pt2`'s program one torch would load and its quantize ops would run? Decided without torch.

Both tiers read a `.pt2` through `qlint.io.archive`, so the checks here are what
makes `--static` and the full check accept and refuse the same files. They are
the rules `torch.export.load` and the `quantized_decomposed` kernels apply,
written out so that no verdict is ever computed on a program torch would refuse
or on qparams no kernel can run:

- every tensor a node reads is a graph input or the output of an earlier node,
  and no name is defined twice (torch's deserializer looks names up as it goes):
  a graph is acyclic and every walk over it ends;
- every dtype code is one of torch's (`qlint.io.archive` checks every integer fits int64);
- a quantize or dequantize has an integer dtype, `dtype_min <= quant_min <=
  quant_max <= dtype_max`, a finite positive scale and a zero point inside its
  range;
- a lifted weight or constant is read as torch reads it: its payload's dtype,
  sizes, strides and storage offset are the config's, the payload holds whole
  elements and every element the view reaches, and the program's placeholder
  declares the same dtype and sizes;
- a `size` argument (`aten.full`, `aten.zeros`) stays inside the tensor limit.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from qlint.io.reads import ReadError

MODEL = "models/model.json"
# torch._export.serde.schema.ScalarType: code -> (name, bytes per element).
SCALAR_TYPES = {
    1: ("uint8", 1), 2: ("int8", 1), 3: ("int16", 2), 4: ("int32", 4), 5: ("int64", 8), 6: ("float16", 2),
    7: ("float32", 4), 8: ("float64", 8), 9: ("complex32", 4), 10: ("complex64", 8), 11: ("complex128", 16),
    12: ("bool", 1), 13: ("bfloat16", 2), 28: ("uint16", 2), 29: ("float8_e4m3fn", 1), 30: ("float8_e5m2", 1),
    31: ("float8_e4m3fnuz", 1), 32: ("float8_e5m2fnuz", 1), 33: ("float8_e8m0fnu", 1), 34: ("uint32", 4),
    35: ("uint64", 8),
}
# The integer dtypes a quantize may produce, and their ranges (`_quant_min_max_bounds_check`).
QUANT_RANGES = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767),
                "int32": (-(1 << 31), (1 << 31) - 1)}
# Argument kinds that name tensors.
_TENSOR_ARGS = ("as_tensor", "as_tensors", "as_optional_tensor", "as_optional_tensors")
# Input spec kinds that lift a stored tensor, and the field naming its FQN.
LIFTED = {"parameter": "parameter_name", "buffer": "buffer_name", "tensor_constant": "tensor_constant_name"}


def check_program(program: dict[str, Any], tensor_bytes: int) -> None:
    """The graph's names, dtypes, integers, qparams and sizes; a ReadError on the first that fails."""
    graph = program["graph_module"]["graph"]
    tensors = _field(graph, "tensor_values", dict)
    for name, meta in tensors.items():
        scalar_type(meta.get("dtype") if isinstance(meta, dict) else None, f"tensor {_short(name)}")
    defined: set[str] = set()
    for arg in _field(graph, "inputs", list):
        for name in _tensor_names(arg):
            _define(name, defined, tensors)
    for index, node in enumerate(graph["nodes"]):
        label = _node_label(node, index)
        for item in _field(node, "inputs", list):
            arg = item.get("arg") if isinstance(item, dict) else None
            for name in _tensor_names(arg):
                if name not in defined:
                    raise ReadError(f"corrupt {MODEL}: {label} reads {_short(name)}, which no earlier node defines")
            if isinstance(arg, dict) and "as_scalar_type" in arg:
                scalar_type(arg["as_scalar_type"], label)
        _check_qparams(node, label)
        _check_size(node, label, tensor_bytes, tensors)
        for output in _field(node, "outputs", list):
            for name in _tensor_names(output):
                _define(name, defined, tensors)
    for arg in _field(graph, "outputs", list):
        for name in _tensor_names(arg):
            if name not in defined:
                raise ReadError(f"corrupt {MODEL}: the graph returns {_short(name)}, which no node defines")


def check_payloads(program: dict[str, Any], configs: dict[str, dict[str, Any]], entries: dict[str, bytes]) -> None:
    """Each lifted tensor as torch's loader reads it (`_build_file_map` and `as_strided`), and its
    placeholder's declared dtype and sizes the same; `configs` maps weights/constants to their
    config mapping, `entries` are the archive's (`data/weights/weight_0` -> bytes)."""
    declared: dict[str, Any] = {}
    for kind, config in configs.items():
        for fqn, payload in config.items():
            meta = payload["tensor_meta"]
            _check_view(f"{kind[:-1]} {_short(fqn)}", meta, entries[f"data/{kind}/{payload['path_name']}"])
            declared[fqn] = meta
    graph = program["graph_module"]["graph"]
    tensors = _field(graph, "tensor_values", dict)
    for spec in _field(_field(program["graph_module"], "signature", dict), "input_specs", list):
        lifted = _lifted(spec)
        if lifted is None:
            continue
        placeholder, fqn = lifted
        meta = declared.get(fqn)
        if meta is None:
            raise ReadError(f"corrupt {MODEL}: {_short(fqn)} is a program input with no payload")
        graph_meta = tensors.get(placeholder)
        if not isinstance(graph_meta, dict):
            raise ReadError(f"corrupt {MODEL}: input {_short(placeholder)} has no tensor metadata")
        if graph_meta.get("dtype") != meta.get("dtype") or _ints(graph_meta.get("sizes")) != _ints(meta.get("sizes")):
            raise ReadError(
                f"{_short(fqn)} is declared {_describe(graph_meta)} in the graph and stored as {_describe(meta)}"
            )


def scalar_type(code: Any, where: str) -> tuple[str, int]:
    """The name and element size of a ScalarType code; a ReadError for a code torch does not have."""
    if isinstance(code, bool) or not isinstance(code, int) or code not in SCALAR_TYPES:
        raise ReadError(f"corrupt {MODEL}: {where} has dtype code {str(code)[:20]}, which torch does not define")
    return SCALAR_TYPES[code]


def _tensor_names(arg: Any) -> Iterator[str]:
    """The tensor names an argument (or a node output) refers to."""
    if not isinstance(arg, dict):
        return
    for kind in _TENSOR_ARGS:
        value = arg.get(kind)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, dict) and "as_tensor" in item:  # an optional tensor
                item = item["as_tensor"]
            name = item.get("name") if isinstance(item, dict) else None
            if isinstance(name, str):
                yield name
            elif item is not None and not (isinstance(item, dict) and "as_none" in item):
                raise ReadError(f"corrupt {MODEL}: a tensor argument without a name")


def _define(name: str, defined: set[str], tensors: dict[str, Any]) -> None:
    if name in defined:
        raise ReadError(f"corrupt {MODEL}: tensor {_short(name)} is defined twice")
    if name not in tensors:
        raise ReadError(f"corrupt {MODEL}: tensor {_short(name)} has no tensor metadata")
    defined.add(name)


def _field(container: dict[str, Any], key: str, kind: type) -> Any:
    """`container[key]`, empty when absent or null; a ReadError when it is of another JSON type."""
    value = container.get(key)
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise ReadError(f"corrupt {MODEL}: {key} is a {type(value).__name__}, not a {kind.__name__}")
    return value


def _node_label(node: dict[str, Any], index: int) -> str:
    name = node.get("name")
    if not isinstance(name, str):
        outputs = node.get("outputs")
        name = next((n for o in outputs for n in _tensor_names(o)), None) if isinstance(outputs, list) else None
    return f"node {_short(name)}" if isinstance(name, str) else f"node #{index}"


def _arguments(node: dict[str, Any]) -> dict[str, Any]:
    """A node's arguments by schema name: `{"scale": {"as_float": 0.1}, ...}`."""
    return {str(item.get("name")): item.get("arg") for item in _field(node, "inputs", list) if isinstance(item, dict)}


def _literal(arg: Any, *kinds: str) -> Any:
    """The value of a literal argument of one of `kinds`, or None."""
    if isinstance(arg, dict):
        for kind in kinds:
            if kind in arg:
                return arg[kind]
    return None


def _check_qparams(node: dict[str, Any], label: str) -> None:
    """The range, scale and zero point of a quantize or dequantize, as its kernel needs them."""
    target = node.get("target")
    if not (isinstance(target, str) and target.startswith("torch.ops.quantized_decomposed.")
            and "quantize_per_" in target):
        return
    args = _arguments(node)
    if "quant_min" not in args or "dtype" not in args:
        return
    dtype = scalar_type(_literal(args["dtype"], "as_scalar_type"), label)[0]
    problem = qparams_problem(_literal(args.get("scale"), "as_float", "as_int"),
                              _literal(args.get("zero_point"), "as_int"), _literal(args.get("quant_min"), "as_int"),
                              _literal(args.get("quant_max"), "as_int"), dtype)
    if problem:
        raise ReadError(f"{label} {problem}")


def qparams_problem(scale: Any, zero_point: Any, qmin: Any, qmax: Any, dtype: str) -> str | None:
    """Why no kernel runs these qparams (`has the range [127, -128], ...`), or None. A scale or
    zero point given as a tensor (None here) is not judged."""
    if dtype not in QUANT_RANGES:
        return f"quantizes to {dtype}, not an integer dtype"
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (qmin, qmax)):
        return "has quant_min/quant_max that are not integers"
    low, high = QUANT_RANGES[dtype]
    if not low <= qmin <= qmax <= high:
        return f"has the range [{qmin}, {qmax}], not inside {dtype}'s [{low}, {high}] with quant_min <= quant_max"
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, int | float)
                              or not math.isfinite(scale) or scale <= 0):
        return f"has the scale {str(scale)[:40]}; a quantize needs a finite positive scale"
    if zero_point is not None and not (type(zero_point) is int and qmin <= zero_point <= qmax):
        return f"has the zero point {str(zero_point)[:40]}, outside its range [{qmin}, {qmax}]"
    return None


def _check_size(node: dict[str, Any], label: str, tensor_bytes: int, tensors: dict[str, Any]) -> None:
    """A `size` argument builds that many elements (`aten.full`) of its output's dtype (a byte
    each when that is not declared): the tensor limit holds for it too."""
    sizes = _literal(_arguments(node).get("size"), "as_ints")
    if not isinstance(sizes, list):
        return
    outputs = [name for output in _field(node, "outputs", list) for name in _tensor_names(output)]
    meta = tensors.get(outputs[0]) if outputs else None
    code = meta.get("dtype") if isinstance(meta, dict) else None
    itemsize = SCALAR_TYPES[code][1] if isinstance(code, int) and code in SCALAR_TYPES else 1
    elements = 1
    for size in sizes:
        if isinstance(size, int) and size > 0:
            elements *= size
        if elements * itemsize > tensor_bytes:
            raise ReadError(f"{label} builds a tensor of over {tensor_bytes} bytes (limits in .qlint.yaml)")


def _ints(values: Any) -> list[int] | None:
    """`[{"as_int": 2}, ...]` as `[2, ...]`; None when any is not a static integer."""
    if not isinstance(values, list):
        return None
    found = [v.get("as_int") if isinstance(v, dict) else None for v in values]
    return found if all(isinstance(v, int) and not isinstance(v, bool) for v in found) else None  # type: ignore[return-value]


def _check_view(what: str, meta: dict[str, Any], payload: bytes) -> None:
    """The payload holds whole elements of the config's dtype and every element its view reaches."""
    name, itemsize = scalar_type(meta.get("dtype"), what)
    sizes, strides = _ints(meta.get("sizes")), _ints(meta.get("strides"))
    offset = _literal(meta.get("storage_offset"), "as_int")
    if sizes is None or strides is None or len(sizes) != len(strides) or min([*sizes, *strides, 0]) < 0:
        raise ReadError(f"{what} has sizes or strides that are not non-negative integers of one rank")
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise ReadError(f"{what} has the storage offset {str(offset)[:20]}; torch needs a non-negative integer")
    if len(payload) % itemsize:
        raise ReadError(f"{what}: its payload of {len(payload)} bytes is not whole {name} elements")
    numel = math.prod(sizes)
    if numel == 0:
        return
    reach = offset + sum((size - 1) * stride for size, stride in zip(sizes, strides, strict=True)) + 1
    if reach * itemsize > len(payload):
        raise ReadError(f"{what}: its view {sizes} reaches element {reach - 1} of a payload of "
                        f"{len(payload) // itemsize} {name} elements")


def _lifted(spec: Any) -> tuple[str, str] | None:
    """(placeholder name, FQN) of a parameter, buffer or lifted constant input."""
    if not isinstance(spec, dict) or len(spec) != 1:
        return None
    (kind, body), = spec.items()
    key = LIFTED.get(kind)
    if key is None or not isinstance(body, dict):
        return None
    arg = body.get("arg")
    name = arg.get("name") if isinstance(arg, dict) else None
    fqn = body.get(key)
    if not isinstance(name, str) or not isinstance(fqn, str):
        raise ReadError(f"corrupt {MODEL}: a {kind} input without a name")
    return name, fqn


def _describe(meta: dict[str, Any]) -> str:
    code = meta.get("dtype")
    dtype = SCALAR_TYPES[code][0] if isinstance(code, int) and code in SCALAR_TYPES else f"dtype {code}"
    return f"{dtype} {_ints(meta.get('sizes'))}"


def _short(name: Any) -> str:
    return repr(str(name)[:80])
