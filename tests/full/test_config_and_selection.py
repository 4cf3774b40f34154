"""Config errors point at file, line and key; select/ignore/severity change results and exit codes."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import run_cli, run_json

from qlint.settings.config import ConfigError, load_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / ".qlint.yaml"
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize(
    ("text", "line", "key", "message"),
    [
        ("target_cpu: cortex-m55\ncolour: red\n", 2, "colour", "unknown key"),
        ("rules:\n  QL001: error\n  QL009: warning\n", 3, "rules.QL009", "unknown rule code"),
        ("rules:\n  QL001: loud\n", 2, "rules.QL001", "'loud' is not one of error, warning, info, off"),
        ("coverage_threshold: high\n", 1, "coverage_threshold", "expected float"),
        ("fold:\n  max_elements: 1\n  dtypes: [int8, int4]\n", 3, "fold.dtypes", "'int4' is not one of int8, int16"),
        ("fold:\n  require_equal_qrange: 3\n", 2, "fold.require_equal_qrange", "expected bool"),
        ("select: [QL001, XX1]\n", 1, "select", "unknown rule code 'XX1'"),
        ("targets:\n  - name: a\n    factory: not a factory\n", 2, "targets.factory", "is not `package.module:function`"),
        ("target_cpu: cortex-a53\n", 1, "target_cpu", "'cortex-a53' is not one of"),
        ("include: [a\n", 2, "<yaml>", "expected ',' or ']', but got '<stream end>'"),
    ],
)
def test_config_errors_name_file_line_and_key(tmp_path: Path, text: str, line: int, key: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    error = raised.value
    assert (error.path, error.line, error.key) == (str(path), line, key)
    assert message in error.message
    assert str(error).startswith(f"{path}:{line}: {key}: ")


def test_config_error_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "rules:\n  QL001: loud\n")
    code, out, err = run_cli(["check", "--config", str(path), str(tmp_path)], capsys)
    assert code == 2 and out == ""
    assert err.strip() == f"qlint: config error: {path}:2: rules.QL001: 'loud' is not one of error, warning, info, off"


def test_valid_config_is_read(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        target_cpu: cortex-m4
        rules: {QL002: off, QL005: info}
        coverage_threshold: 0.5
        fold: {dtypes: [int8, int16], constant_kinds: [buffer], max_elements: 4}
        targets:
          - factory: pkg.models:make
        """)
    config = load_config(path)
    assert config.target_cpu == "cortex-m4"
    assert config.severity("QL002") == "off" and config.severity("QL005") == "info"
    assert config.severity("QL001") == "error"
    assert config.fold.dtypes == ("int8", "int16") and config.fold.max_elements == 4
    assert config.targets[0].name == "make" and config.targets[0].line == 6


def test_init_writes_a_config_that_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / ".qlint.yaml"
    code, _, _ = run_cli(["init", str(target)], capsys)
    assert code == 0
    config = load_config(target)
    assert config.target_cpu == "cortex-m55" and config.fold.dtypes == ("int8",)
    code, _, err = run_cli(["init", str(target)], capsys)
    assert code == 2 and "already exists" in err


@pytest.fixture(scope="module")
def attention(pt2_dir: Callable[[str], Path]) -> Path:
    return pt2_dir("make_attention")


@pytest.mark.slow
def test_select_ignore_and_off_change_results_and_exit_codes(
    attention: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, data = run_json(["check", str(attention)], capsys)
    assert code == 1 and {f["code"] for f in data["findings"]} == {"QL001", "QL004", "QL005"}

    code, data = run_json(["check", str(attention), "--select", "QL004,QL005"], capsys)
    assert code == 0 and {f["code"] for f in data["findings"]} == {"QL004", "QL005"}

    code, data = run_json(["check", str(attention), "--ignore", "QL001"], capsys)
    assert code == 0 and "QL001" not in {f["code"] for f in data["findings"]}

    code, data = run_json(["check", str(attention), "--select", "QL00", "--ignore", "QL004"], capsys)
    assert {f["code"] for f in data["findings"]} == {"QL001", "QL005"}

    config = write(tmp_path, "rules:\n  QL001: off\n  QL004: error\n")
    code, data = run_json(["check", "--config", str(config), str(attention)], capsys)
    assert code == 1 and {f["code"]: f["severity"] for f in data["findings"]} == {"QL004": "error", "QL005": "warning"}

    config = write(tmp_path, "rules:\n  QL001: warning\n")
    code, data = run_json(["check", "--config", str(config), str(attention)], capsys)
    assert code == 0 and data["findings"][0]["severity"] == "warning"

    code, _ = run_json(["check", str(attention), "--exit-zero"], capsys)
    assert code == 0


def test_unknown_selector_on_command_line(attention: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["check", str(attention), "--select", "QX1"], capsys)
    assert code == 2 and "unknown rule code 'QX1'" in err


@pytest.mark.slow
def test_target_cpu_option(attention: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """--target-cpu reaches the lowering (the real target config, recorded on its way)."""
    from qlint.graph import lowering

    used: list[str] = []
    real = lowering.target_config

    def recording(cpu: str) -> object:
        used.append(cpu)
        return real(cpu)

    monkeypatch.setattr(lowering, "target_config", recording)
    code, data = run_json(["check", "--no-cache", str(attention), "--target-cpu", "cortex-m0"], capsys)
    assert {f["code"] for f in data["findings"]} == {"QL001", "QL004", "QL005"}
    assert used == ["cortex-m0"]
    run_json(["check", "--no-cache", str(attention)], capsys)
    assert used == ["cortex-m0", "cortex-m55"]  # the default


@pytest.mark.slow
def test_directories_are_walked_with_include_and_exclude(
    pt2_dir: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "zoo" / "keep").mkdir(parents=True)
    (tmp_path / "zoo" / "skip").mkdir()
    (tmp_path / "zoo" / "keep" / "a.pt2").write_bytes(pt2_dir("make_attention").read_bytes())
    (tmp_path / "zoo" / "skip" / "b.pt2").write_bytes(pt2_dir("make_attention").read_bytes())
    (tmp_path / "zoo" / "notes.txt").write_text("not an artifact")
    config = write(tmp_path, 'exclude: ["skip/**"]\n')
    # `qlint PATH` is `qlint check PATH`.
    code, data = run_json(["--config", str(config), str(tmp_path / "zoo")], capsys)
    assert code == 1
    assert [Path(s["artifact"]).name for s in data["artifacts"]] == ["a.pt2"]
    config = write(tmp_path, 'include: ["**/*.pt2"]\n')
    code, data = run_json(["--config", str(config), str(tmp_path / "zoo")], capsys)
    assert sorted(Path(s["artifact"]).name for s in data["artifacts"]) == ["a.pt2", "b.pt2"]
