"""`qlint boards`: the boards `board:` and `budgets: {board: NAME}` can name, with their NPU, SRAM,
flash, clock, FPU and flash read cost; the config's own `boards:` first, marked with where they are defined.

Where the table's figures come from (a vendor page a figure, up to hundreds of characters a board)
would make every row wrap, so the table leaves it out and `--verbose` prints it under the table, a
board a block, as `qlint rule` keeps a rule's detail from `qlint rules`; `--output-format json` has
every field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qlint.cli.exit_codes import EXIT_ERROR, EXIT_OK
from qlint.cli.output import emit, say
from qlint.io.reads import not_a_command, printable

if TYPE_CHECKING:
    from qlint.settings.boards import Board

BOARD_FORMATS = ("text", "json")


def cmd_boards(config_path: Path | None, output_format: str = "text", verbose: bool = False) -> int:
    from qlint.settings.boards import builtin_boards
    from qlint.settings.config import ConfigError, named_or_found

    try:
        config = named_or_found(config_path)
    except ConfigError as exc:
        say(f"qlint: config error: {printable(str(exc))}")
        return EXIT_ERROR
    own = config.budgets.boards
    boards = [*own.values(), *(b for name, b in builtin_boards().items() if name not in own)]
    if output_format == "json":
        text = json.dumps([_record(b, b.name in own) for b in boards], indent=2)
    else:
        text = _table(boards, set(own)) + ("\n\n" + _sources(boards, set(own)) if verbose else "")
    return EXIT_OK if emit(text) else EXIT_ERROR


def _table(boards: list[Board], own: set[str]) -> str:
    """One short row a board: its figures, and for the config's own where it is defined."""
    from tabulate import tabulate

    from qlint.settings.boards import board_rows

    headers = ["board", "cpu", "npu", "sram", "flash", "clock", "fpu", "flash read", *(["defined in"] if own else [])]
    rows = []
    for b, row in zip(boards, board_rows(boards), strict=True):
        # The NPU without its Vela sections, which would widen every row: --verbose and JSON have them.
        cells = [*row[:2], b.npu or "", *row[3:7], f"{b.flash_read:g} cycles/B" if b.flash_read else ""]
        rows.append([*cells, b.source if b.name in own else ""] if own else cells)
    # Names and origins come from the config: escaped as file names are, a line never a workflow command.
    table = tabulate([[printable(cell) for cell in row] for row in rows], headers=headers, tablefmt="simple",
                     disable_numparse=True)
    return "\n".join(not_a_command(line) for line in table.split("\n"))


def _sources(boards: list[Board], own: set[str]) -> str:
    """Where each board's figures come from, a block a board (`--verbose`); the config's own, where
    they are defined."""
    from qlint.settings.boards import show_npu

    blocks = []
    for b in boards:
        lines = [b.name, f"  {'defined in' if b.name in own else 'source'}: {b.source}"]
        if b.clock_source:
            lines.append(f"  clock and FPU: {b.clock_source}")
        if b.npu:
            lines.append(f"  NPU: {show_npu(b)}" + (f", {b.npu_source}" if b.npu_source else ""))
        if b.flash_read:
            lines.append(f"  flash reads: {b.flash_read:g} cycles/byte, {b.flash_read_source}")
        if b.note:
            lines.append(f"  note: {b.note}")
        blocks.append("\n".join(not_a_command(printable(line)) for line in lines))
    return "\n\n".join(blocks)


def _record(b: Board, own: bool) -> dict[str, Any]:
    """Every field of a board, sizes in bytes and the clock in Hz; `config`: one of `.qlint.yaml`'s `boards:`."""
    return {"name": b.name, "cpu": b.cpu or None, "npu": b.npu, "system_config": b.system_config,
            "memory_mode": b.memory_mode, "sram": b.sram, "flash": b.flash, "clock_hz": b.clock_hz,
            "fpu": b.fpu, "flash_read": b.flash_read, "config": own, "source": b.source,
            "clock_source": b.clock_source or None, "flash_read_source": b.flash_read_source or None,
            "npu_source": b.npu_source or None, "note": b.note or None}
