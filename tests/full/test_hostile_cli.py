"""The command line under hostile conditions: closed pipes and stdout, Ctrl-C, failing and
special output paths, overlay names that collide, paths past the OS's limit, bad options and
numbers past any float.

Whatever happens, qlint ends with its documented exit code and one line per problem on stderr,
never a traceback, and leaves no temp file, half-written output or replaced device behind.
Process behaviour (signals, closed streams, exit codes) runs qlint in a child process; inputs
are built here, in tmp_path, from the bundled example.
"""

from __future__ import annotations

import errno
import hashlib
import importlib
import json
import os
import resource
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, run_cli

EXAMPLE = ROOT / "examples" / "attention.pt2"
QLINT = [sys.executable, "-m", "qlint"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
CHECK = ["check", "--static", "--no-cache"]  # the fast tier: no torch in the child
REFUSED = "qlint only creates or replaces regular files"


@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    target = tmp_path / "attention.pt2"
    target.write_bytes(EXAMPLE.read_bytes())
    return target


def qlint(args: list[str], cwd: Path, **options: Any) -> subprocess.CompletedProcess[str]:
    options.setdefault("capture_output", "stdout" not in options)
    return subprocess.run([*QLINT, *args], cwd=cwd, env=ENV, text=True, timeout=300, **options)


def messages(stderr: str) -> list[str]:
    """The stderr lines, without the static tier's note on what it checks."""
    return [line for line in stderr.splitlines() if not line.startswith("qlint: static tier:")]


def files(folder: Path) -> list[str]:
    """Every file below `folder` (temp files included), relative, sorted."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir())


# -- stdout: a reader that stops, stdout closed, stdout on a full disk -------------------------


def test_a_reader_that_closes_the_pipe_ends_the_output_quietly(tmp_path: Path, artifact: Path) -> None:
    """`qlint check | head -1`: no BrokenPipeError, the --write files still written, and the
    run's own exit code (1: the example has an error finding), not one the pipe made up."""
    child = subprocess.Popen([*QLINT, *CHECK, artifact.name, "--write", "json:out.json"], cwd=tmp_path, env=ENV,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()  # the reader is gone before the report is printed
    err = child.stderr.read()
    assert child.wait(timeout=300) == 1
    assert messages(err) == []
    assert [f["code"] for f in json.loads((tmp_path / "out.json").read_text())["findings"]] == ["QL001", "QL004"]


def test_stdout_and_stderr_into_one_closed_pipe(tmp_path: Path, artifact: Path) -> None:
    """`qlint check 2>&1 | head -0`: the notes on stderr meet the closed pipe first; still no traceback."""
    read, write = os.pipe()
    os.close(read)
    try:
        result = qlint([*CHECK, artifact.name, "--write", "json:out.json"], tmp_path, stdout=write, stderr=write,
                       capture_output=False)
    finally:
        os.close(write)
    assert result.returncode == 1
    assert json.loads((tmp_path / "out.json").read_text())["findings"]


def test_closed_stdout_is_an_error_not_a_silent_run(tmp_path: Path, artifact: Path) -> None:
    """`qlint check x.pt2 >&-`: nowhere to report, so nothing is run and nothing written."""
    result = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", *QLINT, *CHECK, artifact.name,
                             "--write", "json:out.json"], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "qlint: error: stdout is closed: nowhere to print the report (redirect it instead, e.g. >/dev/null)"
    ]
    assert files(tmp_path) == ["attention.pt2"]


