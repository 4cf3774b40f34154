"""Bad input: one clear line naming the file, exit 2, the other inputs still checked, no code run."""

from __future__ import annotations

import io
import json
import os
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import run_cli, run_json


@pytest.fixture(scope="module")
def good(pt2_dir: Callable[[str], Path]) -> Path:
    return pt2_dir("make_scale")


def rewrite_zip(source: Path, target: Path, replace: dict[str, bytes]) -> None:
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w") as dst:
        for item in src.infolist():
            data = replace.get(item.filename, src.read(item.filename))
            dst.writestr(item, data)


def member(path: Path, suffix: str) -> str:
    with zipfile.ZipFile(path) as archive:
        return next(n for n in archive.namelist() if n.endswith(suffix))


class Payload:
    """Unpickling this runs code: it must never happen while qlint loads a .pt2."""

    def __init__(self, sentinel: str) -> None:
        self.sentinel = sentinel

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.mkdir, (self.sentinel,))


def check_bad(args: list[str], capsys: pytest.CaptureFixture[str], good: Path) -> tuple[str, dict]:
    code, out, err = run_cli([*args, str(good), "--output-format", "json"], capsys)
    data = json.loads(out)
    assert code == 2
    assert len(data["errors"]) == 1
    [line] = err.strip().splitlines()  # one line on stderr, naming the artifact
    assert line == f"qlint: error: {data['errors'][0]['artifact']}: {data['errors'][0]['message']}"
    # The good artifact is still checked.
    assert [s["artifact"] for s in data["artifacts"]] == [data["artifacts"][0]["artifact"]]
    assert data["artifacts"][0]["artifact"].endswith(good.name)
    return data["errors"][0]["message"], data


def test_missing_path(tmp_path: Path, good: Path, capsys: pytest.CaptureFixture[str]) -> None:
    message, _ = check_bad(["check", str(tmp_path / "nope.pt2")], capsys, good)
    assert message == "no such file or directory"


def test_not_a_zip(tmp_path: Path, good: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "text.pt2"
    bad.write_text("hello")
    message, _ = check_bad(["check", str(bad)], capsys, good)
    assert message == "not a .pt2 archive (not a zip file)"
    assert bad.read_text() == "hello"  # inputs are never modified


def test_zip_that_is_not_a_pt2(tmp_path: Path, good: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "other.pt2"
    with zipfile.ZipFile(bad, "w") as archive:
        archive.writestr("readme.txt", "hi")
    message, _ = check_bad(["check", str(bad)], capsys, good)
    assert message == "not a .pt2 archive from torch.export.save (no models/*.json)"


def test_unquantized_pt2(tmp_path: Path, good: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "float.pt2"
    torch.export.save(torch.export.export(torch.nn.Linear(4, 4), (torch.randn(1, 4),)), str(bad))
    message, _ = check_bad(["check", str(bad)], capsys, good)
    assert message.startswith("not a quantized program")


def test_pte_that_does_not_deserialize(tmp_path: Path, good: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "junk.pte"
    bad.write_bytes(b"\x00" * 64)
    message, _ = check_bad(["check", str(bad)], capsys, good)
    assert message.startswith("not a valid .pte program")


def test_unsupported_suffix(tmp_path: Path, good: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"x")
    message, _ = check_bad(["check", str(bad)], capsys, good)
    assert message == "unsupported file type '.onnx': expected .pt2 or .pte"


def test_error_is_one_line_on_stderr(tmp_path: Path, good: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["check", str(tmp_path / "gone.pt2"), str(good)], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qlint: error: ") and "gone.pt2: no such file" in lines[0]


def test_pickled_sample_inputs_are_never_unpickled(tmp_path: Path, good: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sentinel = tmp_path / "code-ran"
    buffer = io.BytesIO()
    torch.save(((Payload(str(sentinel)),), {}), buffer)
    bad = tmp_path / "evil.pt2"
    rewrite_zip(good, bad, {member(good, "sample_inputs/model.pt"): buffer.getvalue()})
    message, _ = check_bad(["check", str(bad)], capsys, good)
    assert message == "sample inputs are not plain tensors: Trying to load unsupported GLOBAL posix.mkdir whose module posix is blocked."
    assert not sentinel.exists()


def test_pickled_weights_are_refused_before_loading(tmp_path: Path, good: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config_name = member(good, "model_weights_config.json")
    with zipfile.ZipFile(good) as archive:
        config = json.loads(archive.read(config_name))
    if not config["config"]:
        config["config"]["w"] = {"path_name": "weight_0", "is_param": False, "use_pickle": False}
    first = next(iter(config["config"]))
    config["config"][first]["use_pickle"] = True
    bad = tmp_path / "pickled.pt2"
    rewrite_zip(good, bad, {config_name: json.dumps(config).encode()})
    message, _ = check_bad(["check", str(bad)], capsys, good)
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
