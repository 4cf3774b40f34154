"""Sizes in bytes as `.qlint.yaml` writes them (`64KiB`, `1.5 MiB`, `65536`) and as qlint shows them.

Binary units only: vendors use `KB` and `MB` for both 1000 and 1024, so the config refuses them.
"""

from __future__ import annotations

import re

KIB = 1024
MIB = 1024 * KIB
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB)?\s*$")
_UNITS = {None: 1, "B": 1, "KiB": KIB, "MiB": MIB, "GiB": 1024 * MIB}


def parse_size(text: str | int) -> int:
    """Bytes from `65536`, `64KiB`, `1.5 MiB` or `512B`. Raises ValueError naming what is accepted:
    `KB`/`MB` are refused, because vendors use them for both 1000 and 1024."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"a size cannot be negative: {text}")
        return text
    match = _SIZE.match(str(text))
    if match is None:
        raise ValueError(f"{str(text)[:40]!r} is not a size: write bytes, or a number with B, KiB, MiB or GiB "
                         "(KB and MB are ambiguous)")
    value = float(match.group(1)) * _UNITS[match.group(2)]
    if value != int(value):
        raise ValueError(f"{text!r} is not a whole number of bytes")
    return int(value)


def show_size(size: int) -> str:
    """`32 KiB (32,768 B)`, or `64,000 B` when the size is no whole number of KiB."""
    for unit, scale in (("MiB", MIB), ("KiB", KIB)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit} ({size:,} B)"
    return f"{size:,} B"
