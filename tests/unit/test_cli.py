"""The command line without a program: `--help`, `--version`, `rules` and `rule` answer without
importing torch, and a usage error is one line and a hint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, TORCH_PROBE

from qlint import __version__
from qlint.rules.catalog import load_catalog


@pytest.mark.parametrize("args", [
    ["--help"], ["--version"], ["rules"], ["rule", "QL001"], ["boards"], ["check", "--help"],
    ["rules", "--output-format", "json"], ["rule", "--all"], ["rule", "--all", "--output-format", "json"],
])
def test_fast_commands_do_not_import_torch(args: list[str]) -> None:
    result = subprocess.run([sys.executable, "-c", TORCH_PROBE, *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "HEAVY="


def test_version() -> None:
    result = subprocess.run([sys.executable, "-m", "qlint", "--version"], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == f"qlint {__version__}"


def test_rules_lists_the_catalog() -> None:
    result = subprocess.run([sys.executable, "-m", "qlint", "rules"], capture_output=True, text=True, timeout=60)
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[2:]}
    for rule in load_catalog().values():
        assert rule.name in rows[rule.code] and rule.fix_text in rows[rule.code]
    assert " safe, sometimes available" in rows["QL007"] and "unsafe" not in rows["QL007"] and " none " in rows["QL003"]


def test_rule_page_renders_every_section() -> None:
    result = subprocess.run([sys.executable, "-m", "qlint", "rule", "ql002"], capture_output=True, text=True,
                            timeout=60)
    out = result.stdout
    assert out.startswith("# fp32-island (QL002)")
    assert "Fix: safe, sometimes available." in out  # its applicability, as `ruff rule` says it
    for heading in ("## What it does", "## Why it matters", "## Example", "## Fix safety"):
        assert heading in out
    bad = subprocess.run([sys.executable, "-m", "qlint", "rule", "QL999"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown rule 'QL999'" in bad.stderr


CHECK_HELP = "Run 'qlint check --help' for usage."
KNOWN = "(known: QL001, QL002, QL003, QL004, QL005, QL006, QL007, QL008, QL009, QL010)"


def qlint(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "qlint", *args], cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("args", "lines"),
    [
        (["check", "--shard", "0/4", "."], ["argument --shard: '0/4': need 1 <= I <= N", CHECK_HELP]),
        (["check", "--shard", "4/3", "."], ["argument --shard: '4/3': need 1 <= I <= N", CHECK_HELP]),
        (["--shard", "x", "."], ["argument --shard: 'x' is not I/N", CHECK_HELP]),
        (["check", "--shard"], ["argument --shard: expected one argument", CHECK_HELP]),
        (["check", "--jobs", "0", "."], ["argument --jobs/-j: '0': need N >= 1", CHECK_HELP]),
        (["check", "-j", "-1", "."], ["argument --jobs/-j: '-1': need N >= 1", CHECK_HELP]),
        (["check", "--jobs", "x", "."], ["argument --jobs/-j: 'x' is not a whole number", CHECK_HELP]),
        (["check", "--bogus", "."], ["unrecognized arguments: --bogus", CHECK_HELP]),
        (["rules", "--bogus\nline"], ["unrecognized arguments: --bogus\\nline", "Run 'qlint rules --help' for usage."]),
        (["check", "--select", "QL999", "."], [f"argument --select: unknown rule code 'QL999' {KNOWN}", CHECK_HELP]),
        (["check", "--ignore", "QL001,XX", "."], [f"argument --ignore: unknown rule code 'XX' {KNOWN}", CHECK_HELP]),
        (["check", "--extend-select", "QL9", "."], [f"argument --extend-select: unknown rule code 'QL9' {KNOWN}",
                                                    CHECK_HELP]),
        (["check", "--select", " , ", "."], ["argument --select: ' , ' names no rule code", CHECK_HELP]),
        (["check", "--output-format", "xml", "."], [
            "argument --output-format: invalid choice: 'xml' (choose from 'text', 'json', 'github', 'sarif', "
            "'markdown')", CHECK_HELP]),
        (["check", "--static", "--fix", "."], ["--fix and --diff need the full check (lowering); drop --static",
                                               CHECK_HELP]),
        *[(["check", "--static", *extra, "."], ["--compare and --write metrics: need the full check (figures are "
                                                 "measured on the lowered program); drop --static", CHECK_HELP])
          for extra in (["--compare", "base.json"], ["--write", "metrics:m.json"])],
        (["rule"], ["give one rule code, or --all", "Run 'qlint rule --help' for usage."]),
        (["rule", "QL999"], [f"unknown rule 'QL999' {KNOWN}", "Run 'qlint rules' for the list."]),
    ],
)
def test_usage_errors_are_one_line_and_a_hint(args: list[str], lines: list[str], tmp_path: Path) -> None:
    result = qlint(args, tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines() == [f"qlint: error: {lines[0]}", *lines[1:]]


@pytest.mark.parametrize(("writes", "named"), [
    (["--write", "metrics:X.json", "--write", "profile-comparison:./X.json"],
     "--write metrics:X.json and --write profile-comparison:X.json"),
    (["--write", "json:X.json", "--write", "json:X.json"], "--write json:X.json and --write json:X.json"),
    (["--write", "sarif:X.json", "--write", "json:gone/../X.json"],
     "--write sarif:X.json and --write json:gone/../X.json"),
    (["--write", "json:X.json", "--write", "sarif:here/X.json"], "--write json:X.json and --write sarif:here/X.json"),
    (["--write", "json:X.json", "--write", "sarif:link.json"], "--write json:X.json and --write sarif:link.json"),
    (["--write-baseline", "X.json", "--write", "json:X.json"], "--write json:X.json and --write-baseline X.json"),
])
def test_two_outputs_on_one_file_are_refused_before_anything_runs(writes: list[str], named: str,
                                                                   tmp_path: Path) -> None:
    """However the path is spelled (`./X`, `gone/../X`, through a linked folder, a link to it), the last
    write would replace the other silently: one usage error, before the (missing) input is read."""
    (tmp_path / "here").symlink_to(".")
    (tmp_path / "link.json").symlink_to("X.json")
    result = qlint(["check", "missing.pte", "--profile", "run.etdump", *writes], tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines() == [f"qlint: error: {named} name one file: give each output its own path",
                                          CHECK_HELP]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["here", "link.json"]


def test_an_output_on_a_file_the_run_reads_is_refused_and_the_file_kept(tmp_path: Path) -> None:
    """An artifact named or found by the walk, the config, a profile: an output written there would
    replace an input (a `.pt2` made SARIF fails every later run), so the run is refused, the file kept."""
    example = (ROOT / "examples" / "attention.pt2").read_bytes()
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "a.pt2").write_bytes(example)
    (tmp_path / ".qlint.yaml").write_text("select: [QL001]\n")
    (tmp_path / "run.etdump").write_bytes(b"x")
    cases = [
        (["m/a.pt2", "--write-baseline", "m/a.pt2"], "--write-baseline m/a.pt2 names the input m/a.pt2"),
        (["m/a.pt2", "--write", "sarif:./m/a.pt2"], "--write sarif:m/a.pt2 names the input m/a.pt2"),
        (["m", "--write", "json:m/a.pt2"], "--write json:m/a.pt2 names the input m/a.pt2"),
        (["m/a.pt2", "--write", "json:.qlint.yaml"], "--write json:.qlint.yaml names the config the run reads"),
        (["m/a.pt2", "--profile", "run.etdump", "--write", "json:run.etdump"],
         "--write json:run.etdump names the profile the run reads"),
    ]
    for args, said in cases:  # refused before anything is read: no torch, --profile too (not --static's)
        result = qlint(["check", *([] if "--profile" in args else ["--static"]), *args], tmp_path)
        errors = [line for line in result.stderr.splitlines() if line.startswith("qlint: error")]
        assert (result.returncode, errors) == (2, [f"qlint: error: {said}: give that output another path"]), args
    assert (tmp_path / "m" / "a.pt2").read_bytes() == example
    assert (tmp_path / ".qlint.yaml").read_text() == "select: [QL001]\n"
    assert (tmp_path / "run.etdump").read_bytes() == b"x"


@pytest.mark.parametrize("prefix", [["check"], []])
def test_every_argument_after_a_double_dash_is_a_path(prefix: list[str], tmp_path: Path) -> None:
    """Folders named like options (a glob in CI may pass them) are paths after `--`, options and
    command names alike: the island in `--exit-zero` fails the run, `rules` is a folder."""
    for name in ("--exit-zero", "--baseline=b.json", "rules"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.pt2").write_bytes((ROOT / "examples" / "attention.pt2").read_bytes())
    result = qlint([*prefix, "--static", "--output-format", "json", "--", "--exit-zero", "--baseline=b.json", "rules"],
                   tmp_path)
    assert result.returncode == 1, result.stderr
    artifacts = [a["artifact"] for a in json.loads(result.stdout)["artifacts"]]
    assert artifacts == ["--exit-zero/a.pt2", "--baseline=b.json/a.pt2", "rules/a.pt2"]


def test_write_baseline_exits_as_its_help_says(tmp_path: Path) -> None:
    """`--write-baseline` exits 0 whatever the findings it records (QL001 is an error), and 2 when an
    input could not be checked; `check --help` says both."""
    said = " ".join(qlint(["check", "--help"], tmp_path).stdout.split())
    assert "--write-baseline FILE record the current findings in FILE and exit 0 (2, FILE not written, if an " \
           "input could not be checked)" in said
    (tmp_path / "a.pt2").write_bytes((ROOT / "examples" / "attention.pt2").read_bytes())
    (tmp_path / "bad.pt2").write_bytes(b"not a zip")
    result = qlint(["check", "--static", "a.pt2", "--write-baseline", "b.json"], tmp_path)
    assert (result.returncode, result.stderr.splitlines()[-1]) == (0, "wrote 2 findings to b.json")
    recorded = json.loads((tmp_path / "b.json").read_text())["findings"]
    assert sorted(f["key"].split("|")[0] for f in recorded) == ["QL001", "QL004"]
    result = qlint(["check", "--static", "a.pt2", "bad.pt2", "--write-baseline", "c.json"], tmp_path)
    errors = result.stderr.splitlines()
    assert result.returncode == 2 and errors[-1] == "qlint: error: 1 input could not be checked: c.json not written"
    assert [line for line in errors if line.startswith("qlint: error: bad.pt2: ")] == [
        "qlint: error: bad.pt2: not a .pt2 archive (not a zip file)"], errors
    assert not (tmp_path / "c.json").exists()  # its findings would all be new once it reads


def test_static_on_a_folder_passes_over_its_pte_files_and_refuses_a_named_one(tmp_path: Path) -> None:
    """A `.pte` a fix wrote beside its `.pt2` does not end a folder's static check with exit 2;
    named on the command line, it is still one line."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "a.pt2").write_bytes((ROOT / "examples" / "attention.pt2").read_bytes())
    (models / "a.pte").write_bytes(b"\x00\x00\x00\x00ET12" + b"\x00" * 56)
    result = qlint(["--static", "--output-format", "json", "models"], tmp_path)
    assert result.returncode == 1 and "qlint: error" not in result.stderr, result.stderr
    assert [a["artifact"] for a in json.loads(result.stdout)["artifacts"]] == ["models/a.pt2"]
    result = qlint(["--static", "--output-format", "json", "models", "models/a.pte"], tmp_path)
    assert result.returncode == 2 and "qlint: error: models/a.pte: .pte files need the full check" in result.stderr


