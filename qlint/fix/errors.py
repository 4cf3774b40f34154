"""What a fix raises, torch-free, so that a program can catch it (`qlint.api` exports both) without
loading the stack by importing them."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qlint.full.rules import Linted
    from qlint.records.results import Finding


class FixError(Exception):
    """The artifact cannot be fixed: one line, nothing written. `refused`: the check of the program,
    when a finding of it is why (`finding`: QL003, QL007, with the rule enabled), so the report gives
    those findings and says the fix was not written, where otherwise the artifact is an input error."""

    def __init__(self, message: str, refused: Linted | None = None, finding: Finding | None = None) -> None:
        super().__init__(message)
        self.refused, self.finding = refused, finding

    @property
    def why(self) -> str:
        """Why, in a line beside the findings: what the finding that refused the fix says, and where."""
        if self.finding is None:
            return str(self).removeprefix("cannot fix: ")
        at = f" at {self.finding.node}" if self.finding.node else ""
        return f"{self.finding.message.split(': ', 1)[0]} ({self.finding.code}{at})"


class VerificationError(Exception):
    """The folded program's outputs differ from the unfolded program's."""
