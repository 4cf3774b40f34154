"""Why the NPU does not run an op: the conditions of ExecuTorch's TOSA support checks that failed
for its node, on its target, in a user's words.

Each `Rejection` names the check that gave it (`loading.ethos_u` runs every check of the
partitioner's chain on every node and keeps every reason). A check whose own sentence says what
failed is quoted; the few whose sentence does not say it in a user's terms get one derived from the
node and the TOSA specification: whether its operands are float on an integer-only profile, which
input is int64, which ops the U55 has no operator for. "Not included in BaseTOSASupportList" only
says no check accepted the node: it is replaced by what the node is.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from torch.fx import Node

from qlint.loading.ethos_u import GENERIC_REASON, RAISED, Delegation, Rejection
from qlint.loading.view import base_name, is_float, op_name, output_dtype

Derive = Callable[[Node, Rejection, Delegation], str]


def _dtype_name(node: Node) -> str:
    dtype = output_dtype(node)
    return str(dtype).removeprefix("torch.") if dtype is not None else "untyped"


def _family(delegation: Delegation) -> str:
    """`U55` from `ethos-u55-128`."""
    return delegation.npu.removeprefix("ethos-").split("-")[0].upper()


def _integer_only(delegation: Delegation) -> bool:
    """TOSA specifications name their profiles: `+INT` alone has no floating point."""
    return "+FP" not in delegation.tosa_spec


def _not_quantized(node: Node, rejection: Rejection, delegation: Delegation) -> str:
    if is_float(node):
        return f"left in float by the quantizer: no int8 annotation for {op_name(node)}"
    return f"not quantized for the NPU: {rejection.reason.rstrip('.')}"


def _not_on_u55(node: Node, rejection: Rejection, delegation: Delegation) -> str:
    return f"`{base_name(op_name(node))}`: no {_family(delegation)} operator"


def _operand_dtypes(node: Node, rejection: Rejection, delegation: Delegation) -> str:
    floats = sorted({_dtype_name(a) for a in node.all_input_nodes if is_float(a)})
    if floats and _integer_only(delegation):
        return (f"`{base_name(op_name(node))}` with {'/'.join(floats)} operands: "
                f"{_family(delegation)}'s TOSA profile is integer-only")
    return f"`{base_name(op_name(node))}`: {rejection.reason.rstrip('.')}"


def _input_dtype(wanted: str) -> Derive:
    """A check that refuses an input (or output) of one dtype: which input, by name."""

    def derive(node: Node, rejection: Rejection, delegation: Delegation) -> str:
        named = [a.name for a in node.all_input_nodes if _dtype_name(a) == wanted]
        if named:
            return f"an {wanted} input ({', '.join(named)})"
        if _dtype_name(node) == wanted:
            return f"an {wanted} output"
        return rejection.reason.rstrip(".")

    return derive


def _other_dtype(node: Node, rejection: Rejection, delegation: Delegation) -> str:
    """`CheckDtypeInputsAndOutputs`: an input or output dtype the specification does not take."""
    profile = "integer-only " if _integer_only(delegation) else ""
    for arg in sorted(node.all_input_nodes, key=lambda a: -len(a.name)):  # `x_1` before `x`
        if re.search(rf"(?<![\w.]){re.escape(arg.name)}(?![\w])", rejection.reason):
            return (f"a {_dtype_name(arg)} input ({arg.name}) that {_family(delegation)}'s {profile}TOSA profile "
                    "does not take")
    return f"{rejection.reason.rstrip('.')} ({delegation.tosa_spec})"


# By the check class that refused; a check not listed is quoted as it reports.
DERIVED: dict[str, Derive] = {
    "CheckArmQuantized": _not_quantized,
    "CheckProperQuantization": _not_quantized,
    "EthosU55NotSupported": _not_on_u55,
    "WhereSupported": _operand_dtypes,
    "CheckInt64InputsAndOutputs": _input_dtype("int64"),
    "CheckFloat64InputsAndOutputs": _input_dtype("float64"),
    "CheckDtypeInputsAndOutputs": _other_dtype,
}


def causes(node: Node, delegation: Delegation) -> list[str]:
    """Every reason ExecuTorch's checks give for `node`, derived, each once, the quantizer's first."""
    rejections = delegation.rejections.get(node.name, ())
    said: list[str] = []
    for rejection in sorted(rejections, key=lambda r: r.check not in ("CheckArmQuantized", "CheckProperQuantization")):
        if rejection.reason == GENERIC_REASON or rejection.reason.startswith(RAISED):
            continue  # a check run on a node its chain would not give it may raise: `details.reasons` keeps it
        derive = DERIVED.get(rejection.check)
        if not rejection.reason.strip():  # a check that refused without saying why: its name is all there is
            sentence = f"refused by ExecuTorch's {rejection.check}"
        else:
            sentence = derive(node, rejection, delegation) if derive else rejection.reason.rstrip(".")
        if sentence not in said:
            said.append(sentence)
    if not said and any(r.reason == GENERIC_REASON for r in rejections):
        said.append(f"ExecuTorch's Arm backend has no TOSA lowering for {op_name(node)} on {delegation.tosa_spec}")
    return said
