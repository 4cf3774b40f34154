"""How one run works, apart from the config: lowering order, verbosity, fixing.

These travel from the CLI through the engine into each child process, and all
of them are part of the cache key: anything that can change a report is.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from qlint._compat import StrEnum


class LoweringOrder(StrEnum):
    """Which Cortex-M pass order lowers a program."""

    REPAIRED = "repaired"   # qlint's order, which survives linear -> reshape -> bmm
    STOCK = "stock"         # ExecuTorch's own CortexMPassManager order


@dataclass(frozen=True)
class FixOptions:
    output_dir: Path | None = None
    dry_run: bool = False   # --diff: plan and report the folds, write nothing
    unsafe_fixes: bool = False  # try every remedy of each target's flow, not only the config's
    inputs_root: str | None = None  # the folder the named inputs share (absolute): --output-dir mirrors below it

    def output(self, folder: Path, name: str, *, mirrored: bool = False) -> Path:
        """Where the `<name>.pte` of an input in `folder` goes: beside it, or into `--output-dir`, a file's
        (`mirrored`) at its folder's path below `inputs_root`, so that `a/model.pt2` and `b/model.pt2`, or a
        tree of `models/*/model.pt2`, keep apart; a config target's as `NAME.pte` (its name is unique)."""
        if self.output_dir is None:
            return folder / f"{name}.pte"
        below = os.path.relpath(os.path.abspath(folder), self.inputs_root) if mirrored and self.inputs_root else "."
        if below.split(os.sep)[0] == os.pardir:  # outside the root (no named input is): never outside the folder
            below = "."
        return self.output_dir / below / f"{name}.pte"


@dataclass(frozen=True)
class RunOptions:
    order: LoweringOrder = LoweringOrder.REPAIRED
    verbose: bool = False   # full tracebacks in QL003 messages and errors
    fix: FixOptions | None = None
    static: bool = False    # --static: QL001/QL004 from the graph JSON, no torch (`qlint.static`)
    measure: bool = False   # budgets or metrics asked: serialize each program and read its figures
    profile: str | None = None  # --profile: an ETDump of the one artifact checked (`qlint.device.profile`)
    etrecord: str | None = None  # --etrecord: the ETRecord that maps a profile to a `.pt2`'s lowering
    # an NPU target's float fallbacks priced by compiling the program with each on the NPU; the remedy
    # search's builds, which price the placements themselves, leave it off (a lowering a fallback)
    split_costs: bool = True

    def cache_key(self) -> dict[str, Any]:
        """Every field, so a report cached under other options is never reused."""
        return asdict(self)
