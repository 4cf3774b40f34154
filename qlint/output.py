"""Writing files without ever leaving a partial one behind."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

# `.<name>.qlint-<pid>-<random>.tmp`: the pid says whether its writer still runs.
_TEMP = re.compile(r"^\..+\.qlint-(?P<pid>\d+)-[^.]+\.tmp$")


def write_atomic(path: Path, data: bytes) -> None:
    """Write to a temp file in the same folder, fsync, then rename over the target.

    A reader (or a killed writer) sees the old file or the new one, never a
    truncated file; the temp file is removed when anything fails, and the temp
    files that killed writers left in the folder are removed by the next write.
    """
    path = Path(path)
    folder = path.parent or Path(".")
    remove_stale_temps(folder)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.qlint-{os.getpid()}-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


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
