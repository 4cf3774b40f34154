"""`qlint boards`: the boards `board:` and `budgets: {board: NAME}` can name, with their SRAM, flash,
clock and FPU and where the figures come from; the config's own `boards:` first, marked with where
they are defined."""

from __future__ import annotations

from pathlib import Path

from qlint.cli.exit_codes import EXIT_ERROR, EXIT_OK
from qlint.cli.output import emit, say
from qlint.io.reads import not_a_command, printable


def cmd_boards(config_path: Path | None) -> int:
    from tabulate import tabulate

    from qlint.settings.boards import board_rows, builtin_boards
    from qlint.settings.config import ConfigError, named_or_found

    try:
        config = named_or_found(config_path)
    except ConfigError as exc:
        say(f"qlint: config error: {printable(str(exc))}")
        return EXIT_ERROR
    own = config.budgets.boards
    rows = board_rows([*own.values(), *(b for name, b in builtin_boards().items() if name not in own)])
    # Names and origins come from the config: escaped as file names are, a line never a workflow command.
    shown = [[printable(cell) for cell in row] for row in rows]
    table = tabulate(shown, headers=["board", "cpu", "sram", "flash", "clock", "fpu", "source"], tablefmt="simple",
                     disable_numparse=True)
    return EXIT_OK if emit("\n".join(not_a_command(line) for line in table.split("\n"))) else EXIT_ERROR