def test_every_write_kind_the_parser_accepts_has_a_writer() -> None:
    from qlint.cli.commands.check import WRITERS
    from qlint.cli.main import WRITTEN_FORMATS

    assert sorted(WRITERS) == sorted(WRITTEN_FORMATS)


def test_an_interrupted_main_leaves_the_callers_ctrl_c_as_it_was(monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """`main` called in-process (a script, the tests) and interrupted says so in one line and returns
    130; SIGINT is ignored only while it says so, so the caller, and every process it starts after,
    can still be interrupted."""
    import signal

    from qlint.cli import main as cli

    def interrupted(argv: list[str]) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_dispatch", interrupted)
    before = signal.getsignal(signal.SIGINT)
    assert cli.main(["check", "x.pt2"]) == 130
    assert capsys.readouterr().err == "qlint: interrupted\n"
    assert signal.getsignal(signal.SIGINT) is before


def test_rules_and_rule_render_the_catalog_as_json_and_every_page() -> None:
    """`qlint rules --output-format json`, `qlint rule --all` and `qlint rule [CODE | --all] --output-format json`,
    as ruff has them: each rule's fields with its page, from the catalog."""
    from qlint.rules.catalog import render_rule, rule_record

    def run(*args: str) -> str:
        result = subprocess.run([sys.executable, "-m", "qlint", *args], capture_output=True, text=True, timeout=60)
        assert (result.returncode, result.stderr) == (0, ""), args
        return result.stdout

    catalog = list(load_catalog().values())
    listed = json.loads(run("rules", "--output-format", "json"))
    assert listed == [rule_record(r) for r in catalog] == json.loads(run("rule", "--all", "--output-format", "json"))
    assert listed[0] == {
        "code": "QL001", "name": "constant-scale-island", "summary": catalog[0].summary,
        "default_severity": "error", "fix": "safe, sometimes available", "applicability": "safe",
        "availability": "sometimes", "scope": "region", "static": True, "guards": list(catalog[0].guards),
        "explanation": render_rule(catalog[0]),
    }
    assert json.loads(run("rule", "ql009", "--output-format", "json")) == rule_record(load_catalog()["QL009"])
    pages = run("rule", "--all")
    assert pages == "\n".join(render_rule(r) for r in catalog)
    assert pages.startswith("# constant-scale-island (QL001)\n") and "\n\n# over-budget (QL009)\n" in pages


def test_rule_takes_a_code_or_all() -> None:
    result = subprocess.run([sys.executable, "-m", "qlint", "rule", "QL001", "--all"], capture_output=True, text=True,
                            timeout=60)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines() == ["qlint: error: argument --all: not allowed with a rule code",
                                          "Run 'qlint rule --help' for usage."]


def test_statistics_honour_the_json_output_format() -> None:
    """`--statistics --output-format json`: the counts per rule as records (ruff's), not the text table."""
    examples = ["examples/attention.pt2", "examples/layernorm.pt2"]
    args = ["check", "--static", "--statistics", *examples]
    as_json = qlint([*args, "--output-format", "json"], ROOT)
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout) == [
        {"code": "QL001", "name": "constant-scale-island", "count": 1, "fixable": False},
        {"code": "QL004", "name": "requantize-pair", "count": 1, "fixable": False},
    ]
    assert qlint(args, ROOT).stdout.splitlines() == ["1  QL001    constant-scale-island", "1  QL004    requantize-pair"]
