"""A `.pt2`'s program as the static tier reads it: nodes, users and constants, from the graph JSON.

No torch, and no code from the file: the archive reader (`qlint.io.archive`) has checked the
program's shape; this turns it into nodes with their users, the lifted tensors' payloads read as
torch's loader reads them, and the one value of each constant the graph computes from literals
(`aten.full`, a mask built from ones, casts, arithmetic, through quantize/dequantize). A constant
it cannot compute is `Unknown`, with the op that computes it: never guessed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from qlint.io.archive import Pt2Archive
from qlint.io.limits import MAX_CONSTANT_BYTES
from qlint.io.wellformed import LIFTED, SCALAR_TYPES, qparams_problem
from qlint.rules.ops import NOT_A_CHAIN, SHAPE_OPS
from qlint.rules.qparams import EXHAUSTIVE_DTYPES, QParams
from qlint.settings.config import ConstantKind
from qlint.static.float32 import binary, dequantize, f32, quantize

DQ = "quantized_decomposed.dequantize_per_tensor.default"
Q = "quantized_decomposed.quantize_per_tensor.default"
# A chain of one tensor in, one out (the walk of an island before lowering): no join, fork or cast.
CHAIN_SHAPE_OPS = SHAPE_OPS - NOT_A_CHAIN
_FLOAT_DTYPES = {"float16", "float32", "float64"}


@dataclass(frozen=True)
class Ref:
    """An argument that is another node's output."""

    name: str


@dataclass(eq=False)
class StaticNode:
    name: str
    op: str                     # "aten.div.Tensor"
    args: list[Any]
    kwargs: dict[str, Any]
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    stack_trace: str | None = None
    outputs: list[str] = field(default_factory=list)   # its output tensors' names (several: split)
    users: list[StaticNode] = field(default_factory=list)

    @property
    def base(self) -> str:
        """`div` for `aten.div.Tensor`."""
        parts = self.op.split(".")
        return parts[1] if len(parts) > 1 else self.op

    @property
    def numel(self) -> int:
        return math.prod(self.shape) if self.shape is not None else 0

    @property
    def refs(self) -> list[str]:
        """Every tensor it reads, in lists (`cat`) and keyword arguments too."""
        found = []
        for arg in [*self.args, *self.kwargs.values()]:
            for item in arg if isinstance(arg, list) else [arg]:
                if isinstance(item, Ref):
                    found.append(item.name)
        return found


@dataclass(frozen=True)
class Uniform:
    """A constant every position of which holds one value."""

    value: float
    dtype: str


@dataclass(frozen=True)
class Unknown:
    """A constant the static tier cannot compute, and why: the finding names what the full check evaluates."""

    why: str   # "is computed in the graph with aten.index.Tensor from parameter ..."


@dataclass(frozen=True)
class StaticConstant:
    name: str
    kind: ConstantKind
    numel: int
    value: Uniform | Unknown | None   # None: it differs by position (its elements were read)


