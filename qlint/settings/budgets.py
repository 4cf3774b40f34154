"""Memory, fp32 and time budgets: what `.qlint.yaml` allows an artifact or target, and where each limit
came from.

A budget is a set of limits (`sram`, `flash`, `fp32_elements`, `fp32_islands`, `cycles`,
`fp32_cycles`, `latency`, a minimum `coverage`) and of `growth` limits against a base run's metrics.
The config gives a default, per file globs and per target; each level overrides the limits it
names, and a `board:` gives `sram` and `flash` from the board table (`qlint.settings.boards`) or the
config's own `boards:`. Every resolved limit keeps its origin (`budgets in .qlint.yaml:3`, `board
nucleo-f446re`), which QL009 names, so a user sees which line to change.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import NamedTuple

from qlint.settings.boards import Board, builtin_boards
from qlint.settings.sizes import show_size

SIZE_KEYS = ("sram", "flash")
COUNT_KEYS = ("fp32_elements", "fp32_islands", "cycles", "fp32_cycles")
TIME_KEYS = ("latency",)   # milliseconds at the board's clock (`50ms`)
GROWTH_KEYS = (*SIZE_KEYS, *COUNT_KEYS, *TIME_KEYS, "coverage")
# A share or a growth: plain ASCII decimals, as sizes and counts are (`qlint.settings.sizes`).
_DECIMAL = r"([0-9]{1,12}(?:\.[0-9]{1,12})?)"
_SHARE = re.compile(rf"^\s*{_DECIMAL}\s*(%?)\s*$", re.ASCII)


def parse_percent(text: str) -> float:
    """A fraction from `90%` or `0.9`."""
    match = _SHARE.match(text)
    if match is None:
        raise ValueError(f"{text[:40]!r} is not a share: write 90% or 0.9")
    value = float(match.group(1)) / (100 if match.group(2) else 1)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"a share must be between 0 and 1 (0% and 100%), got {value:g}")
    return value


def parse_percentage(text: str) -> float:
    """The number of `5%` (or of `5`, as coverage's growth in percentage points gives it), below 1e9."""
    match = _SHARE.match(text)
    if match is None or float(match.group(1)) >= 1e9:
        raise ValueError(f"expected a growth like 5% or 0, got {text[:40]!r}")
    return float(match.group(1))


@dataclass(frozen=True)
class Growth:
    """How much a figure may grow against the base run: `percent` of the base, or `amount` in its unit
    (for `coverage`, a drop in percentage points)."""

    amount: float
    percent: bool

    def allowed(self, base: float) -> float:
        return base * self.amount / 100 if self.percent else self.amount

    def __str__(self) -> str:
        return f"{self.amount:g}%" if self.percent else f"{self.amount:g}"


class Limit(NamedTuple):
    """One resolved limit and the config spot it came from."""

    value: float
    origin: str


@dataclass(frozen=True)
class Budget:
    """The limits one config level sets (a key it does not name is not set here), and the board it names."""

    origin: str
    limits: dict[str, float] = field(default_factory=dict)
    board: str | None = None
    growth: dict[str, Growth] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.limits and self.board is None and not self.growth


@dataclass(frozen=True)
class Resolved:
    """What one artifact or target is held to: each limit with its origin, and the growth limits."""

    limits: dict[str, Limit] = field(default_factory=dict)
    growth: dict[str, tuple[Growth, str]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.limits and not self.growth


@dataclass(frozen=True)
class Budgets:
    """The config's budgets: a default, per file globs in order, and the user's own boards."""

    default: Budget | None = None
    per_file: tuple[tuple[str, Budget], ...] = ()
    boards: dict[str, Board] = field(default_factory=dict)

    @property
    def any(self) -> bool:
        return self.default is not None or bool(self.per_file)

    def board(self, name: str) -> Board | None:
        return self.boards.get(name) or builtin_boards().get(name)

    def resolve(self, artifact: str, own: Budget | None = None) -> Resolved:
        """The limits of `artifact` (a path as reports show it, or `target:NAME`): the default, then each
        matching per-file glob, then the target's own budget, each overriding what it names."""
        levels = [self.default] if self.default is not None else []
        levels += [budget for pattern, budget in self.per_file if fnmatch.fnmatch(artifact, pattern)]
        levels += [own] if own is not None else []
        limits: dict[str, Limit] = {}
        growth: dict[str, tuple[Growth, str]] = {}
        for level in levels:
            board = self.board(level.board) if level.board else None
            if board is not None:
                for key in SIZE_KEYS:
                    if key not in level.limits:
                        limits[key] = Limit(getattr(board, key), f"board {board.name} ({level.origin})")
            limits.update({key: Limit(value, level.origin) for key, value in level.limits.items()})
            growth.update({key: (g, level.origin) for key, g in level.growth.items()})
        return Resolved(limits, growth)


def show(key: str, value: float) -> str:
    """A budgeted figure as reports show it: sizes in bytes and KiB/MiB, coverage in %, counts."""
    if key in ("sram", "flash"):
        return show_size(int(value))
    if key == "coverage":
        return f"{100 * value:.1f}%"
    if key in TIME_KEYS:
        return f"{value:.3g} ms"
    return f"{int(value):,}"
