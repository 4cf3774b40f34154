"""The fold guards of a config against one region: the one place they are checked (both tiers)."""

from __future__ import annotations

from collections.abc import Iterable

from qlint.rules.qparams import QParams
from qlint.settings.config import ConstantKind, FoldGuards


def blocked_guards(
    guards: FoldGuards, qp_in: QParams | None, kinds: Iterable[ConstantKind], qp_out: QParams | None = None
) -> list[str]:
    """The fold guards that forbid folding a region: the one place guards are checked.

    `qp_out` is given for a constant scale, whose fold keeps the input's clamp range.
    """
    blocked = []
    if qp_in is not None and qp_in.dtype not in guards.dtypes:
        blocked.append(f"fold.dtypes: {qp_in.dtype} not in [{', '.join(guards.dtypes)}]")
    disallowed = sorted(set(kinds) - set(guards.constant_kinds))
    if disallowed:
        blocked.append(f"fold.constant_kinds: {', '.join(disallowed)} not in [{', '.join(guards.constant_kinds)}]")
    a, b = qp_in, qp_out
    if guards.require_equal_qrange and a is not None and b is not None and (a.dtype, a.qmin, a.qmax) != (
        b.dtype, b.qmin, b.qmax
    ):
        blocked.append(
            f"fold.require_equal_qrange: {a.dtype}[{a.qmin}, {a.qmax}] in, {b.dtype}[{b.qmin}, {b.qmax}] out"
        )
    return blocked
