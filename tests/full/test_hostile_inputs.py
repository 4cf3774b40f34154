"""Hostile inputs, as an attacker would craft them from the bundled example.

Every attack must end with exit 2 and one stderr line naming the input (or be
linted normally where the input is still a valid program); a sentinel that a
successful exploit would create never appears; the good artifact in the same
run is still reported; runs that read special files, bombs and traps stay
under 1 GiB of memory. Attacks are built here from `examples/attention.pt2`,
never checked in; the plain bad inputs at the end (a missing file, a zip that is not a `.pt2`,
a float program, pickles, broken factories) beside the store's `make_scale` program.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import PROBE, ROOT, cache_entry, rewrite_cache_entry, run_cli, run_json
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLE = ROOT / "examples" / "attention.pt2"
GiB = 1 << 30
FUZZ = settings(max_examples=25, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


class Payload:
    """Unpickling this creates the sentinel folder: it must never happen."""

    def __init__(self, sentinel: Path) -> None:
        self.sentinel = str(sentinel)

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.mkdir, (self.sentinel,))


# -- building attacks --------------------------------------------------------

Entries = list[tuple[str, bytes]]


def entries(path: Path = EXAMPLE) -> Entries:
    with zipfile.ZipFile(path) as archive:
        return [(info.filename, archive.read(info)) for info in archive.infolist()]


def write(path: Path, items: Entries, compress: dict[str, int] | None = None) -> Path:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate names are the point of some attacks
        with zipfile.ZipFile(path, "w") as archive:
            for name, data in items:
                archive.writestr(name, data, compress_type=(compress or {}).get(name, zipfile.ZIP_STORED))
    return path


def replace(items: Entries, suffix: str, data: bytes) -> Entries:
    return [(n, data if n.endswith(suffix) else d) for n, d in items]


def edit_json(items: Entries, suffix: str, change: Callable[[Any], None]) -> Entries:
    def edited(data: bytes) -> bytes:
        value = json.loads(data)
        change(value)
        return json.dumps(value).encode()

    return [(n, edited(d) if n.endswith(suffix) else d) for n, d in items]


def pickled(sentinel: Path) -> bytes:
    return pickle.dumps(Payload(sentinel))


def torch_saved(value: Any) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def constant(path_name: str, use_pickle: bool) -> bytes:
    return json.dumps({"config": {"evil": {"path_name": path_name, "is_param": False, "use_pickle": use_pickle,
                                           "tensor_meta": None}}}).encode()


def opaque_constant(items: Entries, sentinel: Path) -> Entries:
    return replace(items, "model_constants_config.json", constant("opaque_obj_0", True)) + [
        ("attention/data/constants/opaque_obj_0", pickled(sentinel))]


def renamed(items: Entries, sentinel: Path) -> Entries:
    """The program called `foo`: torch reads foo_constants_config.json, which qlint once never looked at."""
    names = {"models/model.json": "models/foo.json", "sample_inputs/model.pt": "sample_inputs/foo.pt",
             "model_weights_config": "foo_weights_config", "model_constants_config": "foo_constants_config"}
    out = []
    for name, data in opaque_constant(items, sentinel):
        for old, new in names.items():
            name = name.replace(old, new)
        out.append((name, data))
    return out


def duplicate(items: Entries, sentinel: Path, evil_first: bool) -> Entries:
    """Two central-directory entries of one name: zip readers disagree on which one is read."""
    name = next(n for n, _ in items if n.endswith("model_constants_config.json"))
    harmless = dict(items)[name]
    evil = constant("opaque_obj_0", True)
    pair = [(name, evil), (name, harmless)] if evil_first else [(name, harmless), (name, evil)]
    payload = ("attention/data/constants/opaque_obj_0", pickled(sentinel))
    return [(n, d) for n, d in items if n != name] + pair + [payload]


def first_node(program: Any) -> dict[str, Any]:
    return program["graph_module"]["graph"]["nodes"][0]


def node_target(program: Any) -> None:
    first_node(program)["target"] = "torch.serialization.os.system"


def sympy_shape(program: Any, sentinel: Path) -> None:
    tensors = program["graph_module"]["graph"]["tensor_values"]
    meta = tensors[next(iter(tensors))]
    meta["sizes"][0] = {"as_expr": {"expr_str": f"__import__('os').mkdir({str(sentinel)!r})", "hint": {"as_int": 1}}}


ATTACKS: dict[str, tuple[Callable[[Entries, Path], Entries], str]] = {
    "opaque-constant": (opaque_constant, "constant 'evil' is a pickled object; qlint loads plain tensors only"),
    "custom-object-constant": (
        lambda e, s: replace(e, "model_constants_config.json", constant("custom_obj_0", False))
        + [("attention/data/constants/custom_obj_0", pickled(s))],
        "constant 'evil' is a pickled object; qlint loads plain tensors only",
    ),
    "pickled-tensor-constant": (
        lambda e, s: replace(e, "model_constants_config.json", constant("tensor_0", True))
        + [("attention/data/constants/tensor_0", pickled(s))],
        "constant 'evil' is a pickled object; qlint loads plain tensors only",
    ),
    "pickled-weight": (
        lambda e, s: edit_json(
            e, "model_weights_config.json", lambda c: c["config"]["_tensor_constant0"].update(use_pickle=True)
        ),
        "weight '_tensor_constant0' is a pickled object; qlint loads plain tensors only",
    ),
    "renamed-program": (
        renamed,
        "holds a program named 'models/foo.json'; torch.export.save writes 'models/model.json'",
    ),
    "second-program": (
        lambda e, s: e
        + [
            (n.replace("models/model.", "models/foo.").replace("/model_", "/foo_"), d)
            for n, d in opaque_constant(e, s)
            if n.endswith(("models/model.json", "model_constants_config.json", "opaque_obj_0"))
        ],
        "holds 2 programs; qlint reads archives with one",
    ),
    "config-for-another-name": (
        lambda e, s: e
        + [
            ("attention/data/constants/foo_constants_config.json", constant("opaque_obj_0", True)),
            ("attention/data/constants/opaque_obj_0", pickled(s)),
        ],
        "unexpected entry 'data/constants/foo_constants_config.json'",
    ),
    "legacy-weights": (
        lambda e, s: e + [("attention/data/weights/model.pt", pickled(s))],
        "uses the legacy pickled weight format; re-save it with torch.export.save",
    ),
    "aotinductor-library": (
        lambda e, s: e + [("attention/data/aotinductor/model/evil.so", b"\x7fELF")],
        "unexpected entry 'data/aotinductor/model/evil.so'",
    ),
    "sample-inputs": (
        lambda e, s: replace(e, "sample_inputs/model.pt", torch_saved(((Payload(s),), {}))),
        "sample inputs are not plain tensors: Trying to load unsupported GLOBAL posix.mkdir",
    ),
    "duplicate-evil-first": (lambda e, s: duplicate(e, s, True), "appears more than once"),
    "duplicate-evil-last": (lambda e, s: duplicate(e, s, False), "appears more than once"),
    "node-target": (
        lambda e, s: edit_json(e, "models/model.json", node_target),
        "a node calls 'torch.serialization.os.system', outside the operator namespaces qlint runs",
    ),
    "sympy-shape": (
        lambda e, s: edit_json(e, "models/model.json", lambda p: sympy_shape(p, s)),
        "holds a symbolic shape",
    ),
    "range-constraints": (
        lambda e, s: edit_json(
            e,
            "models/model.json",
            lambda p: p.update(range_constraints={"u99999999999": {"min_val": 0, "max_val": 10}}),
        ),
        "declares symbolic shapes (range_constraints)",
    ),
    "custom-object-argument": (
        lambda e, s: edit_json(
            e,
            "models/model.json",
            lambda p: first_node(p)["inputs"][0].update(
                arg={"as_custom_obj": {"name": "obj0", "class_fqn": "__torch__.torch.classes.x"}}
            ),
        ),
        "holds a custom object",
    ),
    "subgraph-argument": (
        lambda e, s: edit_json(
            e,
            "models/model.json",
            lambda p: first_node(p)["inputs"][0].update(arg={"as_graph": {"name": "g", "graph": {}}}),
        ),
        "holds a subgraph",
    ),
    "huge-declared-tensor": (
        lambda e, s: edit_json(
            e,
            "models/model.json",
            lambda p: next(iter(p["graph_module"]["graph"]["tensor_values"].values()))["sizes"].__setitem__(
                0, {"as_int": 1 << 40}
            ),
        ),
        "its tensors declare over 268435456 bytes",
    ),
    "deeply-nested-json": (
        lambda e, s: replace(e, "models/model.json", b"[" * 200_000),
        "corrupt models/model.json: RecursionError",
    ),
}


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("good")
    path = folder / "attention.pt2"
    path.write_bytes(EXAMPLE.read_bytes())
    return path


def assert_refused(
    args: list[str], capsys: pytest.CaptureFixture[str], bad: str, good: Path, sentinel: Path | None = None
) -> str:
    """Exit 2, one stderr line naming `bad`, the good artifact still linted; the error message."""
    code, out, err = run_cli(["check", *args, str(good), "--output-format", "json"], capsys)
    data = json.loads(out)
    assert code == 2, data
    [error] = data["errors"]
    [line] = err.strip().splitlines()
    assert line == f"qlint: error: {error['artifact']}: {error['message']}"
    assert bad in error["artifact"]
    assert [s["artifact"] for s in data["artifacts"]] == [str(good)]
    assert [f["code"] for f in data["findings"]][:1] == ["QL001"]
    assert sentinel is None or not sentinel.exists()
    return str(error["message"])


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_crafted_archive_is_refused_and_runs_nothing(
    attack: str, tmp_path: Path, good: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build, expected = ATTACKS[attack]
    sentinel = tmp_path / "code-ran"
    bad = write(tmp_path / f"{attack}.pt2", build(entries(), sentinel))
    message = assert_refused([str(bad)], capsys, bad.name, good, sentinel)
    assert expected in message


def test_zip_that_torch_and_python_read_differently(
    tmp_path: Path, good: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Python's zipfile accepts data before the first entry; torch's reader does not: refused."""
    bad = tmp_path / "prepended.pt2"
    bad.write_bytes(b"PK\x03\x04" + b"\0" * 400 + EXAMPLE.read_bytes())
    message = assert_refused([str(bad)], capsys, "prepended.pt2", good)
    assert message == (
        "torch's zip reader rejects it: PytorchStreamReader failed reading zip archive: "
        "invalid header or archive is corrupted"
    )


