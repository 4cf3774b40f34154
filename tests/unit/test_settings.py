"""The config: each mistake is one `file:line: key:` error, a valid file reads as written, and
`qlint init` writes one that loads."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from conftest import run_cli

from qlint.settings.config import ConfigError, FoldGuards, load_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / ".qlint.yaml"
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize(
    ("text", "line", "key", "message"),
    [
        ("target_cpu: cortex-m55\ncolour: red\n", 2, "colour", "unknown key"),
        ("rules:\n  QL001: error\n  QL099: warning\n", 3, "rules.QL099", "unknown rule code"),
        ("rules:\n  QL001: loud\n", 2, "rules.QL001", "'loud' is not one of error, warning, info, off"),
        ("coverage_threshold: high\n", 1, "coverage_threshold", "expected float"),
        ("fold:\n  max_elements: 1\n  dtypes: [int8, int4]\n", 3, "fold.dtypes", "'int4' is not one of int8, int16"),
        ("fold:\n  require_equal_qrange: 3\n", 2, "fold.require_equal_qrange", "expected bool"),
        ("select: [QL001, XX1]\n", 1, "select", "unknown rule code 'XX1'"),
        ("targets:\n  - name: a\n    factory: not a factory\n", 2, "targets.factory",
         "is not `package.module:function`"),
        ("target_cpu: cortex-a53\n", 1, "target_cpu", "'cortex-a53' is not one of"),
        ("include: [a\n", 2, "<yaml>", "expected ',' or ']', but got '<stream end>'"),
        # A target's name is a name (--fix writes NAME.pte into --output-dir), not a path.
        ("targets:\n  - {name: ../x, factory: m:f}\n", 2, "targets.name", "'../x' is not a target name"),
        ("targets:\n  - {name: /abs/path, factory: m:f}\n", 2, "targets.name", "'/abs/path' is not a target name"),
        ("targets:\n  - {name: .., factory: m:f}\n", 2, "targets.name", "'..' is not a target name"),
        ("targets:\n  - {name: 'a\\b', factory: m:f}\n", 2, "targets.name", "is not a target name"),
        # What YAML or a list would silently drop or do twice.
        ("targets:\n  - {name: t, factory: m:f}\n  - {name: t, factory: m:g}\n", 3, "targets.name",
         "'t' names two targets (the first on line 2)"),
        ("targets:\n  - {factory: m:f}\n  - {factory: n:f}\n", 3, "targets.name", "'f' names two targets"),
        ("coverage_threshold: 0.5\ncoverage_threshold: 0.9\n", 2, "<root>",
         "'coverage_threshold' appears twice (first on line 1)"),
        ("budgets:\n  sram: 1KiB\n  sram: 2KiB\n", 3, "budgets", "'sram' appears twice (first on line 2)"),
        ("boards:\n  b: {sram: 1KiB, flash: 1KiB}\n  b: {sram: 2KiB, flash: 1KiB}\n", 3, "boards",
         "'b' appears twice (first on line 2)"),
        ("boards:\n  nucleo-f446re: {sram: 1KiB, flash: 2KiB}\n", 2, "boards.nucleo-f446re",
         "redefines the built-in board of that name: add `override: true`"),
        ("boards:\n  mine: {sram: 1KiB, flash: 2KiB, override: true}\n", 2, "boards.mine",
         "`override: true`, but no built-in board has that name"),
        ("remedies: [channels-last, int8-io, channels-last]\n", 1, "remedies", "'channels-last' is listed twice"),
        ("targets:\n  - {factory: m:f, remedies: [int8-io, int8-io]}\n", 2, "targets.remedies",
         "'int8-io' is listed twice"),
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


ALL = ("QL001", "QL002", "QL003", "QL004", "QL005", "QL007", "QL008", "QL009")  # QL006 is off unless `rules:` says


@pytest.mark.parametrize(("text", "argv", "enabled"), [
    # --ignore adds to the config's ignore (repeated, each adds): QL004 stays off
    ("ignore: [QL004]\n", ["--ignore", "QL001"], [c for c in ALL if c not in ("QL001", "QL004")]),
    ("ignore: [QL004]\n", ["--ignore", "QL001", "--ignore", "QL002"],
     [c for c in ALL if c not in ("QL001", "QL002", "QL004")]),
    ("select: [QL001, QL004]\n", ["--ignore", "QL001"], ["QL004"]),
    # --extend-select adds to the config's selection, over its ignore; --ignore beside it wins
    ("select: [QL001, QL004]\n", ["--extend-select", "QL005"], ["QL001", "QL004", "QL005"]),
    ("ignore: [QL00]\n", ["--extend-select", "QL004"], ["QL004"]),
    ("select: [QL001]\n", ["--extend-select", "QL004,QL005", "--ignore", "QL005"], ["QL001", "QL004"]),
    # --select starts the selection anew: the config's select and ignore no longer apply
    ("select: [QL001, QL004]\nignore: [QL004]\n", ["--select", "QL005"], ["QL005"]),
    ("ignore: [QL004]\n", ["--select", "QL004"], ["QL004"]),
    ("ignore: [QL004]\n", ["--select", "QL001", "--select", "QL004", "--ignore", "QL001"], ["QL004"]),
    ("select: [QL001]\n", ["--select", "QL00", "--ignore", "QL00"], []),
    ("ignore: [QL004]\n", [], [c for c in ALL if c != "QL004"]),
    # within one layer the more specific selector decides, the ignore at equal specificity (ruff's order)
    ("select: [QL001]\nignore: [QL0]\n", [], ["QL001"]),
    ("select: [QL0]\nignore: [QL001]\n", [], [c for c in ALL if c.startswith("QL0") and c != "QL001"]),
    ("select: [QL001]\nignore: [QL001]\n", [], []),
    ("", ["--select", "QL004", "--ignore", "QL0"], ["QL004"]),
    ("", ["--extend-select", "QL001", "--ignore", "QL00"],
     [c for c in ALL if not c.startswith("QL00") or c == "QL001"]),
])
def test_the_command_lines_selection_is_layered_on_the_configs_as_ruff_layers_it(
        tmp_path: Path, text: str, argv: list[str], enabled: list[str]) -> None:
    from qlint.cli.commands.check import _config
    from qlint.cli.main import build_parser

    args = build_parser().parse_args(["check", "--config", str(write(tmp_path, text)), *argv, str(tmp_path)])
    config = _config(args)
    assert config is not None and [code for code in ALL if config.enabled(code)] == enabled


def test_init_writes_a_config_that_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / ".qlint.yaml"
    code, _, _ = run_cli(["init", str(target)], capsys)
    assert code == 0
    config = load_config(target)
    assert config.target_cpu == "cortex-m55" and config.fold.dtypes == ("int8",)
    code, _, err = run_cli(["init", str(target)], capsys)
    assert code == 2 and "already exists" in err


def test_clamp_range_guard() -> None:
    """int16 quantizes use [-32767, 32767]; a fold into an int8 [-128, 127] consumer would be blocked."""
    from qlint.rules.qparams import QParams
    from qlint.settings.guards import blocked_guards

    qp_in, qp_out = QParams(1.0, 0, -32767, 32767, "int16"), QParams(1.0, 0, -32768, 32767, "int16")
    guards = FoldGuards(dtypes=("int16",))
    assert blocked_guards(guards, qp_in, (), qp_out) == [
        "fold.require_equal_qrange: int16[-32767, 32767] in, int16[-32768, 32767] out"
    ]
    assert blocked_guards(FoldGuards(dtypes=("int16",), require_equal_qrange=False), qp_in, (), qp_out) == []


def test_a_config_past_its_fixed_size_says_the_limit_is_fixed(tmp_path: Path) -> None:
    """1 MiB is qlint's own bound on a config, which no `limits:` changes: the error says so."""
    path = write(tmp_path, "# " + "x" * (1 << 20) + "\n")
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    size = path.stat().st_size
    assert raised.value.message == f"config file is {size} bytes, over the 1048576-byte limit (a fixed limit)"
