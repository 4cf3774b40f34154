"""What Python 3.10, which qlint supports, lacks."""

from __future__ import annotations

import sys
from enum import Enum

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:

    class StrEnum(str, Enum):
        """Members are their values: equal to, formatted and printed as the string."""

        def __str__(self) -> str:
            return str(self.value)


__all__ = ["StrEnum"]
