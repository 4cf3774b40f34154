"""QL001 and QL004 said once: a finding's message and details from facts either tier establishes.

The static tier (graph JSON, emulated float32) and the full check (lowered graph, torch) find the
same islands in different ways; what they print about one is built here, so the two cannot drift
(`tests/full/test_static.py` holds them to equal findings on every program of the suite).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from qlint.rules.ops import OFFSET_OPS, SCALE_OPS, SYMBOLS
from qlint.rules.qparams import QParams

# What the static tier says where only the full check can decide.
RUN_FULL = "run `qlint check` without --static for the verdict"


@dataclass(frozen=True)
class Term:
    """One `x op c` of a constant scale island, as a finding shows it."""

    op: str          # div, mul, add, sub
    name: str        # the constant's FQN, node name or literal
    kind: str        # a ConstantKind
    numel: int
    value: float | None   # the one value all its elements hold; None: it differs, or the tier cannot compute it

    def __str__(self) -> str:
        """`scale=0.125 (buffer, all 4 elements)`; a constant of no one known value by name and size."""
        if self.value is None:
            return f"{self.name} ({self.kind})" if self.numel == 1 else \
                f"{self.name} ({self.kind}, {self.numel} elements)"
        shown = f"{self.name}={self.value:.6g}"
        return f"{shown} ({self.kind})" if self.numel == 1 else f"{shown} ({self.kind}, all {self.numel} elements)"


class Affine(Protocol):
    """An `x op c` as either tier holds it: its op and the constant's one value (None: unknown)."""

    @property
    def op(self) -> str: ...

    @property
    def value(self) -> float | None: ...


def time_clause(cycles: int, share: float, latency_ms: float | None, measured: bool) -> str:
    """`est. 3,232 cycles (0.0202 ms), 20.1% of the artifact's time`: what an island costs, as its
    message ends and as the text report sums a group of islands (`measured` when a profile measured
    them; milliseconds when a board's clock is set). The static tier prices nothing: its messages
    end before this."""
    at_clock = f" ({latency_ms:.3g} ms)" if latency_ms is not None else ""
    return f"{'measured' if measured else 'est.'} {cycles:,} cycles{at_clock}, {share:.1%} of the artifact's time"


def time_clause_of(details: Mapping[str, Any]) -> str:
    """The time clause of one priced finding, from its details (`cycles`, `time_share`, ...)."""
    latency = details.get("latency_ms")
    return time_clause(int(details["cycles"]), float(details["time_share"]),
                       None if latency is None else float(latency), bool(details.get("cycles_measured")))


def factor(terms: Sequence[Affine]) -> float | None:
    """What the island multiplies its input by (its offsets aside); None while a scale is unknown."""
    result = 1.0
    for term in terms:
        if term.op in SCALE_OPS:
            if term.value is None:
                return None
            result = result / term.value if term.op == "div" else result * term.value
    return result


def constant_scale(
    ops: Sequence[str], terms: Sequence[Term], qp_in: QParams, qp_out: QParams, identity: bool | None,
    blocked: Sequence[str], fp32_elements: int, graph_nodes: dict[str, int], undecided: str | None = None,
) -> tuple[str, dict[str, Any]]:
    """QL001's message and details. `identity` None: a constant is not known (`undecided` says which)."""
    if identity is None:
        verdict = f"identity undecided: {undecided}: {RUN_FULL}"
    else:
        verdict = f"{'already an exact' if identity else 'not an'} identity on {qp_in.dtype} values"
    scale = " ".join(f"{SYMBOLS[t.op]} {t}" for t in terms)
    message = f"constant scale in fp32: x {scale} between dequantize {qp_in} and quantize {qp_out}; {verdict}"
    if blocked:
        message += f"; fold blocked by {'; '.join(blocked)}"
    details: dict[str, Any] = {
        "ops": list(ops),
        "constants": [{"name": t.name, "kind": t.kind, "value": t.value, "op": t.op} for t in terms],
        "factor": factor(terms),
        "input_qparams": qp_in.to_dict(),
        "output_qparams": qp_out.to_dict(),
        "identity": identity,
        "blocked_by": list(blocked),
        "fp32_elements": fp32_elements,
        "graph_nodes": graph_nodes,
    }
    if undecided is not None:
        details["undecided"] = undecided
    return message, details


def fp32_island(ops: Sequence[str], fp32_elements: int, reason: str) -> str:
    """QL002's message: the island's ops, the fp32 elements it makes per inference, why it is fp32."""
    return f"fp32 island ({', '.join(ops)}), {fp32_elements} fp32 elements per inference: {reason}"


def unfit_constant(op: str, name: str) -> str:
    """Why a step's constant keeps its island in fp32 by its value alone, which either tier knows:
    a scale of zero or one not finite, an offset not finite (`rules.steps.BY_VALUE`)."""
    return f"constant {name} is not finite" if op in OFFSET_OPS else f"constant {name} is zero or not finite"


def requantize(
    qp_in: QParams, qp_out: QParams, identity: bool, graph_nodes: dict[str, int]
) -> tuple[str, dict[str, Any]]:
    """QL004's message and details: a dequantize feeding a quantize, with nothing computed between."""
    kind = "an identity" if identity else "a rescale"
    message = f"dequantize -> quantize with nothing between ({kind} done in fp32): {qp_in} -> {qp_out}"
    return message, {"identity": identity, "input_qparams": qp_in.to_dict(), "output_qparams": qp_out.to_dict(),
                     "graph_nodes": graph_nodes}
