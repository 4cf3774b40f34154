"""`qlint boards`: the boards `budgets: {board: NAME}` can name, with their SRAM and flash and where
the figures come from; the config's own `boards:` first, marked with where they are defined."""

from __future__ import annotations

from pathlib import Path

from qlint.cli.exit_codes import EXIT_ERROR, EXIT_OK
from qlint.cli.output import emit, say
from qlint.io.reads import printable


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
    table = tabulate(rows, headers=["board", "cpu", "sram", "flash", "source"], tablefmt="simple")
    return EXIT_OK if emit(table) else EXIT_ERROR
