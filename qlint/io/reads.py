"""Reading untrusted input files: regular files only, bounded, one-line errors.

Artifacts, configs, baselines and the source files that an artifact's stack
traces name all arrive from pull requests. A path may be a symlink to
`/dev/zero` or a FIFO, and a file may be larger than any model: every read
goes through `read_input`, which opens without blocking, checks the opened
file (not the name, which can change in between) and never reads more than
its limit.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any


class ReadError(Exception):
    """An input that cannot be read, or is past one of its bounds (`io.limits`): one line, exit code 2."""


# Where the bound of a read comes from, as its error says it: `limits:` in the config sets the bound
# on artifacts (and on what a target's factory imports); configs, baselines, metrics files, cache
# entries and source files have fixed bounds that no config changes.
CONFIGURED = "limits.file_mb in .qlint.yaml"
FIXED = "a fixed limit"


def read_input(path: Path, limit: int, what: str = "file", origin: str = FIXED) -> bytes:
    """The bytes of a regular file of at most `limit` bytes, or a ReadError saying why not (and,
    past the limit, where the limit comes from: `origin`)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ReadError("no such file") from None
    except OSError as exc:
        raise ReadError(f"cannot open: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ReadError(f"not a regular {what} ({file_kind(info.st_mode)})")
        if info.st_size > limit:
            raise ReadError(f"{what} is {info.st_size} bytes, over the {limit}-byte limit ({origin})")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:  # grew while being read
            raise ReadError(f"{what} is over the {limit}-byte limit ({origin})")
        return b"".join(chunks)
    except OSError as exc:
        raise ReadError(f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def file_kind(mode: int) -> str:
    """What a non-regular file is, for an error line: `a FIFO`, `a symlink` (from lstat), ..."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "a special file"


def printable(text: str) -> str:
    """`text` with control characters escaped, so a name cannot split a line or drive a terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def first_line(exc: BaseException) -> str:
    """The most specific one-line message in an exception chain.

    Dynamo puts the failing call and the real error on an `Explanation:` line
    under a generic first line ("RuntimeError when making fake tensor call"):
    that line is kept too.
    """
    while exc.__cause__ is not None:
        exc = exc.__cause__
    text = str(exc).strip().splitlines()
    if not text:
        return type(exc).__name__
    explanation = next((line.strip().removeprefix("Explanation:").strip() for line in text[1:]
                        if line.strip().startswith("Explanation:")), None)
    return f"{text[0]}: {explanation}" if explanation else text[0]


def not_a_command(line: str) -> str:
    """`line` as a CI log shows it, never read as a workflow command: GitHub's runner takes a line
    that starts with `::` (after leading spaces) for one, so that line's first colon is written
    `\\x3a`, as `printable` writes what it escapes. `line` must be one line (`printable` first)."""
    stripped = line.lstrip()
    if not stripped.startswith("::"):
        return line
    indent = len(line) - len(stripped)
    return f"{line[:indent]}\\x3a{line[indent + 1:]}"


def shown_path(path: Path, root: Path, *, resolve: bool = False) -> str | None:
    """`path` relative to `root` in posix form, or None when it lies outside.

    Artifacts are shown from the working directory, as given (`resolve=False`);
    source locations from the repository root, symlinks resolved, because CI
    annotations need repository paths.
    """
    try:
        if resolve:
            return path.resolve().relative_to(root.resolve()).as_posix()
        return path.absolute().relative_to(root.absolute()).as_posix()
    except (ValueError, OSError, RuntimeError):  # RuntimeError: a symlink loop
        return None


def read_json(path: Path, limit: int, what: str, kind: str) -> Any:
    """A JSON file another run wrote (a baseline, a base branch's metrics), read within `limit` bytes.
    Raises ReadError naming the path, and `kind` ("a qlint baseline") when it is no JSON at all."""
    where = printable(str(path))
    try:
        return json.loads(read_input(path, limit, what))
    except ReadError as exc:
        raise ReadError(f"{where}: {exc}") from None
    except (ValueError, RecursionError) as exc:
        raise ReadError(f"{where}: not {kind} ({type(exc).__name__})") from None
