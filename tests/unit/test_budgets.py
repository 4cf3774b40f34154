"""Budgets: config parsing (one `file:line: key:` error per mistake), the board table, resolution by
level, and QL009 and the deltas over crafted figures (no torch: the budget check lowers nothing)."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from qlint.full.over_budget import over_budget
from qlint.records.results import Contributor, Figures, Location, Report
from qlint.report.metrics import MetricsError, delta_markdown, deltas, metrics_json, read_metrics
from qlint.settings.boards import builtin_boards
from qlint.settings.config import ConfigError, load_config
from qlint.settings.npus import npu
from qlint.settings.sizes import parse_clock, parse_duration_ms, parse_size, show_size


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / ".qlint.yaml"
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize(("text", "size"), [("65536", 65536), ("64KiB", 65536), ("1.5 MiB", 1572864), ("512B", 512)])
def test_sizes_read_bytes_kib_and_mib(text: str, size: int) -> None:
    assert parse_size(text) == size


def test_sizes_print_exactly() -> None:
    shown = (show_size(32768), show_size(64000), show_size(1 << 20))
    assert shown == ("32 KiB (32,768 B)", "64,000 B", "1 MiB (1,048,576 B)")


@pytest.mark.parametrize(("text", "line", "key", "message"), [
    ("budgets: {sram: 64KB}\n", 1, "budgets.sram", "'64KB' is not a size: write bytes, or a number with B, KiB, MiB"),
    ("budgets:\n  flash: lots\n", 2, "budgets.flash", "'lots' is not a size"),
    ("budgets:\n  coverage: 120%\n", 2, "budgets.coverage", "a share must be between 0 and 1"),
    ("budgets:\n  fp32_islands: -1\n", 2, "budgets.fp32_islands", "expected a whole number of fp32 islands"),
    ("budgets:\n  ram: 1KiB\n", 2, "budgets.ram", "unknown key (known: sram, flash"),
    ("budgets:\n  board: nucleo-z999\n", 2, "budgets.board", "unknown board 'nucleo-z999' (known: alif-e7-dk-he-u55, "),
    ("budgets:\n  growth: {sram: lots%}\n", 2, "budgets.growth.sram", "expected a growth like 5% or 0"),
    ("budgets:\n  growth: {arena: 5%}\n", 2, "budgets.growth.arena", "unknown key (known: sram, flash"),
    ("boards:\n  mine: {sram: 1KiB}\n", 2, "boards.mine", "a board needs flash"),
    ("targets:\n  - {factory: m:f, budgets: {sram: x}}\n", 2, "targets.budgets.sram", "'x' is not a size"),
    # Numbers no float holds, and digits that are not ASCII, are one line too (not a crash after the check).
    (f"budgets:\n  sram: {'9' * 400}\n", 2, "budgets.sram", f"'{'9' * 40}' is over the largest amount"),
    (f"boards:\n  mine: {{sram: 1{'0' * 320} KiB, flash: 1MiB}}\n", 2, "boards.mine.sram", "'1000"),
    (f"budgets:\n  growth: {{fp32_islands: {'9' * 400}}}\n", 2, "budgets.growth.fp32_islands",
     f"'{'9' * 40}' is over the largest amount qlint compares exactly, 2**53 fp32 islands"),
    (f"budgets:\n  growth: {{sram: {'9' * 400}%}}\n", 2, "budgets.growth.sram", "expected a growth like 5% or 0"),
    ("budgets:\n  flash: １２KiB\n", 2, "budgets.flash", "'１２KiB' is not a size"),
    ("budgets:\n  fp32_elements: １２\n", 2, "budgets.fp32_elements", "expected a whole number of fp32 elements"),
    ("budgets:\n  coverage: ０.９\n", 2, "budgets.coverage", "'０.９' is not a share"),
    # Time: a duration needs its unit, a clock too; a board's CPU must be one qlint lowers for.
    ("budgets:\n  latency: 50\n", 2, "budgets.latency", "'50' is not a duration: write a number with us, ms or s"),
    (f"budgets:\n  latency: {'9' * 400}ms\n", 2, "budgets.latency", f"'{'9' * 40}' is over the largest amount"),
    ("boards:\n  mine: {sram: 1KiB, flash: 1KiB, clock: 120}\n", 2, "boards.mine.clock", "'120' is not a clock"),
    ("boards:\n  mine: {sram: 1KiB, flash: 1KiB, clock: 0MHz}\n", 2, "boards.mine.clock",
     "'0MHz': a clock must be above 0 Hz"),
    ("boards:\n  mine: {sram: 1KiB, flash: 1KiB, cpu: cortex-a53}\n", 2, "boards.mine.cpu",
     "'cortex-a53' is not one of"),
    ("boards:\n  mine: {sram: 1KiB, flash: 1KiB, fpu: maybe}\n", 2, "boards.mine.fpu", "expected bool"),
    ("boards:\n  mine: {sram: 1KiB, flash: 1KiB, flash_read: -1}\n", 2, "boards.mine.flash_read",
     "must be CPU cycles a byte from 0, got -1.0"),
    ("boards:\n  mine: {sram: 1KiB, flash: 1KiB, flash_read: .nan}\n", 2, "boards.mine.flash_read",
     "must be CPU cycles a byte from 0, got nan"),
    ("board: nucleo-z999\n", 1, "board", "unknown board 'nucleo-z999'"),
    ("targets:\n  - {factory: m:f, board: nucleo-z999}\n", 2, "targets.board", "unknown board 'nucleo-z999'"),
    ("target_cpu: cortex-m4\nboard: nrf5340-dk\n", 1, "target_cpu", "'cortex-m4', but `board: nrf5340-dk` is a "
     "cortex-m33: drop one of them"),
    ("coverage_by: cycles\n", 1, "coverage_by", "'cycles' is not one of ops, time"),
    # An FPU only on a core whose architecture has one: the cost table has no FPU timings for the others.
    ("boards:\n  mine: {sram: 1KiB, flash: 1KiB,\n         fpu: true, cpu: cortex-m0}\n", 3, "boards.mine.fpu",
     "true, but a cortex-m0 has no FPU: drop it, or correct `cpu`"),
    ("target_cpu: cortex-m3\nboard: mine\nboards:\n  mine: {sram: 1KiB, flash: 1KiB, fpu: true}\n", 2, "board",
     "board mine says it has an FPU (fpu: true), and a cortex-m3 has none"),
    ("target_cpu: cortex-m23\ntargets:\n  - {factory: m:f, board: mine}\nboards:\n  mine: {sram: 1KiB, flash: 1KiB, "
     "fpu: true}\n", 3, "targets.board", "board mine says it has an FPU (fpu: true), and a cortex-m23 has none"),
    # A board has a name: an empty one would select no board.
    ("boards:\n  '': {sram: 1KiB, flash: 1KiB}\n", 2, "boards.", "a board needs a name"),
    ("board: ''\n", 1, "board", "unknown board ''"),
])
def test_budget_mistakes_are_one_line_naming_file_line_and_key(tmp_path: Path, text: str, line: int, key: str,
                                                               message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text))
    assert (caught.value.line, caught.value.key) == (line, key)
    assert caught.value.message.startswith(message), caught.value.message
    assert "\n" not in str(caught.value)


def test_clocks_and_durations_read_their_units() -> None:
    assert (parse_clock("120MHz"), parse_clock("32 MHz"), parse_clock("1.2GHz"), parse_clock("32768Hz")) == (
        120_000_000, 32_000_000, 1_200_000_000, 32_768)
    assert (parse_duration_ms("50ms"), parse_duration_ms("800us"), parse_duration_ms("1.5 s")) == (50.0, 0.8, 1500.0)


def test_a_board_sets_the_cpu_clock_and_fpu_of_the_run(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, """\
        board: mine
        boards:
          mine: {cpu: cortex-m33, clock: 128MHz, fpu: false, sram: 512KiB, flash: 1MiB, flash_read: 0.5}
        targets:
          - {name: other, factory: m:f, board: ek-ra8d1}
        """))
    board = config.selected_board()
    assert config.target_cpu == "cortex-m33" and board is not None
    assert (board.clock_hz, board.fpu, board.sram, board.flash_read) == (128_000_000, False, 512 * 1024, 0.5)
    assert config.targets[0].board == "ek-ra8d1"
    other = config.with_board("ek-ra8d1")
    assert (other.target_cpu, other.board) == ("cortex-m85", "ek-ra8d1")
    assert config.with_board("ek-ra8d1", "cortex-m55").target_cpu == "cortex-m55"  # --target-cpu wins
    with pytest.raises(ValueError, match="unknown board 'nope'"):
        config.with_board("nope")


def test_the_simplest_form_resolves_per_target_and_per_file_with_boards(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, """\
        budgets:
          sram: 64KiB
          flash: 256KiB
          per_file:
            "models/kws*.pt2": {board: my-board}
        boards:
          my-board: {sram: 96KiB, flash: 1MiB}
        targets:
          - {name: kws, factory: models.kws:make, budgets: {sram: 32KiB, growth: {sram: 5%}}}
        """))
    target = config.budgets.resolve("target:kws", config.targets[0].budgets)
    assert {k: (v.value, v.origin) for k, v in target.limits.items()} == {
        "sram": (32768, "target kws's budgets in .qlint.yaml:9"), "flash": (262144, "budgets in .qlint.yaml:2")}
    assert str(target.growth["sram"][0]) == "5%"
    board = config.budgets.resolve("models/kws_small.pt2")
    assert {k: v.value for k, v in board.limits.items()} == {"sram": 96 * 1024, "flash": 1 << 20}
    assert board.limits["sram"].origin.startswith("board my-board (budgets.per_file.models/kws*.pt2 in .qlint.yaml:5")
    assert {k: v.value for k, v in config.budgets.resolve("other.pt2").limits.items()} == {"sram": 65536,
                                                                                            "flash": 262144}


def test_a_board_and_a_cpu_that_disagree_on_the_fpu_are_one_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from conftest import run_cli

    model = tmp_path / "m.pt2"
    model.write_bytes(b"")
    code, out, err = run_cli(["check", "--board", "ek-ra8d1", "--target-cpu", "cortex-m3", str(model)], capsys)
    assert (code, out, err) == (2, "", "qlint: --board: board ek-ra8d1 says it has an FPU (fpu: true), and a "
                                       "cortex-m3 has none: name a board and a CPU that agree\n")
    config = write(tmp_path, "board: ek-ra8d1\n")  # the config's board, the command line's CPU
    code, out, err = run_cli(["check", "--config", str(config), "--target-cpu", "cortex-m0", str(model)], capsys)
    assert (code, err) == (2, "qlint: --target-cpu: board ek-ra8d1 says it has an FPU (fpu: true), and a cortex-m0 "
                              "has none: name a board and a CPU that agree\n")
    # a target's board, taken with the command line's CPU as the engine takes it
    config = write(tmp_path, "targets:\n  - {factory: m:f, board: mine}\nboards:\n  mine: {sram: 1KiB, flash: 1KiB, "
                             "fpu: true}\n")
    code, out, err = run_cli(["check", "--config", str(config), "--target-cpu", "cortex-m0plus", "--targets-only"],
                             capsys)
    assert (code, err) == (2, "qlint: --target-cpu: board mine says it has an FPU (fpu: true), and a cortex-m0plus "
                              "has none: name a board and a CPU that agree\n")
    # a board without an FPU takes any CPU; an FPU-less CPU on its own is soft float
    assert load_config(config).with_board("raspberry-pi-pico", "cortex-m55").target_cpu == "cortex-m55"


def test_an_empty_board_name_is_refused_not_read_as_no_board(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from conftest import run_cli

    code, out, err = run_cli(["check", "--board", "", str(tmp_path)], capsys)
    assert (code, out, err) == (2, "", "qlint: --board: needs a board name (`qlint boards` lists them)\n")


def test_every_board_row_has_its_figures_and_a_source() -> None:
    assert len(builtin_boards()) >= 10
    for board in builtin_boards().values():
        assert board.sram > 0 and board.flash > 0 and board.cpu.startswith("cortex-m")
        assert re.match(r"https://\S+ \(.+\)$", board.source), board.name
        # a clock and an FPU for the estimate, the FPU as the core's architecture allows; a Fixed Virtual
        # Platform models no clock (it is not cycle-accurate), and its row says so
        assert board.fpu is not None, board.name
        assert (board.clock_hz and 1_000_000 <= board.clock_hz <= 1_000_000_000) or (
            board.clock_hz is None and "Fixed Virtual Platform" in board.note and "no clock" in board.note), board.name
        # an NPU is one ExecuTorch's Arm backend lowers for, with its source
        assert board.npu is None or (npu(board.npu, board.system_config, board.memory_mode).accelerator == board.npu
                                     and board.npu_source), board.name
        assert not board.fpu or board.cpu not in ("cortex-m0", "cortex-m0plus", "cortex-m3", "cortex-m23"), board.name
        # a flash read cost says how it is derived
        assert board.flash_read is None or (0 < board.flash_read < 10 and "derived: " in board.flash_read_source)
    page = (Path(__file__).parents[2] / "docs" / "budgets.md").read_text(encoding="utf-8")
    for board in builtin_boards().values():
        assert f"| `{board.name}` | {board.cpu} |" in page and board.source in page


def test_boards_lists_the_configs_own_boards_first_then_the_table(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from qlint.cli.main import main

    config = write(tmp_path, "boards:\n  my-board: {sram: 96KiB, flash: 1MiB}\n"
                             "  nucleo-f446re: {sram: 1KiB, flash: 2KiB, override: true}\n")
    assert main(["boards", "--config", str(config)]) == 0
    rows = capsys.readouterr().out.splitlines()[2:]
    assert rows[0].split()[:5] == ["my-board", "96", "KiB", "(98,304", "B)"]
    assert "boards.my-board in .qlint.yaml:2" in rows[0]
    # the config's own overrides the table's
    assert rows[1].startswith("nucleo-f446re") and "1 KiB (1,024 B)" in rows[1]
    assert len(rows) == len(builtin_boards()) + 1 and sum(r.startswith("nucleo-f446re ") for r in rows) == 1
    assert main(["boards", "--config", str(config), "--verbose"]) == 0
    assert "\n\nmy-board\n  defined in: boards.my-board in .qlint.yaml:2\n\n" in capsys.readouterr().out
    assert rows[2].startswith("stm32f746g-disco") and "320 KiB (327,680 B)" in rows[2]

    (tmp_path / ".qlint.yaml").write_text("boards: {b: {sram: 1KB}}\n")
    assert main(["boards", "--config", str(tmp_path / ".qlint.yaml")]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("qlint: config error: ") and ".qlint.yaml:1: boards.b.sram: '1KB' is not a size" in line
    assert main(["boards", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert capsys.readouterr().err.strip().endswith("missing.yaml:0: <file>: no such config file")


def test_boards_keeps_its_rows_short_and_gives_the_sources_on_request(capsys: pytest.CaptureFixture[str]) -> None:
    """The sources (a vendor page a figure) would wrap every row: `--verbose` prints them under the
    table, `--output-format json` has every field."""
    from qlint.cli.main import main

    assert main(["boards"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["board", "cpu", "npu", "sram", "flash", "clock", "fpu", "flash", "read"]
    assert len(table) == len(builtin_boards()) + 2 and max(map(len, table)) <= 132
    assert not any("https://" in line for line in table)
    assert table[2].split() == ["stm32f746g-disco", "cortex-m7", "320", "KiB", "(327,680", "B)", "1", "MiB",
                                "(1,048,576", "B)", "216", "MHz", "yes", "0.25", "cycles/B"]
    assert next(r for r in table if r.startswith("ek-ra8d1")).endswith("yes    0.625 cycles/B")

    assert main(["boards", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("\n".join(table) + "\n\nstm32f746g-disco\n  source: https://www.st.com/")
    assert ("\nnucleo-h743zi\n  source: https://www.st.com/en/microcontrollers-microprocessors/stm32h743zi.html "
            "(STM32H743ZI: 2 Mbytes flash, 1 Mbyte RAM)\n  clock and FPU: ") in out
    assert "\n  note: the RAM is split over several domains (TCM, AXI, AHB SRAM)\n" in out
    assert "\nek-ra8d1\n  source: " in out and "\n  flash reads: 0.625 cycles/byte, derived: " in out

    assert main(["boards", "--output-format", "json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in records] == list(builtin_boards())
    pico = next(r for r in records if r["name"] == "raspberry-pi-pico")
    assert {k: pico[k] for k in ("cpu", "sram", "flash", "clock_hz", "fpu", "flash_read", "config")} == {
        "cpu": "cortex-m0plus", "sram": 270336, "flash": 2097152, "clock_hz": 125_000_000, "fpu": False,
        "flash_read": None, "config": False}
    assert pico["source"] == builtin_boards()["raspberry-pi-pico"].source and pico["clock_source"]


def kws(sram: int | None = 64000, islands: int = 1, coverage: float = 0.19) -> Figures:
    return Figures("target:kws", "as --fix writes it", {"QL002": 1}, islands, 144490, coverage, arena_bytes=64000,
                   live_peak_bytes=64000, sram_bytes=sram, flash_bytes=98528,
                   sram=(Contributor("dscnn.feature_extractor.0", 32000, "float32 [1, 64, 25, 5], output of "
                                     "aten.convolution.out", Location("kws.py", 13)),))


def test_ql009_names_the_budget_its_origin_the_figure_and_the_tensors_at_the_peak(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "targets:\n  - {name: kws, factory: kws:make, budgets: {sram: 32KiB}}\n"))
    [finding] = over_budget(Report(figures=[kws()]), config, None)
    assert (finding.code, finding.severity, str(finding.location)) == ("QL009", "error", "kws.py:13")
    assert finding.message == (
        "SRAM 64,000 B over its budget 32 KiB (32,768 B) by 31,232 B (target kws's budgets in .qlint.yaml:2); "
        "measured as --fix writes it; live at the peak: dscnn.feature_extractor.0 (float32 [1, 64, 25, 5], output of "
        "aten.convolution.out) at kws.py:13: 32,000")
    assert finding.details["contributors"][0]["amount"] == 32000
    roomy = load_config(write(tmp_path, "budgets: {sram: 64000, coverage: 19%}\n"))
    assert over_budget(Report(figures=[kws()]), roomy, None) == []


def test_a_budget_that_was_not_measured_is_a_finding_not_a_pass(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "budgets: {sram: 1MiB}\n"))
    unmeasured = kws(sram=None)
    unmeasured.measured = "not lowered: no memory plan"
    [finding] = over_budget(Report(figures=[unmeasured]), config, None)
    assert finding.message == "SRAM budget 1 MiB (1,048,576 B) (budgets in .qlint.yaml:1) cannot be checked: " \
                              "not lowered: no memory plan"


def test_growth_limits_and_the_delta_table_against_a_base_run(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "budgets: {growth: {sram: 5%, fp32_islands: 0, coverage: 1%}}\n"))
    base = Figures("target:kws", "as --fix writes it", {}, 0, 0, 1.0, arena_bytes=20464, live_peak_bytes=20464,
                   sram_bytes=20464, flash_bytes=50912)
    gone = Figures("old.pt2", "the .pte as shipped")
    metrics = tmp_path / "base.json"
    metrics.write_text(metrics_json(Report(figures=[base, gone])))
    read = read_metrics(metrics)
    found = over_budget(Report(figures=[kws()]), config, read)
    assert [f.message.split(";")[0] for f in found] == [
        "SRAM grew 20,464 B -> 64,000 B (+43,536 B, +212.7%), past its growth budget 5% (budgets in .qlint.yaml:1)",
        "fp32 islands grew 0 -> 1 (+1), past its growth budget 0 (budgets in .qlint.yaml:1)",
        "int8 coverage fell 100.0% -> 19.0% (-81.0 points), past its growth budget 1 points (budgets in .qlint.yaml:1)"]
    table = delta_markdown(deltas(Report(figures=[kws()]), read), "base.json")
    assert table.splitlines()[2:] == [
        "| artifact | figure | before | after | change |", "|---|---|---|---|---|",
        "| old.pt2 | (removed) |  |  |  |",
        "| target:kws | fp32_islands | 0 | 1 | +1 |",
        "| target:kws | fp32_elements | 0 | 144,490 | +144,490 |",
        "| target:kws | coverage | 100.0% | 19.0% | -81.0 points |",
        "| target:kws | arena_bytes | 20,464 B | 64,000 B | +43,536 B |",
        "| target:kws | live_peak_bytes | 20,464 B | 64,000 B | +43,536 B |",
        "| target:kws | sram_bytes | 20,464 B | 64,000 B | +43,536 B |",
        "| target:kws | flash_bytes | 50,912 B | 98,528 B | +47,616 B |"]


@pytest.mark.parametrize(("body", "message"), [
    ("[1, 2]", "not a qlint metrics file of schema 1"),
    ('{"schema": 1, "artifacts": []}', "`artifacts` is not a mapping"),
    ('{"schema": 1, "artifacts": {"a": {"sram_bytes": -5}}}',
     "a: sram_bytes is not a whole number from 0 to 2**53: -5"),
    ('{"schema": 1, "artifacts": {"a": {"coverage": true}}}', "a: coverage is not a share from 0 to 1: True"),
    (f'{{"schema": 1, "artifacts": {{"a": {{"fp32_elements": {"9" * 400}}}}}}}',
     "a: fp32_elements is not a whole number from 0 to 2**53: 9999"),
    ('{"schema": 1, "artifacts": {"a": {"coverage": 1e308}}}', "a: coverage is not a share from 0 to 1: 1e+308"),
    ('{"schema": 1, "artifacts": {"a": {"sram_bytes": 0.5}}}', "a: sram_bytes is not a whole number from 0 to 2**53"),
    ('{"schema": 1, "artifacts": {"a": {"coverage": NaN}}}', "a: coverage is not a share from 0 to 1: nan"),
    ("{", "not a qlint metrics file (JSONDecodeError)"),
])
def test_a_bad_metrics_file_is_one_line(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "m.json"
    path.write_text(body)
    with pytest.raises(MetricsError) as caught:
        read_metrics(path)
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(("body", "said"), [
    (None, "no such file"),
    ('{"schema": 2, "artifacts": {}}', "not a qlint metrics file of schema 1"),
])
def test_a_compare_file_that_cannot_be_read_stops_the_run_before_anything_is_checked(
        tmp_path: Path, body: str | None, said: str) -> None:
    """One line, exit 2, and nothing lowered (torch never imported) for a base that cannot be compared with."""
    import subprocess
    import sys

    from conftest import TORCH_PROBE

    metrics = tmp_path / "base.json"
    if body is not None:
        metrics.write_text(body)
    (tmp_path / "a.pt2").write_bytes(b"not read")
    result = subprocess.run([sys.executable, "-c", TORCH_PROBE, "check", "--compare", str(metrics), "a.pt2"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stdout.strip().splitlines()[-1] == "HEAVY="
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"qlint: error: --compare: {metrics}") and said in line
