"""`qlint boards`: the boards `budgets: {board: NAME}` can name, with their SRAM and flash and where
the figures come from; the config's own `boards:` first, marked with where they are defined."""

from __future__ import annotations

from pathlib import Path

from qlint.cli.exit_codes import EXIT_ERROR, EXIT_OK
from qlint.cli.output import emit, say
from qlint.io.reads import printable


def cmd_boards(config_path: Path | None) -> int:
    from tabulate import tabulate

    from qlint.settings.boards import BOARDS, board_rows
    from qlint.settings.config import ConfigError, find_config, load_config

    try:
        if config_path is not None and not config_path.exists():
            raise ConfigError(config_path, 0, "<file>", "no such config file")
        config = load_config(config_path or find_config(Path.cwd()))
    except ConfigError as exc:
        say(f"qlint: config error: {printable(str(exc))}")
        return EXIT_ERROR
    own = config.budgets.boards
    rows = board_rows([*own.values(), *(b for name, b in BOARDS.items() if name not in own)])
    table = tabulate(rows, headers=["board", "cpu", "sram", "flash", "source"], tablefmt="simple")
    return EXIT_OK if emit(table) else EXIT_ERROR