class StaticGraph:
    """The program of a checked `.pt2` as nodes, constants and users: no torch, no code from it."""

    def __init__(self, archive: Pt2Archive) -> None:
        graph = archive.program["graph_module"]["graph"]
        tensors = graph.get("tensor_values") or {}
        self.nodes: dict[str, StaticNode] = {}
        self.order: list[StaticNode] = []
        self.placeholders: dict[str, tuple[ConstantKind, str] | None] = {}
        signature = archive.program["graph_module"].get("signature") or {}
        for spec in signature.get("input_specs") or []:
            self._placeholder(spec)
        for raw in graph["nodes"]:
            node = self._node(raw, tensors)
            if node is not None:
                for name in (node.name, *node.outputs):  # a tensor is read by its own name
                    self.nodes.setdefault(name, node)
                self.order.append(node)
        for node in self.order:
            if node.base.startswith("_assert"):
                continue  # an assertion computes nothing: lowering drops it
            for name in node.refs:
                producer = self.nodes.get(name)
                # A node's reads are added together: the last user is the only one it can repeat.
                if producer is not None and (not producer.users or producer.users[-1] is not node):
                    producer.users.append(node)
        self.payloads = _payloads(archive)
        self.tensors = tensors
        self._uniform: dict[str, Uniform | Unknown | None] = {}
        self.island_ends: dict[StaticNode, StaticNode | None] = {}   # `_island_end`'s answers
        # One pass in graph order, no recursion (a crafted graph may be deep or cyclic): a node is
        # runtime when an operand is a program input, a runtime node, or not defined before it.
        self.runtime: set[str] = {name for name, spec in self.placeholders.items() if spec is None}
        self.values: dict[str, Uniform | Unknown] = {}
        defined = set(self.placeholders)
        for node in self.order:
            if any(r in self.runtime or r not in defined for r in node.refs):
                self.runtime.update((node.name, *node.outputs))
            else:
                self.values[node.name] = self._compute(node)
            defined.update((node.name, *node.outputs))

    def _placeholder(self, spec: Any) -> None:
        if not isinstance(spec, dict) or len(spec) != 1:
            return
        (kind, body), = spec.items()
        arg = body.get("arg") if isinstance(body, dict) else None
        name = arg.get("name") if isinstance(arg, dict) else None
        if not isinstance(name, str):
            if isinstance(arg, dict) and isinstance(arg.get("as_tensor"), dict):
                name = arg["as_tensor"].get("name")
            if not isinstance(name, str):
                return
        if kind in LIFTED:
            constant_kind = {"parameter": ConstantKind.PARAMETER, "buffer": ConstantKind.BUFFER,
                             "tensor_constant": ConstantKind.CONSTANT}[kind]
            self.placeholders[name] = (constant_kind, str(body.get(LIFTED[kind])))
        else:
            self.placeholders[name] = None  # a runtime input

    @staticmethod
    def _node(raw: Any, tensors: dict[str, Any]) -> StaticNode | None:
        outputs = raw.get("outputs") or []
        first = outputs[0] if outputs and isinstance(outputs[0], dict) else {}
        out = first.get("as_tensor") if isinstance(first.get("as_tensor"), dict) else None
        name = raw.get("name") if isinstance(raw.get("name"), str) else (out or {}).get("name")
        if not isinstance(name, str):
            return None
        op = str(raw.get("target", "")).removeprefix("torch.ops.")
        args, kwargs = [], {}
        for item in raw.get("inputs") or []:
            value = _argument(item.get("arg")) if isinstance(item, dict) else None
            if isinstance(item, dict) and item.get("kind") == 2:
                kwargs[str(item.get("name"))] = value
            else:
                args.append(value)
        meta = tensors.get(out["name"]) if out is not None else None
        metadata = raw.get("metadata") or {}
        names = [o["as_tensor"]["name"] for o in outputs
                 if isinstance(o, dict) and isinstance(o.get("as_tensor"), dict)]
        for o in outputs:
            listed = o.get("as_tensors") if isinstance(o, dict) else None
            names += [t["name"] for t in listed or [] if isinstance(t, dict) and isinstance(t.get("name"), str)]
        return StaticNode(name, op, args, kwargs, _shape(meta), _dtype(meta),
                          metadata.get("stack_trace") if isinstance(metadata.get("stack_trace"), str) else None,
                          [n for n in names if isinstance(n, str)])

    # -- constants ------------------------------------------------------------------------

    def is_runtime(self, arg: Any) -> bool:
        """An operand computed from the program's inputs (or one the graph never defines)."""
        return isinstance(arg, Ref) and (arg.name in self.runtime or arg.name not in self.nodes
                                         and arg.name not in self.placeholders)

    def constant(self, arg: Any) -> StaticConstant | None:
        """The constant behind an operand: a literal, a lifted tensor, or one computed from those."""
        if isinstance(arg, (int, float)) and not isinstance(arg, bool):
            return StaticConstant(repr(arg), ConstantKind.LITERAL, 1, Uniform(float(arg), "float64"))
        if not isinstance(arg, Ref) or self.is_runtime(arg):
            return None
        if arg.name in self.placeholders:
            kind, fqn = self.placeholders[arg.name]  # type: ignore[misc]
            meta = self.tensors.get(arg.name)
            return StaticConstant(fqn, kind, math.prod(_shape(meta) or ()), self._lifted(fqn))
        node = self.nodes[arg.name]
        return StaticConstant(node.name, ConstantKind.COMPUTED, node.numel, self.value(node))

    def _lifted(self, fqn: str) -> Uniform | Unknown | None:
        """A lifted tensor's one value, read once per tensor."""
        if fqn not in self._uniform:
            self._uniform[fqn] = self._read_uniform(fqn)
        return self._uniform[fqn]

    def _read_uniform(self, fqn: str) -> Uniform | Unknown | None:
        """Read as torch's loader reads it: the payload in the config's dtype, viewed with the
        config's sizes, strides and storage offset (`qlint.io.wellformed` checked they fit)."""
        import numpy as np

        payload, meta = self.payloads.get(fqn, (None, {}))
        name = _dtype(meta) or ""
        try:
            dtype = np.dtype(name).newbyteorder("<") if name else None
        except TypeError:
            dtype = None  # bfloat16, float8: numpy has no such dtype
        unread = Unknown("is held in a payload or view the static tier does not read (over 16 MiB or of a "
                         "dtype it does not decode)")
        if payload is None or dtype is None or len(payload) > MAX_CONSTANT_BYTES:
            return unread
        sizes = [_int(v) for v in meta["sizes"]]
        if math.prod(sizes) == 0:
            return None
        # A stride-0 dimension repeats what it holds (an expanded view): one copy decides, and the
        # elements compared stay within the bound however large the view declares itself.
        kept = [(size, _int(stride)) for size, stride in zip(sizes, meta["strides"], strict=True) if _int(stride)]
        if math.prod(size for size, _ in kept) * dtype.itemsize > MAX_CONSTANT_BYTES:
            return unread
        flat = np.frombuffer(payload, dtype=dtype)[_int(meta["storage_offset"]):]
        values = np.lib.stride_tricks.as_strided(
            flat, shape=[size for size, _ in kept], strides=[stride * dtype.itemsize for _, stride in kept]).ravel()
        first = values[0]
        if values.size == 1:  # one element is one value, NaN too (the full check reads it so)
            return Uniform(float(first), name)
        return Uniform(float(first), name) if bool((values == first).all()) else None   # NaN != NaN: varies

    def value(self, node: StaticNode) -> Uniform | Unknown | None:
        """The one value a node computed from constants holds, from its literal arguments."""
        return self.values.get(node.name)

    def operand(self, arg: Any) -> Uniform | None:
        """A constant operand's one value; None when it differs by position or is not known."""
        constant = self.constant(arg)
        return constant.value if constant is not None and isinstance(constant.value, Uniform) else None

    def _compute(self, node: StaticNode) -> Uniform | Unknown:
        """A constant node's one value, or why the tier does not know it: the first op on its path
        it cannot compute, which an op computing on that result passes on."""
        value = _evaluate(self, node)
        if value is not None:
            return value
        inputs = [self.constant(Ref(name)) for name in node.refs]
        passed = next((c.value for c in inputs if c is not None and isinstance(c.value, Unknown)), None)
        if passed is not None:
            return passed
        sources = " and ".join(self._source(name) for name in dict.fromkeys(node.refs))
        varying = any(c is not None and c.value is None for c in inputs)
        why = ", of which one differs by position" if varying else ", an op the static tier does not evaluate"
        return Unknown(f"is computed in the graph with {node.op}" + (f" from {sources}" if sources else "") + why)

    def _source(self, name: str) -> str:
        """A constant input as a finding names it: `parameter attention_biases`, or the op computing it."""
        spec = self.placeholders.get(name)
        return f"{spec[0]} {spec[1]}" if spec is not None else self.nodes[name].op


