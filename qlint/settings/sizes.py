"""Sizes in bytes as `.qlint.yaml` writes them (`64KiB`, `1.5 MiB`, `65536`) and as qlint shows them;
clocks (`120MHz`) and durations (`50ms`) the same way.

Binary units only: vendors use `KB` and `MB` for both 1000 and 1024, so the config refuses them.
"""

from __future__ import annotations

import re
from fractions import Fraction

KIB = 1024
MIB = 1024 * KIB
# The largest size or count a config or metrics file may give: budgets and figures are compared as
# floats, which hold every whole number up to 2**53 (8 PiB, far past any device) and no further.
MAX_AMOUNT = 1 << 53
# ASCII digits only, for sizes and counts alike (`\d` would take `１２`, Python's int() too).
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]{1,20})?)\s*(B|KiB|MiB|GiB)?\s*$", re.ASCII)
_COUNT = re.compile(r"^\s*([0-9]+)\s*$", re.ASCII)
_UNITS = {None: 1, "B": 1, "KiB": KIB, "MiB": MIB, "GiB": 1024 * MIB}
_CLOCK = re.compile(r"^\s*([0-9]+(?:\.[0-9]{1,20})?)\s*(Hz|kHz|MHz|GHz)\s*$", re.ASCII)
_CLOCK_UNITS = {"Hz": 1, "kHz": 1000, "MHz": 1000_000, "GHz": 1000_000_000}
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]{1,20})?)\s*(us|ms|s)\s*$", re.ASCII)
_DURATION_NS = {"us": 1000, "ms": 1000_000, "s": 1000_000_000}


def _bounded(digits: str, scale: int, text: str, what: str) -> int:
    """`digits` times `scale`, exactly, when it is a whole number no larger than `MAX_AMOUNT`."""
    whole = digits.partition(".")[0]
    amount = Fraction(digits) * scale if len(whole) <= 20 else Fraction(MAX_AMOUNT + 1)  # 20 digits: past 2**53
    if amount.denominator != 1:
        raise ValueError(f"{text[:40]!r} is not a whole number of {what}")
    if amount > MAX_AMOUNT:
        raise ValueError(f"{text[:40]!r} is over the largest amount qlint compares exactly, 2**53 {what}")
    return int(amount)


def parse_size(text: str) -> int:
    """Bytes from `65536`, `64KiB`, `1.5 MiB` or `512B`. Raises ValueError naming what is accepted:
    `KB`/`MB` are refused, because vendors use them for both 1000 and 1024."""
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"{text[:40]!r} is not a size: write bytes, or a number with B, KiB, MiB or GiB "
                         "(KB and MB are ambiguous)")
    return _bounded(match.group(1), _UNITS[match.group(2)], text, "bytes")


def parse_clock(text: str) -> int:
    """Hertz from `120MHz`, `32 MHz`, `1.2GHz` (a unit is required: a bare number could be either)."""
    match = _CLOCK.match(text)
    if match is None:
        raise ValueError(f"{text[:40]!r} is not a clock: write a number with Hz, kHz, MHz or GHz (120MHz)")
    hertz = _bounded(match.group(1), _CLOCK_UNITS[match.group(2)], text, "Hz")
    if hertz == 0:
        raise ValueError(f"{text[:40]!r}: a clock must be above 0 Hz")
    return hertz


def parse_duration_ms(text: str) -> float:
    """Milliseconds from `50ms`, `1.5 s` or `800us` (whole nanoseconds, at most 2**53 of them)."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{text[:40]!r} is not a duration: write a number with us, ms or s (50ms)")
    return _bounded(match.group(1), _DURATION_NS[match.group(2)], text, "ns") / 1e6


def show_clock(hertz: int) -> str:
    return f"{hertz / 1e6:g} MHz"


def parse_count(text: str, what: str) -> int:
    """A whole number of `what` (`fp32 elements`), in ASCII digits, at most `MAX_AMOUNT`."""
    match = _COUNT.match(text)
    if match is None:
        raise ValueError(f"expected a whole number of {what}, got {text[:40]!r}")
    return _bounded(match.group(1), 1, text, what)


def show_size(size: int) -> str:
    """`32 KiB (32,768 B)`, or `64,000 B` when the size is no whole number of KiB."""
    for unit, scale in (("MiB", MIB), ("KiB", KIB)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit} ({size:,} B)"
    return f"{size:,} B"
