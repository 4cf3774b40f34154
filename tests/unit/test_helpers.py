"""Fast unit tests of the pure helpers the larger tests rely on."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from qlint.io.archive import read_zip, validate_program_json, write_zip
from qlint.io.limits import Limits
from qlint.io.reads import ReadError, printable
from qlint.records.source import _is_framework, user_frame
from qlint.run.engine import plan_work
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


