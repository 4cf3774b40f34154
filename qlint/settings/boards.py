"""Common Cortex-M boards and SoCs with the SRAM, flash, CPU clock, FPU and Ethos-U NPU their vendors document:
what `budgets: {board: NAME}` takes `sram` and `flash` from, and what a cost estimate takes the
clock and the FPU from (`board:`, `--board`).

The table is data, `boards.yaml` beside this module; each row cites the vendor page or datasheet
its figures come from. SRAM is all on-chip SRAM the core can address (a program may get less: a
linker script, a stack, other firmware); flash is the on-chip flash, or the board's external flash
where the SoC has none (said in `note`). A team's own board goes in `.qlint.yaml` under `boards:`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources

import yaml

from qlint.settings.cycles import default_fpu
from qlint.settings.npus import NpuChoice
from qlint.settings.sizes import parse_clock, parse_size, show_clock, show_size


@dataclass(frozen=True)
class Board:
    name: str
    cpu: str
    sram: int     # bytes
    flash: int    # bytes
    source: str   # where the figures come from
    note: str = ""
    clock_hz: int | None = None   # the CPU clock a latency is estimated at
    fpu: bool | None = None       # None: the CPU's architecture decides (`qlint.settings.cycles.default_fpu`)
    clock_source: str = ""        # where the clock and FPU come from, when another page than `source`
    flash_read: float | None = None   # CPU cycles a byte of weights read once from flash (None: not priced)
    flash_read_source: str = ""   # how that figure is derived
    npu: str | None = None        # its Ethos-U (`ethos-u55-128`), None for a Cortex-M alone
    system_config: str | None = None   # the Vela system config its vendor gives (None: EthosUCompileSpec's default)
    memory_mode: str | None = None     # the Vela memory mode its vendor gives (None: the default)
    npu_source: str = ""          # where the NPU comes from, when another page than `source`

    @property
    def npu_choice(self) -> NpuChoice:
        """What the board names for the NPU, as one level of `npus.resolve`."""
        return NpuChoice(self.npu, self.system_config, self.memory_mode)


@functools.cache
def builtin_boards() -> dict[str, Board]:
    """The table in `boards.yaml` beside this module (data: one entry a board, each with its source),
    read when a budget names a board or the table is listed, not on every start."""
    text = resources.files("qlint.settings").joinpath("boards.yaml").read_text(encoding="utf-8")
    return {name: Board(name, row["cpu"], parse_size(row["sram"]), parse_size(row["flash"]), row["source"],
                        row.get("note", ""), parse_clock(row["clock"]) if "clock" in row else None,
                        row.get("fpu"), row.get("clock_source", ""),
                        float(row["flash_read"]) if "flash_read" in row else None, row.get("flash_read_source", ""),
                        row.get("npu"), row.get("system_config"), row.get("memory_mode"), row.get("npu_source", ""))
            for name, row in yaml.safe_load(text).items()}


def fpu_error(board: Board, cpu: str) -> str | None:
    """Why `board` cannot be estimated on `cpu`: it says it has an FPU, and `cpu`'s architecture has
    none (the cost table has no FPU timings for it, and no part of it ships one), or None."""
    if board.fpu and not default_fpu(cpu):
        return f"board {board.name} says it has an FPU (fpu: true), and a {cpu} has none: name a board and a CPU " \
               "that agree"
    return None


def show_npu(board: Board) -> str:
    """The board's NPU as a table shows it: `ethos-u55-128`, with the Vela sections it names, if any."""
    sections = ", ".join(s for s in (board.system_config, board.memory_mode) if s)
    return f"{board.npu} ({sections})" if board.npu and sections else board.npu or ""


def board_rows(boards: Iterable[Board]) -> list[tuple[str, str, str, str, str, str, str, str]]:
    """Name, CPU, NPU, SRAM, flash, clock, FPU and source (with its note) of each board: what `qlint
    boards` prints and docs/budgets.md shows."""
    rows = []
    for b in boards:
        flash_read = f"flash reads {b.flash_read:g} cycles/byte, {b.flash_read_source}" if b.flash_read else ""
        source = "; ".join(part for part in (b.source, b.clock_source, b.npu_source, flash_read, b.note) if part)
        fpu = "" if b.fpu is None else "yes" if b.fpu else "no"
        rows.append((b.name, b.cpu, show_npu(b), show_size(b.sram), show_size(b.flash),
                     show_clock(b.clock_hz) if b.clock_hz else "", fpu, source))
    return rows