def test_closed_stderr_still_runs_and_reports(tmp_path: Path, artifact: Path) -> None:
    """`2>&-`: the notes have nowhere to go, the report and the exit code are unchanged."""
    result = subprocess.run(["sh", "-c", 'exec "$@" 2>&-', "sh", *QLINT, *CHECK, artifact.name,
                             "--write", "json:out.json"], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 1
    assert result.stdout.startswith("attention.pt2: QL001 [error]")
    assert json.loads((tmp_path / "out.json").read_text())["findings"]


def test_stdout_on_a_full_disk(tmp_path: Path, artifact: Path) -> None:
    if not stat.S_ISCHR(os.stat("/dev/full").st_mode):
        pytest.skip("no /dev/full")
    with open("/dev/full", "w") as full:  # every write: ENOSPC
        result = qlint([*CHECK, artifact.name, "--write", "json:out.json"], tmp_path, stdout=full,
                       stderr=subprocess.PIPE)
    assert result.returncode == 2
    assert messages(result.stderr) == ["qlint: error: cannot write the report to stdout: No space left on device"]
    assert json.loads((tmp_path / "out.json").read_text())["findings"]


# -- Ctrl-C --------------------------------------------------------------------------------


def interruptible() -> None:
    """In the child before exec: Ctrl-C as a terminal gives it, whatever the test run inherited (a shell
    starts background jobs with SIGINT ignored, and an ignored SIGINT is inherited across exec)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt(args: list[str], cwd: Path, ready: Callable[[int], bool]) -> tuple[int, str, str]:
    """Start qlint, send SIGINT once `ready(pid)`; its exit code, stdout and stderr."""
    child = subprocess.Popen([*QLINT, *args], cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, preexec_fn=interruptible)
    deadline = time.monotonic() + 300
    while not ready(child.pid):
        assert child.poll() is None, f"qlint ended before it could be interrupted: {child.communicate()}"
        assert time.monotonic() < deadline, "qlint never got ready to be interrupted"
        time.sleep(0.02)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=120)  # not the 900 s target timeout: children are stopped
    return child.returncode, out, err


def torch_loading(pid: int) -> bool:
    """The full check has started reading: torch's library is mapped."""
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_ctrl_c_during_a_check_is_one_line_and_leaves_nothing(tmp_path: Path, artifact: Path) -> None:
    args = ["check", "--cache-dir", "cache", artifact.name, "--write", "sarif:out.sarif", "--write", "json:out.json"]
    assert interrupt(args, tmp_path, torch_loading) == (130, "", "qlint: interrupted\n")
    assert files(tmp_path) == ["attention.pt2"]  # no output, temp file or cache entry


def test_ctrl_c_during_a_fix_writes_no_program(tmp_path: Path, artifact: Path) -> None:
    args = ["fix", "--no-cache", artifact.name, "--output-dir", "out"]
    assert interrupt(args, tmp_path, torch_loading) == (130, "", "qlint: interrupted\n")
    assert files(tmp_path) == ["attention.pt2"]
    assert (tmp_path / "out").is_dir()  # --output-dir is made before the check starts


HANGING = """\
import os, time
from pathlib import Path


def hangs():
    Path(os.environ["QLINT_TEST_MARKERS"], str(os.getpid())).touch()
    time.sleep(3600)
"""


def test_ctrl_c_stops_the_children_of_a_parallel_run(tmp_path: Path) -> None:
    """Two targets hang in their children (`--jobs 2`): Ctrl-C kills them and the run ends at
    once, instead of waiting out `limits.timeout_s` (900 s) in each worker thread."""
    markers = tmp_path / "started"
    markers.mkdir()
    (tmp_path / "models.py").write_text(HANGING)
    (tmp_path / ".qlint.yaml").write_text(
        "targets:\n  - name: one\n    factory: models:hangs\n  - name: two\n    factory: models:hangs\n")
    env = {**ENV, "QLINT_TEST_MARKERS": str(markers)}
    child = subprocess.Popen([*QLINT, "check", "--targets-only", "--no-cache", "--jobs", "2"], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)
    deadline = time.monotonic() + 300
    while len(list(markers.iterdir())) < 2:
        assert child.poll() is None and time.monotonic() < deadline, child.communicate()
        time.sleep(0.05)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=120)
    assert (child.returncode, out, err) == (130, "", "qlint: interrupted\n")
    for factory in markers.iterdir():
        assert process_state(int(factory.name)) in (None, "Z")  # killed (a zombie until reaped), not sleeping


def test_a_parallel_run_of_targets_leaves_nothing_on_stderr(tmp_path: Path) -> None:
    """Each target's export makes a tqdm bar in its child; its lock must not leak a semaphore that
    the resource tracker reports on qlint's stderr at exit."""
    shutil.copy(ROOT / "examples" / "models.py", tmp_path / "models.py")
    (tmp_path / ".qlint.yaml").write_text(
        "targets:\n  - {name: pool, factory: models:make_pool}\n  - {name: scale, factory: models:make_scale}\n")
    result = subprocess.run([*QLINT, "check", "--targets-only", "--no-cache", "--jobs", "2", "-q"], cwd=tmp_path,
                            env=ENV, capture_output=True, text=True, timeout=600)
    assert result.returncode in (0, 1) and result.stderr == ""
    assert result.stdout.count("target:") >= 1