def _argument(arg: Any) -> Any:
    """A serialized argument as a Python value (tensors as Ref)."""
    if not isinstance(arg, dict) or len(arg) != 1:
        return None
    (kind, value), = arg.items()
    if kind == "as_tensor" and isinstance(value, dict):
        return Ref(str(value.get("name")))
    if kind == "as_tensors" and isinstance(value, list):
        return [Ref(str(v.get("name"))) for v in value if isinstance(v, dict)]
    # `x[:, idx]` reads idx through optional tensors: a tensor read there is an operand like any other.
    if kind == "as_optional_tensors" and isinstance(value, list):
        return [_optional_tensor(v) for v in value]
    if kind == "as_optional_tensor":
        return _optional_tensor(value)
    if kind in ("as_float", "as_int", "as_bool", "as_string", "as_ints", "as_floats", "as_bools"):
        return value
    if kind == "as_scalar_type":
        return ("dtype", value)
    return None


def _optional_tensor(arg: Any) -> Ref | None:
    """`{"as_tensor": ...}` as a Ref, `{"as_none": true}` (or anything else) as None."""
    tensor = arg.get("as_tensor") if isinstance(arg, dict) else None
    return Ref(str(tensor.get("name"))) if isinstance(tensor, dict) else None


def _shape(meta: Any) -> tuple[int, ...] | None:
    sizes = meta.get("sizes") if isinstance(meta, dict) else None
    if not isinstance(sizes, list):
        return None
    return tuple(_int(s) for s in sizes)


