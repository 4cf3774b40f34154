"""What the command line prints: one line on stderr, the report on stdout, a usage error.

A closed or broken stream is not a traceback: stderr that went away is dropped, stdout
that a reader stopped reading ends the report quietly (`qlint.cli.exit_codes` says why the
exit code stays the run's).
"""

from __future__ import annotations

import os
import sys
from typing import IO

from qlint.cli.exit_codes import EXIT_ERROR
from qlint.io.reads import printable


def say(line: str) -> None:
    """One line on stderr. A closed or broken stderr (`2>&1 | head -1`) does not stop the run."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        to_devnull(sys.stderr)


def emit(text: str) -> bool:
    """Print the report on stdout, flushed now so that a failed write shows here, not at exit.

    A reader that stopped reading (`| head -1`, a closed pager) ends the output quietly and the
    run goes on. False, after one error line, when stdout cannot be written (`>/dev/full`).
    """
    try:
        print(text, flush=True)
    except BrokenPipeError:
        to_devnull(sys.stdout)
    except OSError as exc:
        to_devnull(sys.stdout)
        say(f"qlint: error: cannot write the report to stdout: {exc.strerror or exc}")
        return False
    return True


def to_devnull(stream: IO[str]) -> None:
    """Point `stream`'s fd at /dev/null: what is still buffered, and what comes, goes nowhere, silently."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError):  # not a real file (a test's capture)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
    try:
        stream.flush()
    except (OSError, ValueError):
        pass


def usage_error(message: str, prog: str = "qlint check") -> int:
    """`qlint: error: MESSAGE` and a `--help` hint on stderr; the exit code."""
    say(f"qlint: error: {printable(message)}")
    say(f"Run '{prog} --help' for usage.")
    return EXIT_ERROR
