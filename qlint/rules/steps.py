"""Whether one op is a step `x op c` of a constant scale island: decided here, once, for both tiers.

The static tier reads the exported graph's JSON, the full check the lowered fx graph; each gives
this module what it sees of the op through `StepGraph`, and each says a refusal its own way (the
full check with the operand's name and CortexMQuantizer's verdict, the static tier by leaving the
island to the full check). An island whose compute ops are all steps is QL001; one op that is
not makes it QL002. The static tier may not be able to compute a constant (`Operand.computed`):
its step is then undecided, never guessed.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Protocol

from qlint._compat import StrEnum
from qlint.rules.ops import OFFSET_OPS, SCALE_OPS


@dataclass(frozen=True)
class Operand:
    """What a tier knows of a constant operand."""

    numel: int
    value: float | None       # the value every element holds (inf or nan too); None: it differs by position
    computed: bool = True     # False: the tier cannot compute it, so `value` is unknown, not varying


class NotAStep(StrEnum):
    """Why an affine op is not a step of a constant scale island."""

    RUNTIME_OPERANDS = "both operands are computed at run time"
    CONSTANT_FIRST = "a constant divided by (or less) the activation"
    ALPHA = "an alpha other than 1"
    NOT_CONSTANT = "the other operand is no constant"
    DIFFERS_BY_POSITION = "an offset that differs by position"
    PER_CHANNEL = "a scale with more elements than the fold guard allows, or one per channel"
    ZERO = "a scale of zero"
    NOT_FINITE = "a constant that is not finite"


# The refusals a constant's value alone decides: the static tier, which computes the value, says
# them as the full check does (`builders.unfit_constant`); the others name what needs torch.
BY_VALUE = frozenset({NotAStep.ZERO, NotAStep.NOT_FINITE})


class StepGraph(Protocol):
    """What a tier's graph answers about an op's operands."""

    def is_runtime(self, arg: Any) -> bool:
        """The operand is computed at run time (inside the island, or from the program's inputs)."""
        ...

    def operand(self, arg: Any) -> Operand | None:
        """The constant behind an operand, or None when it is no constant."""
        ...


@dataclass(frozen=True)
class Step:
    """One `x op c`: the constant operand as the tier names it, and its value (None: undecided)."""

    constant: Hashable
    value: float | None


def scale_step(graph: StepGraph, base: str, lhs: Any, rhs: Any, alpha: Any, max_elements: int) -> Step | NotAStep:
    """Whether `lhs base rhs` (base in SCALE_OPS or OFFSET_OPS) is a step of a constant scale island.

    A scale (`div`, `mul`) must be one value, not zero, in at most `max_elements` elements (the fold
    guard: a per-channel scale is no island's, even when its channels agree); an offset (`add`,
    `sub`) must hold one value in every position. The activation comes first in `div` and `sub`.
    """
    lhs_runtime, rhs_runtime = graph.is_runtime(lhs), graph.is_runtime(rhs)
    if lhs_runtime and rhs_runtime:
        return NotAStep.RUNTIME_OPERANDS
    if base in ("div", "sub") and rhs_runtime:
        return NotAStep.CONSTANT_FIRST
    if alpha != 1:
        return NotAStep.ALPHA
    argument = rhs if lhs_runtime else lhs
    constant = graph.operand(argument)
    if constant is None:
        return NotAStep.NOT_CONSTANT
    if not constant.computed:
        if base in SCALE_OPS and constant.numel > max_elements:
            return NotAStep.PER_CHANNEL
        return Step(argument, None)
    if constant.value is None:
        return NotAStep.DIFFERS_BY_POSITION if base in OFFSET_OPS else NotAStep.PER_CHANNEL
    if base in SCALE_OPS and constant.numel > max_elements:
        return NotAStep.PER_CHANNEL
    if not math.isfinite(constant.value):
        return NotAStep.NOT_FINITE
    if base in SCALE_OPS and constant.value == 0.0:
        return NotAStep.ZERO
    return Step(argument, constant.value)