def test_torch_itself_would_run_the_renamed_and_duplicate_archives(tmp_path: Path) -> None:
    """The two archives qlint once loaded do run code under plain torch.export.load (why they are refused)."""
    import torch

    from qlint.loading import stack

    stack.load()
    for attack in ("renamed-program", "duplicate-evil-first"):
        sentinel = tmp_path / f"ran-{attack}"
        bad = write(tmp_path / f"{attack}.pt2", ATTACKS[attack][0](entries(), sentinel))
        try:
            torch.export.load(str(bad))
        except Exception:  # noqa: BLE001 - whether it then fails does not matter: the payload ran
            pass
        assert sentinel.exists()


def test_guard_code_is_never_compiled(tmp_path: Path, good: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """guards_code is Python that `ExportedProgram.module()` would compile: qlint drops it, and lints the program."""
    sentinel = tmp_path / "code-ran"
    items = edit_json(
        entries(), "models/model.json", lambda p: p.update(guards_code=[f"__import__('os').mkdir({str(sentinel)!r})"])
    )
    program = write(tmp_path / "guards.pt2", items)
    for args in (["check", str(program)], ["check", "--fix", "--diff", str(program)]):
        code, out, _ = run_cli([*args, "--output-format", "json"], capsys)
        assert code == 1 and json.loads(out)["errors"] == []
    assert not sentinel.exists()


def test_stack_trace_with_a_huge_line_number_is_linted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def huge(program: Any) -> None:
        for node in program["graph_module"]["graph"]["nodes"]:
            node["metadata"]["stack_trace"] = f'  File "/model.py", line {"9" * 5000}, in forward\n    x\n'

    program = write(tmp_path / "lines.pt2", edit_json(entries(), "models/model.json", huge))
    code, out, _ = run_cli(["check", str(program), "--output-format", "json"], capsys)
    data = json.loads(out)
    assert code == 1 and data["errors"] == [] and data["findings"][0]["location"] is None


# -- decompression bombs ---------------------------------------------------------


@pytest.fixture(scope="module")
def bombs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A program JSON and a sample-inputs entry that each inflate to 2 GiB: archives of about 10 MB at
    deflate's fastest level, which writes them 2.5 times faster than its default (archives of 2 MB)."""
    folder = tmp_path_factory.mktemp("bombs")
    zeros = b"\0" * (64 << 20)

    def bomb_zip(path: Path, name: str, others: Entries) -> Path:
        with zipfile.ZipFile(path, "w", compresslevel=1) as archive:
            for other, data in others:
                archive.writestr(other, data)
            info = zipfile.ZipInfo(name)
            info.compress_type = zipfile.ZIP_DEFLATED
            with archive.open(info, "w", force_zip64=True) as handle:
                for _ in range(32):
                    handle.write(zeros)
        return path

    items = entries()
    json_bomb = bomb_zip(
        folder / "json-bomb.pt2",
        "attention/models/model.json",
        [(n, d) for n, d in items if not n.endswith("models/model.json")],
    )
    nested = bomb_zip(folder / "inputs.pt", "model/data/0", [("model/data.pkl", b"")])
    inputs_bomb = write(folder / "inputs-bomb.pt2", replace(items, "sample_inputs/model.pt", nested.read_bytes()))
    return {"json": json_bomb, "inputs": inputs_bomb}


def test_decompression_bombs_are_refused_before_inflating(
    bombs: dict[str, Path], good: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bombs["json"].stat().st_size < 16 << 20
    message = assert_refused([str(bombs["json"])], capsys, "json-bomb.pt2", good)
    assert message == (
        "entry 'attention/models/model.json' inflates to 2147483648 bytes, "
        "over the 33554432-byte entry limit (limits in .qlint.yaml)"
    )
    message = assert_refused([str(bombs["inputs"])], capsys, "inputs-bomb.pt2", good)
    assert message.startswith("sample inputs: entry 'model/data/0' inflates to 2147483648 bytes")


# -- byte flips and JSON mutations -------------------------------------------


def assert_linted_or_refused(bad: Path, good: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["check", str(bad), str(good), "--output-format", "json"], capsys)
    data = json.loads(out)
    assert code in (1, 2), err
    assert str(good) in [s["artifact"] for s in data["artifacts"]]
    lines = err.strip().splitlines()
    if code == 2:
        [error] = data["errors"]
        assert lines == [f"qlint: error: {error['artifact']}: {error['message']}"]
        assert error["artifact"] == str(bad)
        assert not error["message"].startswith("internal error"), error["message"]
    else:
        assert data["errors"] == [] and lines == []


@FUZZ
@given(
    flips=st.lists(st.tuples(st.integers(0, EXAMPLE.stat().st_size - 1), st.integers(1, 255)), min_size=1, max_size=4)
)
def test_byte_flips(
    flips: list[tuple[int, int]], tmp_path: Path, good: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = bytearray(EXAMPLE.read_bytes())
    for offset, mask in flips:
        data[offset] ^= mask
    bad = tmp_path / "flipped.pt2"
    bad.write_bytes(bytes(data))
    assert_linted_or_refused(bad, good, capsys)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=8,
)


def json_paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    paths = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            paths += json_paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value[:3]):
            paths += json_paths(item, (*prefix, index))
    return paths


MODEL_JSON = json.loads(dict(entries())["attention/models/model.json"])
MODEL_PATHS = [p for p in json_paths(MODEL_JSON) if p]


@FUZZ
@given(path=st.sampled_from(MODEL_PATHS), value=JSON_VALUES)
def test_json_mutations(
    path: tuple[Any, ...], value: Any, tmp_path: Path, good: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def change(program: Any) -> None:
        parent = program
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = value

    bad = write(tmp_path / "mutated.pt2", edit_json(entries(), "models/model.json", change))
    assert_linted_or_refused(bad, good, capsys)


# -- special files, stack-trace traps, memory ---------------------------------


def probe(args: list[str], cwd: Path, timeout: float = 300) -> tuple[int, str, str, int]:
    """qlint in a fresh interpreter: exit code, stdout, stderr without the probe line, peak RSS in bytes."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout
    )
    lines = result.stderr.splitlines()
    [rss] = [int(line.split("=")[1]) for line in lines if line.startswith("MAXRSS_KB=")]
    err = "\n".join(line for line in lines if not line.startswith("MAXRSS_KB="))
    return result.returncode, result.stdout, err, rss * 1024


def test_special_files_do_not_hang_and_stay_bounded(tmp_path: Path, good: Path) -> None:
    fifo = tmp_path / "fifo.pt2"
    os.mkfifo(fifo)
    (tmp_path / "zero.pt2").symlink_to("/dev/zero")
    (tmp_path / "zero.pte").symlink_to("/dev/zero")
    walked = tmp_path / "walked"
    walked.mkdir()
    os.mkfifo(walked / "inside.pt2")
    (walked / "loop").symlink_to(walked)  # a symlinked folder is never followed
    args = ["check", "--no-cache", "fifo.pt2", "zero.pt2", "zero.pte", "walked", str(good), "--output-format", "json"]
    code, out, err, rss = probe(args, tmp_path, timeout=120)
    data = json.loads(out)
    assert code == 2
    assert sorted(e["artifact"] for e in data["errors"]) == ["fifo.pt2", "walked/inside.pt2", "zero.pt2", "zero.pte"]
    assert sorted(err.splitlines()) == sorted(f"qlint: error: {e['artifact']}: {e['message']}" for e in data["errors"])
    assert {e["message"] for e in data["errors"]} == {
        "not a regular artifact (a FIFO)",
        "not a regular artifact (a character device)",
        "not a regular file",
    }
    assert [s["artifact"] for s in data["artifacts"]] == [str(good)]
    assert rss < GiB


def test_oversized_artifact_is_refused_unread(tmp_path: Path, good: Path, capsys: pytest.CaptureFixture[str]) -> None:
    big = tmp_path / "big.pt2"
    with open(big, "wb") as handle:
        handle.truncate(65 << 20)  # sparse: costs no disk
    message = assert_refused([str(big)], capsys, "big.pt2", good)
    assert message == "artifact is 68157440 bytes, over the 67108864-byte limit (limits.file_mb in .qlint.yaml)"


def test_bombs_and_traps_stay_under_a_gibibyte(bombs: dict[str, Path], tmp_path: Path) -> None:
    """The stack traces name /dev/zero, and a link inside the repository to it: suppressions read neither."""

    def trap(program: Any) -> None:
        for index, node in enumerate(program["graph_module"]["graph"]["nodes"]):
            target = "/dev/zero" if index % 2 else str(tmp_path / "trap.py")
            node["metadata"]["stack_trace"] = f'  File "{target}", line 1, in forward\n    x = x / 4\n'

    (tmp_path / "trap.py").symlink_to("/dev/zero")
    (tmp_path / ".qlint.yaml").write_text("rules: {QL006: warning}\n")
    write(tmp_path / "trap.pt2", edit_json(entries(), "models/model.json", trap))
    code, out, err, rss = probe(
        ["check", "--no-cache", "trap.pt2", str(bombs["json"]), str(bombs["inputs"]), "--output-format", "json"],
        tmp_path,
        timeout=300,
    )
    data = json.loads(out)
    assert code == 2 and len(err.splitlines()) == 2
    shown = {f["location"]["path"] for f in data["findings"] if f["location"]}
    assert shown and all(p == "/dev/zero" or p.endswith("trap.py") for p in shown), shown
    assert [f["code"] for f in data["findings"]][:1] == ["QL001"]
    assert rss < GiB


# -- hostile configs ------------------------------------------------------------

HOSTILE_CONFIGS = {
    "not-utf8": b"target_cpu: cortex-m55\n# \xff\xfe\n",
    "float-tag-on-text": b'coverage_threshold: !!float "abc"\n',
    "timestamp-tag": b"coverage_threshold: !!timestamp 2001-13-45\n",
    "python-tag-on-scalar": b"target_cpu: !!python/name:os.system\n",
    "python-apply": b'include: [!!python/object/apply:os.system ["touch hacked"]]\n',
    "binary-tag": b"target_cpu: !!binary aGVsbG8=\n",
    "application-tag": b"target_cpu: !evil cortex-m55\n",
    "tagged-key": b"!!python/name:os.system : 1\n",
    "deep-nesting": b"include: " + b"[" * 5000 + b"]" * 5000 + b"\n",
    "alias-bomb": b"a: &a [x, x]\nb: &b [*a, *a]\nc: &c [*b, *b]\ninclude: [*c, *c]\n",
    "too-large": b"# " + b"x" * (2 << 20) + b"\n",
    "negative-timeout": b"limits: {timeout_s: -1}\n",
    "nan-limit": b"limits: {file_mb: .nan}\n",
    "infinite-limit": b"limits: {entry_mb: .inf}\n",
    "unknown-limit": b"limits: {memory: 1}\n",
}


@pytest.mark.parametrize("name", list(HOSTILE_CONFIGS))
def test_hostile_config_is_one_line(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / ".qlint.yaml"
    config.write_bytes(HOSTILE_CONFIGS[name])
    code, out, err = run_cli(["check", "--config", str(config), str(tmp_path)], capsys)
    [line] = err.strip().splitlines()
    assert code == 2 and line.startswith(f"qlint: config error: {config}:"), err
    assert not (tmp_path / "hacked").exists()


def test_special_config_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    (tmp_path / "zero.yaml").symlink_to("/dev/zero")
    for name, kind in (("fifo.yaml", "a FIFO"), ("zero.yaml", "a character device")):
        code, _, err = run_cli(["check", "--config", str(tmp_path / name), str(tmp_path)], capsys)
        assert code == 2
        assert err.strip() == f"qlint: config error: {tmp_path / name}:0: <file>: not a regular config file ({kind})"


YAML_TOKENS = st.sampled_from(
    [
        "target_cpu",
        "include",
        "exclude",
        "rules",
        "QL001",
        "fold",
        "limits",
        "timeout_s",
        "file_mb",
        "targets",
        "factory",
        "name",
        "coverage_threshold",
        "max_elements",
        ":",
        " ",
        "\n",
        "  ",
        "- ",
        "[",
        "]",
        "{",
        "}",
        ",",
        "!!float",
        "!!str",
        "!!python/name:os.system",
        "!!timestamp",
        "&a",
        "*a",
        "off",
        "1e999",
        "-1",
        ".nan",
        "'",
        '"',
        "\t",
        "#",
        "cortex-m4",
        "\xff",
        "~",
        "?",
        "|",
        ">",
    ]
)


@FUZZ
@given(tokens=st.lists(YAML_TOKENS, max_size=40))
def test_config_fuzz_never_raises(tokens: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "fuzz.yaml"
    config.write_text("".join(tokens), encoding="utf-8", errors="surrogateescape")
    empty = tmp_path / "empty"
    empty.mkdir(exist_ok=True)
    code, _, err = run_cli(["check", "--config", str(config), str(empty)], capsys)
    lines = err.strip().splitlines()
    assert (code, lines) == (0, ["qlint: warning: no artifacts found"]) or (
        code == 2 and len(lines) == 1 and lines[0].startswith("qlint: config error: ")
    ), err


# -- factories ----------------------------------------------------------------------

FACTORIES = """\
import ctypes, os, sys, time
import torch


class Scale(torch.nn.Module):
    def forward(self, x):
        return x / 3.0


def exits():
    sys.exit(0)


def hard_exit():
    os._exit(0)


def crash():
    ctypes.string_at(0)


def hangs():
    time.sleep(3600)


def noisy():
    print("chatter from the model code")
    print("more chatter", file=sys.stderr)
    return Scale(), (torch.randn(1, 8),)
"""

OPS_AT_IMPORT = """\
import torch

# Registering operators at import works once per process, as Python imports a module once.
LIBRARY = torch.library.Library("qlint_hostile", "DEF")
LIBRARY.define("double(Tensor x) -> Tensor")


class Scale(torch.nn.Module):
    def forward(self, x):
        return x * 0.5


def first():
    return Scale(), (torch.randn(1, 8),)


def second():
    return Scale(), (torch.randn(1, 16),)
"""


def factory_project(tmp_path: Path, targets: list[tuple[str, str]], extra: str = "") -> Path:
    """A repository with model factories, a good .pt2 and a config naming the targets."""
    (tmp_path / "attention.pt2").write_bytes(EXAMPLE.read_bytes())
    (tmp_path / "models.py").write_text(FACTORIES)
    (tmp_path / "exit_at_import.py").write_text("import sys\nsys.exit(0)\n")
    (tmp_path / "ops_at_import.py").write_text(OPS_AT_IMPORT)
    lines = ["targets:"] + [f"  - name: {name}\n    factory: {factory}" for name, factory in targets]
    config = tmp_path / ".qlint.yaml"
    config.write_text("\n".join(lines) + "\n" + extra)
    return config


def test_factories_that_exit_or_crash_are_one_line_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    factory_project(
        tmp_path,
        [
            ("at-import", "exit_at_import:make"),
            ("exits", "models:exits"),
            ("hard-exit", "models:hard_exit"),
            ("crash", "models:crash"),
            ("noisy", "models:noisy"),
            ("stdlib", "os:getcwd"),
        ],
    )
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["check", "--output-format", "json"], capsys)  # targets and "."
    data = json.loads(out)  # factory output never reaches stdout
    assert code == 2
    errors = {e["artifact"]: e["message"] for e in data["errors"]}
    assert errors == {
        "target:at-import": "importing exit_at_import called sys.exit(0)",
        "target:exits": "factory models:exits called sys.exit(0) instead of returning",
        "target:hard-exit": "its process ended without a result (exit code 0)",
        "target:crash": "its process ended without a result (killed by SIGSEGV)",
        "target:stdlib": "os is not a module file of this repository (built in); factories are imported "
        "from the repository only",
    }
    assert sorted(err.strip().splitlines()) == sorted(f"qlint: error: {a}: {m}" for a, m in errors.items())
    assert [s["artifact"] for s in data["artifacts"]] == ["attention.pt2", "target:noisy"]
    assert {f["artifact"] for f in data["findings"] if f["code"] == "QL001"} == {"attention.pt2", "target:noisy"}


def test_hanging_factory_times_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    factory_project(tmp_path, [("hangs", "models:hangs")], "limits: {timeout_s: 3}\n")
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["check", "--output-format", "json"], capsys)
    data = json.loads(out)
    assert code == 2
    assert err.strip() == (
        "qlint: error: target:hangs: did not finish within 3 s (limits.timeout_s in .qlint.yaml); stopped"
    )
    assert [s["artifact"] for s in data["artifacts"]] == ["attention.pt2"]


def test_two_targets_from_a_module_that_registers_operators(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = factory_project(tmp_path, [("first", "ops_at_import:first"), ("second", "ops_at_import:second")])
    code, out, err = run_cli(["check", "--config", str(config), "--targets-only", "--output-format", "json"], capsys)
    data = json.loads(out)
    assert data["errors"] == [] and code == 1, err
    assert [s["artifact"] for s in data["artifacts"]] == ["target:first", "target:second"]
    assert [f["code"] for f in data["findings"] if f["code"] == "QL001"] == ["QL001", "QL001"]


# -- the cache believes nothing ------------------------------------------------------------

TAMPERED: dict[str, Callable[[dict[str, Any]], Any]] = {
    "severity-number": lambda e: [f.update(severity=123) for f in e["findings"]],
    "message-dict": lambda e: [f.update(message={"x": 1}) for f in e["findings"]],
    "empty-but-well-formed": lambda e: e.update(findings=[], stats=[]),
    "another-artifact": lambda e: [s.update(artifact="other.pt2") for s in e["stats"]],
    "unknown-rule": lambda e: [f.update(code="QL999") for f in e["findings"]],
    "extra-field": lambda e: [f.update(evil=True) for f in e["findings"]],
    "location-line-text": lambda e: [
        f.update(location={"path": "x", "line": "1", "code": "", "file": ""}) for f in e["findings"]
    ],
    "bool-for-count": lambda e: [s.update(nodes=True) for s in e["stats"]],
}


@pytest.mark.parametrize("tamper", list(TAMPERED))
def test_tampered_cache_entry_is_recomputed(
    tamper: str, tmp_path: Path, good: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    args = ["check", "--cache-dir", str(cache), str(good), "--output-format", "json"]
    code, out, _ = run_cli(args, capsys)
    [entry] = list(cache.rglob("*.json"))
    honest = cache_entry(entry)
    tampered = cache_entry(entry)
    TAMPERED[tamper](tampered)
    rewrite_cache_entry(entry, tampered)  # signed: its fields alone decide
    again_code, again, _ = run_cli(args, capsys)
    assert (again_code, json.loads(again)) == (code, json.loads(out))
    assert cache_entry(entry) == honest  # rewritten


def test_unreadable_cache_entries(tmp_path: Path, good: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache = tmp_path / "cache"
    args = ["check", "--cache-dir", str(cache), str(good), "--output-format", "json"]
    code, out, _ = run_cli(args, capsys)
    [entry] = list(cache.rglob("*.json"))
    for body in (b"\xff\xfe", b"[" * 100_000, b"null", b'{"schema": 1}'):
        entry.write_bytes(body)
        assert run_cli(args, capsys)[:2] == (code, out)
    entry.unlink()
    os.mkfifo(entry)
    assert run_cli(args, capsys)[:2] == (code, out)


# -- leftovers, empty runs, names, baselines -----------------------------------------------


def test_empty_inputs_say_nothing_was_checked(tmp_path: Path, good: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    code, out, err = run_cli(["check", str(empty)], capsys)
    assert (code, err.strip()) == (0, "qlint: warning: no artifacts found")
    assert out.strip().endswith("No artifacts checked.")
    code, _, err = run_cli(["check", str(good), "--shard", "2/2"], capsys)
    assert (code, err.strip()) == (0, "qlint: warning: no artifacts found in shard 2/2")


def test_a_name_with_a_newline_stays_on_one_line(
    tmp_path: Path, good: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "two\nlines\x1b[2J.pt2"
    bad.write_bytes(b"junk")
    code, _, err = run_cli(["check", str(bad), str(good)], capsys)
    [line] = err.strip().splitlines()
    assert code == 2 and line.endswith("two\\nlines\\x1b[2J.pt2: not a .pt2 archive (not a zip file)")


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            '{"qlint-baseline": 1, "findings": [{"key": "k", "count": 1e999}]}',
            "entry 1 is not {key: text, count: whole number >= 0}",
        ),
        (
            '{"qlint-baseline": 1, "findings": [{"key": "k", "count": -1}]}',
            "entry 1 is not {key: text, count: whole number >= 0}",
        ),
        ('{"qlint-baseline": 1, "findings": {}}', "not a qlint baseline (no qlint-baseline: 1 and findings list)"),
        ("[]", "not a qlint baseline (no qlint-baseline: 1 and findings list)"),
        ("[" * 100_000, "not a qlint baseline (RecursionError)"),
    ],
)
def test_hostile_baseline(
    body: str, expected: str, tmp_path: Path, good: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    baseline = tmp_path / "baseline.json"
    baseline.write_text(body)
    code, _, err = run_cli(["check", str(good), "--baseline", str(baseline)], capsys)
    assert (code, err.strip()) == (2, f"qlint: error: {baseline}: {expected}")


def test_baseline_that_cannot_be_written(tmp_path: Path, good: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for target, reason in (
        (tmp_path / "missing" / "b.json", "No such file or directory"),
        (tmp_path, "Is a directory"),
    ):
        code, _, err = run_cli(["check", str(good), "--write-baseline", str(target)], capsys)
        assert (code, err.strip()) == (2, f"qlint: error: cannot write baseline {target}: {reason}")


def test_limits_are_configurable(tmp_path: Path, good: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / ".qlint.yaml"
    config.write_text(
        textwrap.dedent("""\
        limits:
          file_mb: 0.01
        """)
    )
    code, out, err = run_cli(["check", "--config", str(config), str(good), "--output-format", "json"], capsys)
    assert code == 2
    assert json.loads(out)["errors"][0]["message"] == (
        f"artifact is {good.stat().st_size} bytes, over the 10485-byte limit (limits.file_mb in .qlint.yaml)"
    )


# -- shipped programs ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory, good: Path) -> Path:
    """The .pte that `qlint fix` writes for the bundled example."""
    from qlint.cli.main import main

    folder = tmp_path_factory.mktemp("shipped")
    assert main(["fix", "--output-dir", str(folder), str(good), "--quiet"]) in (0, 1)
    return folder / "attention.pte"


class Shared:
    """A flatbuffer table packed once and referenced by every slot that holds it."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.offset = inner, None

    def Pack(self, builder: Any) -> int:  # noqa: N802 - the flatbuffers object API's name
        if self.offset is None:
            self.offset = self.inner.Pack(builder)
        return self.offset


def test_pte_whose_tables_are_shared_stays_in_its_memory_budget(
    shipped: Path, tmp_path: Path, good: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 1.5 MB .pte whose 100,000 constant buffers are one 1 MiB buffer decodes to 100 GB."""
    import flatbuffers
    from executorch.exir._serialize._flatbuffer_program import _patch_generated_flatbuffer_aliases
    from executorch.exir._serialize.generated.executorch_flatbuffer.Buffer import BufferT
    from executorch.exir._serialize.generated.executorch_flatbuffer.Program import ProgramT

    _patch_generated_flatbuffer_aliases()
    data = shipped.read_bytes()
    program = ProgramT.InitFromPackedBuf(data)
    buffer = BufferT()
    buffer.storage = bytes(1 << 20)
    program.constantBuffer = [Shared(buffer)] * 100_000
    builder = flatbuffers.Builder()
    builder.Finish(program.Pack(builder), file_identifier=data[4:8])
    bomb = tmp_path / "shared.pte"
    bomb.write_bytes(bytes(builder.Output()))
    assert bomb.stat().st_size < 2 << 20
    config = tmp_path / ".qlint.yaml"
    config.write_text("limits: {memory_mb: 512, timeout_s: 120}\n")
    message = assert_refused(["--config", str(config), str(bomb)], capsys, "shared.pte", good)
    assert message == "needed more than its 512 MiB memory budget (limits.memory_mb in .qlint.yaml)"


def test_pte_special_and_corrupt(shipped: Path, tmp_path: Path, good: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = bytearray(shipped.read_bytes())
    data[len(data) // 2 :] = bytes(len(data) - len(data) // 2)
    bad = tmp_path / "truncated.pte"
    bad.write_bytes(bytes(data))
    message = assert_refused([str(bad)], capsys, "truncated.pte", good)
    assert message.startswith(("not a valid .pte program", "internal error")), message


def _tampered_pte(shipped: Path, folder: Path, name: str, change: Callable[[Any, list[Any]], None]) -> Path:
    """The shipped .pte with its values changed by `change(plan, calls)`; calls are (operator name, call).
    ExecuTorch's own serializer writes it back, constants in their segment as usual."""
    from executorch.exir._serialize._program import PTEFile, deserialize_pte_binary, serialize_pte_binary

    program = deserialize_pte_binary(shipped.read_bytes()).program
    plan = program.execution_plan[0]
    calls = [(plan.operators[i.instr_args.op_index].name, i.instr_args)
             for i in plan.chains[0].instructions if hasattr(i.instr_args, "op_index")]
    change(plan, calls)
    path = folder / name
    path.write_bytes(bytes(serialize_pte_binary(PTEFile(program=program))))
    return path


def test_pte_whose_recorded_shapes_or_constants_lie_is_refused(
    shipped: Path, tmp_path: Path, good: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Recorded shapes decide which in-graph constants qlint computes: a shape the operator does
    not compute, or a constant longer than its bytes, is refused before anything runs."""

    def wrong_shape(plan: Any, calls: list[Any]) -> None:
        transpose = next(call for name, call in calls if name == "cortex_m::transpose")
        plan.values[transpose.args[-1]].val.sizes = [1, 2, 3]

    def short_constant(plan: Any, calls: list[Any]) -> None:
        constant = next(plan.values[a].val for _, call in calls for a in call.args
                        if getattr(plan.values[a].val, "data_buffer_idx", 0) > 0)
        constant.sizes = [1 << 20]

    shape = _tampered_pte(shipped, tmp_path, "shape.pte", wrong_shape)
    message = assert_refused([str(shape)], capsys, "shape.pte", good)
    assert message.startswith(
        "not a valid .pte program: cortex_m.transpose.default: the program records [1, 2, 3]"), message
    short = _tampered_pte(shipped, tmp_path, "short.pte", short_constant)
    message = assert_refused([str(short)], capsys, "short.pte", good)
    assert message.startswith("not a valid .pte program: value ") and "bytes in a buffer of" in message, message


# -- plain bad input: one line naming the file, exit 2, the other inputs still checked ---------

@pytest.fixture(scope="module")
def scale_pt2(pt2_dir: Callable[[str], Path]) -> Path:
    return pt2_dir("make_scale")


def rewrite_zip(source: Path, target: Path, replace: dict[str, bytes]) -> None:
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w") as dst:
        for item in src.infolist():
            data = replace.get(item.filename, src.read(item.filename))
            dst.writestr(item, data)


def member(path: Path, suffix: str) -> str:
    with zipfile.ZipFile(path) as archive:
        return next(n for n in archive.namelist() if n.endswith(suffix))


def check_bad(args: list[str], capsys: pytest.CaptureFixture[str], scale_pt2: Path) -> tuple[str, dict]:
    code, out, err = run_cli([*args, str(scale_pt2), "--output-format", "json"], capsys)
    data = json.loads(out)
    assert code == 2
    assert len(data["errors"]) == 1
    [line] = err.strip().splitlines()  # one line on stderr, naming the artifact
    assert line == f"qlint: error: {data['errors'][0]['artifact']}: {data['errors'][0]['message']}"
    # The good artifact is still checked.
    assert [s["artifact"] for s in data["artifacts"]] == [data["artifacts"][0]["artifact"]]
    assert data["artifacts"][0]["artifact"].endswith(scale_pt2.name)
    return data["errors"][0]["message"], data


def test_missing_path(tmp_path: Path, scale_pt2: Path, capsys: pytest.CaptureFixture[str]) -> None:
    message, _ = check_bad(["check", str(tmp_path / "nope.pt2")], capsys, scale_pt2)
    assert message == "no such file or directory"


def test_not_a_zip(tmp_path: Path, scale_pt2: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "text.pt2"
    bad.write_text("hello")
    message, _ = check_bad(["check", str(bad)], capsys, scale_pt2)
    assert message == "not a .pt2 archive (not a zip file)"
    assert bad.read_text() == "hello"  # inputs are never modified


def test_zip_that_is_not_a_pt2(tmp_path: Path, scale_pt2: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "other.pt2"
    with zipfile.ZipFile(bad, "w") as archive:
        archive.writestr("readme.txt", "hi")
    message, _ = check_bad(["check", str(bad)], capsys, scale_pt2)
    assert message == "not a .pt2 archive from torch.export.save (no models/*.json)"


def test_unquantized_pt2(tmp_path: Path, scale_pt2: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "float.pt2"
    torch.export.save(torch.export.export(torch.nn.Linear(4, 4), (torch.randn(1, 4),)), str(bad))
    message, _ = check_bad(["check", str(bad)], capsys, scale_pt2)
    assert message.startswith("not a quantized program")


def test_pte_that_does_not_deserialize(tmp_path: Path, scale_pt2: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "junk.pte"
    bad.write_bytes(b"\x00" * 64)
    message, _ = check_bad(["check", str(bad)], capsys, scale_pt2)
    assert message.startswith("not a valid .pte program")


def test_unsupported_suffix(tmp_path: Path, scale_pt2: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"x")
    message, _ = check_bad(["check", str(bad)], capsys, scale_pt2)
    assert message == "unsupported file type '.onnx': expected .pt2 or .pte"


def test_error_is_one_line_on_stderr(tmp_path: Path, scale_pt2: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["check", str(tmp_path / "gone.pt2"), str(scale_pt2)], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qlint: error: ") and "gone.pt2: no such file" in lines[0]


def test_pickled_sample_inputs_are_never_unpickled(
        tmp_path: Path, scale_pt2: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sentinel = tmp_path / "code-ran"
    buffer = io.BytesIO()
    torch.save(((Payload(str(sentinel)),), {}), buffer)
    bad = tmp_path / "evil.pt2"
    rewrite_zip(scale_pt2, bad, {member(scale_pt2, "sample_inputs/model.pt"): buffer.getvalue()})
    message, _ = check_bad(["check", str(bad)], capsys, scale_pt2)
    assert message == ("sample inputs are not plain tensors: "
                       "Trying to load unsupported GLOBAL posix.mkdir whose module posix is blocked.")
    assert not sentinel.exists()


def test_pickled_weights_are_refused_before_loading(
        tmp_path: Path, scale_pt2: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config_name = member(scale_pt2, "model_weights_config.json")
    with zipfile.ZipFile(scale_pt2) as archive:
        config = json.loads(archive.read(config_name))
    if not config["config"]:
        config["config"]["w"] = {"path_name": "weight_0", "is_param": False, "use_pickle": False}
    first = next(iter(config["config"]))
    config["config"][first]["use_pickle"] = True
    bad = tmp_path / "pickled.pt2"
    rewrite_zip(scale_pt2, bad, {config_name: json.dumps(config).encode()})
    message, _ = check_bad(["check", str(bad)], capsys, scale_pt2)
    assert message == f"weight {first!r} is a pickled object; qlint loads plain tensors only"


BAD_FACTORIES = {
    "nosuchmodule:make": "cannot import nosuchmodule: ModuleNotFoundError",
    "badfactory:missing": "badfactory has no function missing",
    "badfactory:explode": "factory badfactory:explode raised ValueError: boom",
    "badfactory:wrong_shape": "must return (module, example_inputs[, calibration_inputs])",
}


def test_bad_factories(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each bad factory is one error naming its target; the good target of the same run is checked."""
    (tmp_path / "badfactory.py").write_text(
        "def explode():\n    raise ValueError('boom')\n\ndef wrong_shape():\n    return 1\n"
    )
    bad = "".join(f"  - name: bad{i}\n    factory: {factory}\n" for i, factory in enumerate(BAD_FACTORIES))
    (tmp_path / ".qlint.yaml").write_text(f"targets:\n{bad}  - name: good\n    factory: goodfactory:make\n")
    (tmp_path / "goodfactory.py").write_text(
        "import torch\n\nclass M(torch.nn.Module):\n    def forward(self, x):\n        return x / 3.0\n\n"
        "def make():\n    return M(), (torch.randn(1, 8),)\n"
    )
    code, data = run_json(["check", "--config", str(tmp_path / ".qlint.yaml"), "--targets-only"], capsys)
    assert code == 2
    assert len(data["errors"]) == len(BAD_FACTORIES)
    for error, expected in zip(data["errors"], BAD_FACTORIES.values(), strict=True):
        assert error["artifact"].startswith("target:bad") and expected in error["message"]
    assert [e["artifact"] for e in data["errors"]] == [f"target:bad{i}" for i in range(len(BAD_FACTORIES))]
    assert [s["artifact"] for s in data["artifacts"]] == ["target:good"]
    assert [f["code"] for f in data["findings"]][0] == "QL001"