def _int(value: Any) -> int:
    found = value.get("as_int") if isinstance(value, dict) else value
    return found if isinstance(found, int) and not isinstance(found, bool) else 0


def _dtype(meta: Any) -> str | None:
    code = meta.get("dtype") if isinstance(meta, dict) else None
    return SCALAR_TYPES[code][0] if isinstance(code, int) and code in SCALAR_TYPES else None


def _payloads(archive: Pt2Archive) -> dict[str, tuple[bytes, dict[str, Any]]]:
    """FQN -> raw bytes and tensor_meta of every weight and constant, as the archive reader checked them."""
    found: dict[str, tuple[bytes, dict[str, Any]]] = {}
    for kind, config in archive.configs.items():
        for fqn, payload in config.items():
            found[fqn] = (archive.entries[f"data/{kind}/{payload['path_name']}"], payload["tensor_meta"])
    return found


# -- constants computed in the graph ---------------------------------------------------------

_FILL = {"full": 1, "full_like": 1, "new_full": 1, "scalar_tensor": 0}
_ONE_ZERO = {"ones": 1.0, "ones_like": 1.0, "new_ones": 1.0, "zeros": 0.0, "zeros_like": 0.0, "new_zeros": 0.0}
CASTS = {"_to_copy", "to", "type_as", "clone", "lift_fresh_copy", "alias", "detach"}
# Ops that pick elements of their first operand by indices: a tensor of one value gives that value
# (a bias timm initializes to zero, gathered by `aten.index`); any other is not known.
_GATHERS = {"index", "index_select", "gather", "embedding", "take"}


def _cast(value: float, dtype: str | None) -> float:
    if dtype in ("float32", None):
        return f32(value)
    if dtype in _FLOAT_DTYPES:
        return value
    if dtype == "bool":
        return float(bool(value))
    return float(int(value)) if math.isfinite(value) else value


def _evaluate(graph: StaticGraph, node: StaticNode) -> Uniform | None:
    """A uniform constant's value, for the producers and elementwise ops a mask or a filled
    scale is made of; None for anything else (then it is not known to be one value)."""
    base, dtype = node.base, node.dtype
    args = node.args
    if base in _FILL and len(args) > _FILL[base] and isinstance(args[_FILL[base]], (int, float)):
        return Uniform(_cast(float(args[_FILL[base]]), dtype), dtype or "float32")
    if base in _ONE_ZERO:
        return Uniform(_ONE_ZERO[base], dtype or "float32")
    if base in CHAIN_SHAPE_OPS | CASTS | _GATHERS and args:
        source = graph.operand(args[0])
        return Uniform(_cast(source.value, dtype), dtype or source.dtype) if source is not None else None
    if base in ("add", "sub", "mul", "div", "rsub") and len(args) >= 2:
        a, b = graph.operand(args[0]), graph.operand(args[1])
        if a is None or b is None or node.kwargs.get("alpha", 1) != 1 or (base == "div" and node.kwargs):
            return None
        if dtype == "float32":
            return Uniform(binary(base, a.value, b.value), dtype)
        result = {"add": a.value + b.value, "sub": a.value - b.value, "mul": a.value * b.value,
                  "rsub": b.value - a.value}.get(base)
        if result is None:
            result = a.value / b.value if b.value else math.nan
        return Uniform(_cast(result, dtype), dtype or "float32")
    if base == "neg" and args:
        source = graph.operand(args[0])
        return Uniform(-source.value, source.dtype) if source is not None else None
    if node.op in (DQ, Q) and args:
        source = graph.operand(args[0])
        qp = qparams(node)
        if source is None or qp is None:
            return None
        if node.op == Q:
            return Uniform(float(quantize(source.value, qp)), qp.dtype)
        return Uniform(dequantize(int(source.value), qp), "float32")
    return None


def qparams(node: StaticNode) -> QParams | None:
    """The literal qparams of a per-tensor quantize or dequantize node."""
    args = node.args[1:6]
    if len(args) != 5:
        return None
    scale, zero_point, qmin, qmax, dtype = args
    code = dtype[1] if isinstance(dtype, tuple) else None
    name = SCALAR_TYPES[code][0] if isinstance(code, int) and code in SCALAR_TYPES else ""
    if name not in EXHAUSTIVE_DTYPES or None in (scale, zero_point) or \
            qparams_problem(scale, zero_point, qmin, qmax, name):
        return None
    return QParams(float(scale), zero_point, qmin, qmax, name)