def process_state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def test_ctrl_c_during_a_write_lands_after_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The widest window: the data is in the temp file, not yet renamed. The interrupt waits
    until the target is whole; no temp file is left."""
    from qlint.io import writes

    target = tmp_path / "out.sarif"
    target.write_bytes(b"old")
    fsync = os.fsync

    def interrupted(fd: int) -> None:
        signal.raise_signal(signal.SIGINT)  # Ctrl-C, right here
        fsync(fd)

    monkeypatch.setattr(writes.os, "fsync", interrupted)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as an interactive run has it
    try:
        with pytest.raises(KeyboardInterrupt):
            writes.write_atomic(target, b"new")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert files(tmp_path) == ["out.sarif"] and target.read_bytes() == b"new"


# -- write errors ------------------------------------------------------------------------------


def creation_error(folder: str) -> str:
    """What the OS says to creating a file in `folder` (root ignores permissions, not these)."""
    try:
        os.close(os.open(os.path.join(folder, "qlint-probe"), os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    except OSError as exc:
        return exc.strerror or str(exc)
    os.unlink(os.path.join(folder, "qlint-probe"))
    pytest.skip(f"{folder} is writable here")


def test_each_failing_write_is_one_line_and_the_others_are_written(tmp_path: Path, artifact: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    (tmp_path / "null").symlink_to(os.devnull)
    result = qlint([*CHECK, artifact.name, "--write", "sarif:file/out.sarif", "--write", "json:ok.json",
                    "--write", "sarif:/sys/qlint-out.sarif", "--write", "sarif:null", "--write", "markdown:ok.md",
                    "--write", "model-explorer:file/me", "--write", "github:ok.txt"], tmp_path)
    assert result.returncode == 2
    assert result.stdout.startswith("attention.pt2: QL001 [error]")
    assert messages(result.stderr) == [
        "qlint: error: cannot write file/out.sarif: Not a directory",
        f"qlint: error: cannot write /sys/qlint-out.sarif: {creation_error('/sys')}",
        f"qlint: error: cannot write null: not a regular file (a symlink); {REFUSED}",
        "qlint: error: model-explorer:file/me: its parent file is not a directory",
    ]
    assert files(tmp_path) == ["attention.pt2", "file", "null", "ok.json", "ok.md", "ok.txt"]
    assert os.readlink(tmp_path / "null") == os.devnull and stat.S_ISCHR(os.stat(os.devnull).st_mode)


def test_a_write_past_the_disk_limit(tmp_path: Path, artifact: Path) -> None:
    """A write the file system stops half way (a file size limit, as a full disk would):
    the one line, no partial file, and the smaller write beside it is still made."""

    def two_kib_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))

    result = qlint([*CHECK, artifact.name, "--write", "json:big.json", "--write", "github:small.txt"], tmp_path,
                   preexec_fn=two_kib_files)
    assert result.returncode == 2
    assert messages(result.stderr) == [f"qlint: error: cannot write big.json: {os.strerror(errno.EFBIG)}"]
    assert files(tmp_path) == ["attention.pt2", "small.txt"]
    assert (tmp_path / "small.txt").read_text().startswith("::error file=")


# -- outputs replace only regular files ---------------------------------------------------------


def special(path: Path, kind: str) -> Callable[[], object]:
    """Make `kind` at `path`; a function that describes it (to compare before and after)."""
    if kind == "symlink to /dev/null":
        path.symlink_to(os.devnull)
    elif kind == "symlink to a file":
        (path.parent / "victim").write_text("keep me")
        path.symlink_to("victim")
    elif kind == "dangling symlink":
        path.symlink_to("nowhere")
    elif kind == "FIFO":
        os.mkfifo(path)
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(path.name)  # relative: socket paths are short
        server.close()
    elif kind == "character device":
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a /dev/null of our own
        except PermissionError:
            pytest.skip("cannot make device nodes here")
    else:
        path.mkdir()

    def describe() -> object:
        info = os.lstat(path)
        link = os.readlink(path) if stat.S_ISLNK(info.st_mode) else None
        victim = (path.parent / "victim").read_text() if (path.parent / "victim").exists() else None
        return stat.S_IFMT(info.st_mode), info.st_ino, link, victim, stat.S_ISCHR(os.stat(os.devnull).st_mode)

    return describe


KINDS = {
    "symlink to /dev/null": "a symlink", "symlink to a file": "a symlink", "dangling symlink": "a symlink",
    "FIFO": "a FIFO", "socket": "a socket", "character device": "a character device", "directory": None,
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_an_output_path_that_is_not_a_regular_file_is_left_alone(
    kind: str, tmp_path: Path, artifact: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    describe = special(tmp_path / "out.sarif", kind)
    before = describe()
    code, _, err = run_cli([*CHECK, artifact.name, "--write", "sarif:out.sarif", "--write", "json:ok.json"], capsys)
    reason = f"not a regular file ({KINDS[kind]}); {REFUSED}" if KINDS[kind] else "Is a directory"
    assert (code, messages(err)) == (2, [f"qlint: error: cannot write out.sarif: {reason}"])
    assert describe() == before
    assert (tmp_path / "ok.json").is_file()
    assert not [name for name in files(tmp_path) if name.endswith(".tmp")]


def test_baseline_and_overlay_outputs_are_refused_too(
    tmp_path: Path, artifact: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "me").mkdir()
    (tmp_path / "me" / "attention.pt2.fp32.json").symlink_to(os.devnull)
    (tmp_path / "baseline.json").symlink_to(os.devnull)
    code, _, err = run_cli([*CHECK, artifact.name, "--write", "model-explorer:me"], capsys)
    assert (code, messages(err)) == (
        2, [f"qlint: error: cannot write me: attention.pt2.fp32.json: not a regular file (a symlink); {REFUSED}"])
    code, _, err = run_cli([*CHECK, artifact.name, "--write-baseline", "baseline.json"], capsys)
    assert (code, messages(err)) == (
        2, [f"qlint: error: cannot write baseline baseline.json: not a regular file (a symlink); {REFUSED}"])
    assert os.readlink("baseline.json") == os.readlink("me/attention.pt2.fp32.json") == os.devnull


def test_a_cache_entry_is_not_written_through_a_symlink(
    tmp_path: Path, artifact: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry replaced by a link (a restored cache, say) is not an answer and is not written through."""
    monkeypatch.chdir(tmp_path)
    args = ["check", "--static", "--cache-dir", "cache", artifact.name, "--output-format", "json"]
    first, _, _ = run_cli(args, capsys)
    [entry] = list((tmp_path / "cache").rglob("*.json"))
    (tmp_path / "victim").write_text("keep me")
    entry.unlink()
    entry.symlink_to(tmp_path / "victim")
    second, out, err = run_cli(args, capsys)
    assert (first, second, messages(err)) == (1, 1, [])
    assert json.loads(out)["findings"]
    assert entry.is_symlink() and (tmp_path / "victim").read_text() == "keep me"


