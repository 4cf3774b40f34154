"""Fast unit tests of the pure helpers the larger tests rely on."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from qlint.io.archive import read_zip, validate_program_json, write_zip
from qlint.io.limits import Limits
from qlint.io.reads import ReadError, printable
from qlint.records.source import _is_framework, user_frame
from qlint.run.engine import fix_destination, plan_work, with_inputs_root
from qlint.settings.config import Config, Target
from qlint.settings.options import FixOptions, RunOptions

LIMITS = Limits(file_mb=1, entry_mb=1, tensor_mb=1)


def test_framework_frames_are_not_the_users() -> None:
    stdlib = sysconfig.get_paths()["stdlib"]
    assert _is_framework("<eval_with_key>.3")
    assert _is_framework(f"{stdlib}/contextlib.py")
    assert _is_framework("/venv/lib/python3.11/site-packages/torch/nn/modules/module.py")
    assert not _is_framework("/venv/lib/python3.11/site-packages/segment_anything/modeling/transformer.py")
    assert not _is_framework("/home/me/project/models/net.py")


def test_user_frame_is_the_innermost_user_line() -> None:
    trace = (
        '  File "/home/me/net.py", line 7, in forward\n    x = self.block(x)\n'
        '  File "/home/me/block.py", line 3, in forward\n    return x / 4\n'
        '  File "/venv/lib/python3.11/site-packages/torch/_tensor.py", line 40, in wrapped\n    return f(*args)\n'
    )
    assert user_frame(trace) == ("/home/me/block.py", 3, "return x / 4")
    assert user_frame('  File "/m.py", line ' + "9" * 20 + ", in f\n    x\n") is None  # not a line number
    assert user_frame(None) is None


def test_plan_work_shards_partition_by_name(tmp_path: Path) -> None:
    for name in ("c.pt2", "a.pt2", "b.pt2"):
        (tmp_path / name).write_bytes(b"")
    targets = [Target(name="t", factory="m:f")]
    everything, errors = plan_work([tmp_path], targets, Config())
    assert errors == [] and [w.name for w in everything][-1] == "target:t"
    shards = [plan_work([tmp_path], targets, Config(), (i, 2))[0] for i in (1, 2)]
    names = sorted(w.name for shard in shards for w in shard)
    assert names == sorted(w.name for w in everything)
    assert not {w.name for w in shards[0]} & {w.name for w in shards[1]}


def fix_plan(paths: list[Path], targets: tuple[Target, ...] = (), output_dir: str | None = "out",
             taken: dict[tuple[object, ...], str] | None = None) -> tuple[list[str], list[str]]:
    """Where `--fix` writes each unit `plan_work` keeps, and its errors."""
    options = with_inputs_root(RunOptions(fix=FixOptions(output_dir=Path(output_dir) if output_dir else None)), paths)
    assert options.fix is not None
    work, errors = plan_work(paths, list(targets), Config(), None, options, taken)
    return [fix_destination(w, Config(), options.fix).as_posix() for w in work], [str(e) for e in errors]


@pytest.fixture
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tree of inputs that share one name, and the current directory at its top."""
    monkeypatch.chdir(tmp_path)
    for name in ("a/model.pt2", "b/model.pt2", "models/x/model.pt2", "models/y/model.pt2", "model.pt2"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    return tmp_path


def test_output_dir_keeps_each_inputs_path_below_the_inputs_common_folder(models: Path) -> None:
    assert fix_plan([Path("a/model.pt2"), Path("b/model.pt2")]) == (["out/a/model.pte", "out/b/model.pte"], [])
    assert fix_plan([models / "a/model.pt2", Path("b/model.pt2")]) == (["out/a/model.pte", "out/b/model.pte"], [])
    assert fix_plan([Path("models")]) == (["out/x/model.pte", "out/y/model.pte"], [])
    assert fix_plan([Path("models/x/model.pt2")]) == (["out/model.pte"], [])  # one input: its name in the folder
    assert fix_plan([Path("a/model.pt2"), Path("b/model.pt2")], output_dir=None) == (
        ["a/model.pte", "b/model.pte"], [])


def test_fixes_that_would_write_one_file_are_refused_together(models: Path) -> None:
    from qlint.io.writes import same_file

    target = (Target(name="model", factory="m:f"),)
    clash = "--fix would write {} for {} too: neither is fixed (rename one, or fix them apart)"
    # a config target's NAME.pte beside the config, or in --output-dir, is an input's fix too
    assert fix_plan([Path("model.pt2")], target, output_dir=None) == (
        [], ["model.pt2: " + clash.format("model.pte", "target:model")])
    assert fix_plan([Path("model.pt2"), Path("a")], target) == (
        ["out/a/model.pte"], ["model.pt2: " + clash.format("out/model.pte", "target:model")])
    # two output folders that are one
    (models / "out").mkdir()
    (models / "out" / "b").symlink_to("a")
    assert fix_plan([Path("a/model.pt2"), Path("b/model.pt2")]) == (
        [], ["a/model.pt2: " + clash.format("out/a/model.pte", "b/model.pt2")])
    # one input named twice is one input
    assert fix_plan([Path("a/model.pt2"), models / "a" / "model.pt2"]) == (["out/model.pte", "out/model.pte"], [])
    # a file another output of the run writes
    taken = {same_file(Path("a/model.etrecord")): "--write json:a/model.etrecord"}
    assert fix_plan([Path("a/model.pt2"), Path("b/model.pt2")], output_dir=None, taken=taken) == (
        ["b/model.pte"], ["a/model.pt2: --fix would write a/model.etrecord, which --write json:a/model.etrecord "
                          "names too: not fixed (give that output another path)"])


def test_a_folder_walk_passes_over_the_files_the_mode_does_not_take(tmp_path: Path) -> None:
    """`--fix models/` after a first fix wrote `a.pte` beside `a.pt2`, and `--static` on a folder of
    both: the walk leaves the `.pte` files out; one named on the command line is still read (and refused)."""
    for name in ("a.pt2", "a.pte", "sub/b.pte", "sub/b.pt2"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    named = tmp_path / "a.pte"
    for options in (RunOptions(fix=FixOptions()), RunOptions(static=True), RunOptions(fix=FixOptions(dry_run=True))):
        work, errors = plan_work([tmp_path, named], [], Config(), options=options)
        assert errors == [] and [w.path for w in work] == [tmp_path / "a.pt2", tmp_path / "sub/b.pt2", named]
    work, _ = plan_work([tmp_path], [], Config(), options=RunOptions())  # the full check takes both
    assert [w.path for w in work] == [tmp_path / n for n in ("a.pt2", "a.pte", "sub/b.pt2", "sub/b.pte")]


def test_read_zip_refuses_duplicates_and_inflation() -> None:
    import io
    import warnings
    import zipfile

    assert read_zip(write_zip({"a/x": b"1", "a/y": b"22"}), LIMITS) == {"a/x": b"1", "a/y": b"22"}
    buffer_ = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(buffer_, "w") as archive:
        warnings.simplefilter("ignore")
        archive.writestr("a/x", b"1")
        archive.writestr("a/x", b"2")
    with pytest.raises(ReadError, match="appears more than once"):
        read_zip(buffer_.getvalue(), LIMITS)
    big = io.BytesIO()
    with zipfile.ZipFile(big, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("a/zeros", bytes(2 << 20))
    with pytest.raises(ReadError, match="inflates to 2097152 bytes, over the 1048576-byte entry limit"):
        read_zip(big.getvalue(), LIMITS)


def test_program_json_allows_only_static_aten_programs() -> None:
    def program(target: str, **graph: object) -> dict[str, object]:
        return {"graph_module": {"graph": {"nodes": [{"target": target}], **graph}}, "range_constraints": {}}

    validate_program_json(program("torch.ops.aten.div.Tensor"), LIMITS)
    validate_program_json(program("_operator.getitem"), LIMITS)
    # One leading underscore is an aten operator (transformers' BERT exports _assert_tensor_metadata).
    validate_program_json(program("torch.ops.aten._assert_tensor_metadata.default"), LIMITS)
    validate_program_json(program("torch.ops.aten._softmax.default"), LIMITS)
    for target in ("torch.ops.mylib.op.default", "torch.load", "torch.ops.aten.__class__.x",
                   "torch.ops.aten.div.__call__", "os.system"):
        with pytest.raises(ReadError, match="outside the operator namespaces"):
            validate_program_json(program(target), LIMITS)
    big = {"t": {"dtype": 7, "sizes": [{"as_int": 1 << 20}]}}  # 4 MiB of fp32
    with pytest.raises(ReadError, match="tensors declare over 1048576 bytes"):
        validate_program_json(program("torch.ops.aten.div.Tensor", tensor_values=big), LIMITS)


def test_printable_escapes_control_characters() -> None:
    assert printable("plain name.pt2") == "plain name.pt2"
    assert printable("a\nb\x1b[2Jc\t") == "a\\nb\\x1b[2Jc\\t"


