"""A write killed half way leaves the old file or none, never a truncated one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qlint.io.writes import write_atomic

# Stalls the writer after its data is in the temp file and before the rename,
# the widest window in which a kill could leave a partial output behind.
WRITER = """
import os, sys, time
from pathlib import Path
from qlint.io import writes

def stall(fd):
    Path(sys.argv[2]).touch()
    time.sleep(60)

os.fsync = stall
writes.write_atomic(Path(sys.argv[1]), b"new" * 1_000_000)
"""


@pytest.mark.parametrize("existing", [b"old contents", None])
def test_kill_mid_write(tmp_path: Path, existing: bytes | None) -> None:
    target = tmp_path / "model.pte"
    if existing is not None:
        target.write_bytes(existing)
    marker = tmp_path / "stalled"
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(target), str(marker)])
    deadline = time.time() + 60
    while not marker.exists():
        assert time.time() < deadline and child.poll() is None, "writer never reached the stall"
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait()
    if existing is None:
        assert not target.exists()
    else:
        assert target.read_bytes() == existing
    [leftover] = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert leftover.startswith(f".model.pte.qlint-{child.pid}-")
    write_atomic(tmp_path / "other.pte", b"next write")  # any write to the folder cleans up
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "stalled") == sorted(
        ["other.pte", *(["model.pte"] if existing is not None else [])])


def test_temp_files_of_live_writers_are_kept(tmp_path: Path) -> None:
    live = tmp_path / f".model.pte.qlint-{os.getppid()}-abc.tmp"  # our parent is alive
    live.write_bytes(b"in progress")
    unrelated = tmp_path / ".notes.tmp"
    unrelated.write_bytes(b"not ours")
    write_atomic(tmp_path / "out.pte", b"abc")
    assert live.exists() and unrelated.exists()


def test_write_replaces_whole_file(tmp_path: Path) -> None:
    target = tmp_path / "out.pte"
    target.write_bytes(b"x" * 100)
    write_atomic(target, b"abc")
    assert target.read_bytes() == b"abc"
    assert [p.name for p in tmp_path.iterdir()] == ["out.pte"]


def test_failed_write_leaves_no_temp_file(tmp_path: Path) -> None:
    (tmp_path / "out.pte").mkdir()
    with pytest.raises(OSError):
        write_atomic(tmp_path / "out.pte", b"abc")
    assert [p.name for p in tmp_path.iterdir()] == ["out.pte"]


def test_files_written_together_are_all_written_or_none(tmp_path: Path) -> None:
    """A program and its record: when one cannot be written the other is not either, and the error
    names the one that failed."""
    from qlint.io.writes import OutputFailed, write_all

    (tmp_path / "model.pte").write_bytes(b"old program")
    (tmp_path / "model.etrecord").symlink_to("elsewhere")
    with pytest.raises(OutputFailed) as failed:
        write_all([(tmp_path / "model.pte", b"new program"), (tmp_path / "model.etrecord", b"record")])
    assert failed.value.path == tmp_path / "model.etrecord" and str(failed.value).startswith("not a regular file")
    assert (tmp_path / "model.pte").read_bytes() == b"old program"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.etrecord", "model.pte"]
    with pytest.raises(OutputFailed) as failed:  # the first temp file is written when the second fails
        write_all([(tmp_path / "model.pte", b"new program"), (tmp_path / "gone" / "model.etrecord", b"record")])
    assert failed.value.path == tmp_path / "gone" / "model.etrecord" and failed.value.strerror is None
    assert str(failed.value) == "No such file or directory"
    assert (tmp_path / "model.pte").read_bytes() == b"old program"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.etrecord", "model.pte"]  # no temp file left
    write_all([(tmp_path / "model.pte", b"new program"), (tmp_path / "record", b"record")])
    assert (tmp_path / "model.pte").read_bytes() == b"new program" and (tmp_path / "record").read_bytes() == b"record"