@pytest.mark.parametrize("planted", ["attention.pte", "attention.etrecord"])
def test_a_fixed_program_is_not_written_through_a_symlink(
    planted: str, tmp_path: Path, artifact: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`qlint fix model.pt2` writes `model.pte` and `model.etrecord` beside it: a checkout can plant
    either name as a link. The error names that file, and neither is written: a program without its
    record (or a record of another program) would mislead `--profile`."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "victim").write_text("keep me")
    (tmp_path / planted).symlink_to("victim")
    code, _, err = run_cli(["fix", "--no-cache", artifact.name], capsys)
    assert (code, err.splitlines()) == (
        2, [f"qlint: error: attention.pt2: cannot write {planted}: not a regular file (a symlink); {REFUSED}"])
    assert os.readlink(planted) == "victim" and (tmp_path / "victim").read_text() == "keep me"
    assert files(tmp_path) == sorted(["attention.pt2", planted, "victim"])


def test_fixes_of_inputs_with_one_name_keep_their_paths_in_the_output_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`qlint fix --output-dir out a/model.pt2 b/model.pt2` (or `models/`, a tree of `*/model.pt2`):
    each fix goes to its input's path below the inputs' common folder, none over another's, however
    the input is named (relative, absolute)."""
    monkeypatch.chdir(tmp_path)
    for folder in ("a", "b"):
        (tmp_path / "models" / folder).mkdir(parents=True)
        (tmp_path / "models" / folder / "attention.pt2").write_bytes(EXAMPLE.read_bytes())
    code, out, err = run_cli(["fix", "--no-cache", "--output-dir", "out", "models/a/attention.pt2",
                              str(tmp_path / "models" / "b" / "attention.pt2")], capsys)
    assert (code, err) == (0, "")
    assert files(tmp_path / "out") == ["a/attention.etrecord", "a/attention.pte", "b/attention.etrecord",
                                       "b/attention.pte"]
    assert "models/a/attention.pt2: fixed -> out/a/attention.pte" in out
    assert "models/b/attention.pt2: fixed -> out/b/attention.pte" in out


def test_a_fix_is_not_written_where_another_output_goes(
    tmp_path: Path, artifact: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--write json:model.pte` with `--fix` would replace the fixed program with the report: the fix is refused."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["fix", "--no-cache", artifact.name, "--write", "json:./attention.pte"], capsys)
    assert (code, err.splitlines()) == (2, [
        "qlint: error: attention.pt2: --fix would write attention.pte, which --write json:attention.pte names too: "
        "not fixed (give that output another path)"])
    assert files(tmp_path) == ["attention.pt2", "attention.pte"]
    assert json.loads((tmp_path / "attention.pte").read_text())["errors"][0]["artifact"] == "attention.pt2"


# -- Model Explorer overlay names ---------------------------------------------------------------


def short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def test_artifacts_whose_names_flatten_alike_keep_their_own_overlays(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("a/b.pt2", "a_b.pt2", "c.pt2"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(EXAMPLE.read_bytes())
    code, _, err = run_cli([*CHECK, "a", "a_b.pt2", "c.pt2", "--write", "model-explorer:me"], capsys)
    assert (code, messages(err)) == (1, [])
    stems = [f"a_b.pt2-{short_hash('a/b.pt2')}", f"a_b.pt2-{short_hash('a_b.pt2')}", "c.pt2"]
    assert sorted(p.name for p in (tmp_path / "me").iterdir()) == sorted(
        f"{stem}{suffix}" for stem in stems for suffix in (".findings.json", ".fp32.json"))


def test_overlay_names_are_unique_across_case_and_fit_a_file_system() -> None:
    from qlint.report.model_explorer import FINDINGS_SUFFIX, file_stems

    long = "/".join(["d" * 200] * 3) + "/model.pt2"
    stems = file_stems(["A.pt2", "a.pt2", "b.pt2", long])
    assert stems["A.pt2"] == f"A.pt2-{short_hash('A.pt2')}" and stems["a.pt2"] == f"a.pt2-{short_hash('a.pt2')}"
    assert stems["b.pt2"] == "b.pt2"
    assert stems[long].endswith(f"d_model.pt2-{short_hash(long)}")
    assert len((stems[long] + FINDINGS_SUFFIX).encode()) == 255


# -- paths past the OS's limit, trees deeper than Python's recursion ------------------------------


def make_tree(root: Path, parts: list[str]) -> None:
    """Folders `root/parts[0]/parts[1]/...`, made through folder fds (no path is ever too long),
    with the example in the first and the last."""
    fd = os.open(root, os.O_RDONLY)
    try:
        for depth, part in enumerate(parts):
            os.mkdir(part, dir_fd=fd)
            inner = os.open(part, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
            if depth in (0, len(parts) - 1):
                out = os.open("attention.pt2", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
                os.write(out, EXAMPLE.read_bytes())
                os.close(out)
    finally:
        os.close(fd)


def test_a_folder_past_the_path_limit_is_an_error_not_a_pass(tmp_path: Path) -> None:
    """Folders of 200-character names: the 21st ends past PATH_MAX (4,096), where nothing can
    list it by name. The artifact above is checked; the one below is never silently skipped."""
    parts = ["deep"] + ["d" * 200] * 21
    make_tree(tmp_path, parts)
    too_long = "/".join(parts)
    assert len("/".join(parts[:-1])) < 4096 <= len(too_long)
    result = qlint([*CHECK, "deep", f"{too_long}/attention.pt2", "--output-format", "json"], tmp_path)
    assert result.returncode == 2
    assert messages(result.stderr) == [
        f"qlint: error: {too_long}: cannot list this folder: File name too long",
        f"qlint: error: {too_long}/attention.pt2: cannot read: File name too long",
    ]
    assert [s["artifact"] for s in json.loads(result.stdout)["artifacts"]] == ["deep/attention.pt2"]


def remove_chain(root: Path, parts: list[str]) -> None:
    """Remove what `make_tree` made, deepest first: shutil.rmtree (and with it pytest's cleanup of
    old tmp_path folders) recurses once per level and fails on a tree deeper than the recursion limit."""
    for depth in range(len(parts), 0, -1):
        folder = root.joinpath(*parts[:depth])
        for name in os.listdir(folder):
            os.unlink(folder / name)
        os.rmdir(folder)


def test_a_tree_deeper_than_the_recursion_limit_is_walked(tmp_path: Path) -> None:
    parts = ["d"] * 1500  # 3,000 characters: within the path limit
    make_tree(tmp_path, parts)
    try:
        result = qlint([*CHECK, "d", "--output-format", "json"], tmp_path)
    finally:
        remove_chain(tmp_path, parts)
    assert (result.returncode, messages(result.stderr)) == (1, [])
    assert [s["artifact"] for s in json.loads(result.stdout)["artifacts"]] == [
        "d/attention.pt2", "d/" * 1500 + "attention.pt2"]


def test_a_huge_jobs_count_runs_on_the_cpus_there_are(tmp_path: Path, artifact: Path) -> None:
    from qlint.run.engine import workers

    cpus = len(os.sched_getaffinity(0))
    assert [workers(10**9, 3), workers(10**9, 0), workers(2, 10**6), workers(1, 5)] == [min(3, cpus), 1,
                                                                                         min(2, cpus), 1]
    result = qlint([*CHECK, "--jobs", str(10**9), artifact.name, "--output-format", "json"], tmp_path)
    assert (result.returncode, messages(result.stderr)) == (1, [])
    assert [s["artifact"] for s in json.loads(result.stdout)["artifacts"]] == ["attention.pt2"]


# -- numbers past any float -------------------------------------------------------------------


def huge_numbers(target: Path) -> Path:
    """The example with every float argument of its graph replaced by 10**400 (valid JSON)."""
    with zipfile.ZipFile(EXAMPLE) as archive:
        items = [(info.filename, archive.read(info)) for info in archive.infolist()]

    def enlarge(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: 10**400 if k == "as_float" else enlarge(v) for k, v in value.items()}
        return [enlarge(v) for v in value] if isinstance(value, list) else value

    with zipfile.ZipFile(target, "w") as archive:
        for name, data in items:
            archive.writestr(name, json.dumps(enlarge(json.loads(data))) if name.endswith("models/model.json")
                             else data)
    return target


def test_an_artifact_with_a_number_past_any_float_is_corrupt_input(tmp_path: Path, artifact: Path) -> None:
    huge_numbers(tmp_path / "huge.pt2")
    result = qlint([*CHECK, "huge.pt2", artifact.name, "--output-format", "json"], tmp_path)
    assert result.returncode == 2
    [line] = messages(result.stderr)
    assert line.startswith("qlint: error: huge.pt2: ") and "internal error" not in line
    assert [s["artifact"] for s in json.loads(result.stdout)["artifacts"]] == ["attention.pt2"]


@pytest.mark.parametrize(("tier", "module", "function"), [
    (["--static"], "qlint.static.rules", "lint_static"), ([], "qlint.loading.readers", "read_pt2")])
def test_overflow_while_reading_is_an_input_error(
    tier: list[str], module: str, function: str, artifact: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Wherever the reading code lets an OverflowError out, the engine names the artifact as corrupt."""

    def overflow(*args: object) -> None:
        raise OverflowError("int too large to convert to float")

    monkeypatch.setattr(importlib.import_module(module), function, overflow)
    code, _, err = run_cli(["check", *tier, "--no-cache", str(artifact)], capsys)
    assert (code, messages(err)) == (2, [
        f"qlint: error: {artifact}: corrupt artifact: a number out of range (int too large to convert to float)"])


def test_a_config_number_past_any_float(tmp_path: Path, artifact: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "big.yaml"
    config.write_text("limits: {timeout_s: " + "9" * 400 + "}\n")
    code, _, err = run_cli([*CHECK, "--config", str(config), str(artifact)], capsys)
    assert (code, err.splitlines()) == (
        2, [f"qlint: config error: {config}:1: limits.timeout_s: number out of range: {'9' * 80}"])
