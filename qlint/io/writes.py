"""Writing files without ever leaving a partial one behind, or replacing what is not a file."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from qlint.io.reads import file_kind

T = TypeVar("T")

# `.<name>.qlint-<pid>-<random>.tmp`: the pid says whether its writer still runs.
_TEMP = re.compile(r"^\..+\.qlint-(?P<pid>\d+)-[^.]+\.tmp$")


class NotAFile(OSError):
    """An output path that holds a device, FIFO, socket or symlink: it is left as it is."""


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write to a temp file in the same folder, fsync, then rename over the target.

    A reader (or a killed writer) sees the old file or the new one, never a
    truncated file; the temp file is removed when anything fails, and the temp
    files that killed writers left in the folder are removed by the next write.
    The target must be a regular file or absent (`ensure_replaceable`): a rename
    would replace `/dev/null`, a FIFO or a symlink itself. Ctrl-C during the write
    takes effect once the target is whole or untouched. `mode`: the file's permissions (a secret: 0o600).
    """
    _write_all([(Path(path), data)], mode)


class OutputFailed(OSError):
    """A file of `write_all` that could not be written: `path` is that file, the message why."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(reason)
        self.path = path


def write_all(files: Sequence[tuple[Path, bytes]], mode: int = 0o644) -> None:
    """Write files that belong together (a program and its record) as `write_atomic` writes one, and
    none of them unless all can be: every target is checked, then every temp file written, before the
    first rename (which fails only if a folder changed meanwhile). `OutputFailed` names the file that
    could not be written."""
    _write_all([(Path(path), data) for path, data in files], mode, named=True)


def _write_all(files: list[tuple[Path, bytes]], mode: int, named: bool = False) -> None:
    for path, _ in files:
        _about(path, named, ensure_replaceable, path)
    for folder in dict.fromkeys(path.parent for path, _ in files):
        remove_stale_temps(folder)
    with _interrupts_deferred():
        temps: list[str] = []
        try:
            for path, data in files:
                temps.append(_about(path, named, _temp_copy, path, data, mode))
            for path, _ in files:
                _about(path, named, ensure_replaceable, path)  # again: the writes may have taken a while
            for (path, _), tmp in zip(files, temps, strict=True):
                _about(path, named, os.replace, tmp, path)
        except BaseException:
            for tmp in temps:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            raise


def _about(path: Path, named: bool, call: Callable[..., T], *args: Any) -> T:
    """`call(*args)`; with `named`, an OSError it raises is an `OutputFailed` naming `path`."""
    try:
        return call(*args)
    except OSError as exc:
        if not named or isinstance(exc, OutputFailed):
            raise
        raise OutputFailed(path, exc.strerror or str(exc)) from exc


def _temp_copy(path: Path, data: bytes, mode: int) -> str:
    """`data` in a new temp file beside `path`, synced, with `mode`: its name (removed if this fails)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.qlint-{os.getpid()}-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return tmp


def ensure_replaceable(path: Path) -> None:
    """Raise `NotAFile` (IsADirectoryError for a folder) unless `path` is a regular file or nothing.

    A symlink is refused, not followed: an output path in a checkout can be a
    link that a pull request planted, pointing at any file the CI user may write.
    """
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if not stat.S_ISREG(mode):
        raise NotAFile(f"not a regular file ({file_kind(mode)}); qlint only creates or replaces regular files")


def same_file(path: Path) -> tuple[object, ...]:
    """What names the file a write to `path` replaces, however the path is spelled (`./x`, `a/../x`, a
    symlink to it, a linked folder): the file itself when it exists, else the path with its links resolved.
    Two outputs with one key would overwrite each other."""
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return ("path", os.path.realpath(path))
    return ("file", info.st_dev, info.st_ino)


@contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Hold SIGINT while a temp file exists, then deliver it: an interrupted run leaves no temp file.

    Only the main thread receives signals (and may set handlers); other threads are never interrupted.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
        if caught:
            signal.raise_signal(signal.SIGINT)  # handled as it would have been: KeyboardInterrupt by default


def remove_stale_temps(folder: Path) -> list[str]:
    """Remove the temp files of writers that no longer run; return their names."""
    removed: list[str] = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        match = _TEMP.match(name)
        if match is None or _alive(int(match["pid"])):
            continue
        try:
            os.unlink(folder / name)
            removed.append(name)
        except OSError:
            pass
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # someone else's process, or a pid we cannot ask about: leave it
    return True


def ensure_directory(path: Path) -> str | None:
    """Create `path` when missing (its parent must exist: a typo should not grow a tree);
    return why it cannot be used as an output folder, or None."""
    if path.is_dir():
        return None
    if path.exists():
        return "not a directory"
    if not path.parent.is_dir():
        return f"its parent {path.parent} is not a directory"
    try:
        path.mkdir()
    except FileExistsError:
        return None if path.is_dir() else "not a directory"
    except OSError as exc:
        return f"cannot create it: {exc.strerror or exc}"
    return None
