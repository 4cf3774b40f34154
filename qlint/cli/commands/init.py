"""`qlint init [PATH]`: write the commented default config, never over an existing file."""

from __future__ import annotations

from pathlib import Path

from qlint.cli.exit_codes import EXIT_ERROR, EXIT_OK
from qlint.cli.output import emit, say
from qlint.io.reads import printable


def cmd_init(path: Path) -> int:
    from qlint.io.writes import write_atomic
    from qlint.settings.config import DEFAULT_CONFIG

    if path.exists() or path.is_symlink():
        say(f"qlint: {printable(str(path))} already exists; not overwriting")
        return EXIT_ERROR
    try:
        write_atomic(path, DEFAULT_CONFIG.encode())
    except OSError as exc:
        say(f"qlint: error: cannot write {printable(str(path))}: {exc.strerror or exc}")
        return EXIT_ERROR
    return EXIT_OK if emit(f"wrote {printable(str(path))}") else EXIT_ERROR
