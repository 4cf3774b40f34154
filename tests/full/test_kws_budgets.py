"""Budgets on a real target: ExecuTorch's own MLPerf Tiny DS-CNN keyword spotter (random weights),
measured as `--fix` writes it, against ExecuTorch's own figures; and `--compare` between its
channels_last and its NCHW build, the change a pull request makes when it drops the layout."""

from __future__ import annotations

import json
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import KWS, cache_entry, run_cli


def project(tmp_path: Path, config: str) -> Path:
    (tmp_path / "kws.py").write_text(KWS)
    path = tmp_path / ".qlint.yaml"
    path.write_text(textwrap.dedent(config))
    return path


def check(config: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict]:
    """`qlint check` of the config's targets, JSON; the result cache is not read unless `extra` names one."""
    cache = [] if "--cache-dir" in extra else ["--no-cache"]
    code, out, _ = run_cli(["check", "--config", str(config), "--targets-only", *cache,
                            "--output-format", "json", *extra], capsys)
    return code, json.loads(out)


@dataclass
class Written:
    """The channels_last keyword spotter checked with --fix, budgets and every figure written."""

    folder: Path
    code: int
    found: dict


@pytest.fixture(scope="module")
def channels_last(tmp_path_factory: pytest.TempPathFactory) -> Written:
    from qlint.cli.main import main

    folder = tmp_path_factory.mktemp("kws")
    config = project(folder, "budgets: {flash: 16KiB, sram: 40KiB}\n"
                             "targets:\n  - {name: kws, factory: kws:make_channels_last}\n")
    out = folder / "out.json"
    code = main(["check", "--config", str(config), "--targets-only", "--no-cache", "--output-format", "json",
                 "--fix", "--write", f"json:{out}", "--write", f"metrics:{folder / 'm.json'}",
                 "--write", f"memory-plot:{folder / 'plan.svg'}", "--write", f"markdown:{folder / 's.md'}"])
    return Written(folder, code, json.loads(out.read_text()))


def test_an_sram_budget_below_the_arena_fails_naming_the_tensors_at_the_peak(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = project(tmp_path, "targets:\n  - {name: kws, factory: kws:make, budgets: {sram: 32KiB}}\n")
    cache = ["--cache-dir", str(tmp_path / "cache")]
    code, found = check(config, capsys, *cache)
    [over] = [f for f in found["findings"] if f["code"] == "QL009"]
    assert code == 1 and over["severity"] == "error"
    assert over["message"].startswith(
        "SRAM 76,776 B over its budget 32 KiB (32,768 B) by 44,008 B (target kws's budgets in .qlint.yaml:2); "
        "measured as --fix writes it; arena 64,000 B + method allocator 12,776 B; the method allocator and the "
        "tensors live at the peak: method allocator (values, tensor metadata")
    names = [(c["name"], c["what"], c["location"], c["amount"]) for c in over["details"]["contributors"]][1:]
    assert names == [
        ("dscnn.feature_extractor.0", "float32 [1, 64, 25, 5], output of aten.convolution.out", "kws.py:11", 32000),
        ("dscnn.feature_extractor.2", "float32 [1, 64, 25, 5], output of aten.relu.out", "kws.py:11", 32000)]
    [figures] = found["figures"]
    assert (figures["arena_bytes"], figures["method_allocator_bytes"], figures["sram_bytes"]) == (64000, 12776, 76776)
    assert figures["measured"] == "as --fix writes it"

    # Answered from the result cache the second time: the same figures, the same QL009.
    [entry] = (tmp_path / "cache").rglob("*.json")
    assert cache_entry(entry)["figures"][0]["sram_bytes"] == 76776
    assert check(config, capsys, *cache) == (code, found)

    # At the figures (SRAM and flash both), within budget: no finding.
    flash = figures["flash_bytes"]
    roomy = project(tmp_path,
                    f"targets:\n  - {{name: kws, factory: kws:make, budgets: {{sram: 76776, flash: {flash}}}}}\n")
    code, found = check(roomy, capsys)
    assert code == 0 and not [f for f in found["findings"] if f["code"] == "QL009"]
    assert found["figures"][0]["flash_bytes"] == flash


def test_the_figures_are_executorchs_own_for_the_pte_fix_writes(channels_last: Written, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from executorch.exir._serialize._program import deserialize_pte_binary

    code, found, written = channels_last.code, channels_last.found, channels_last.folder
    assert "SRAM budget 40960 B" in (written / "plan.svg").read_text()  # the budget drawn as a line
    assert "![plan.svg](plan.svg)" in (written / "s.md").read_text()
    shipped = (written / "kws.pte").read_bytes()
    plan = deserialize_pte_binary(shipped).program.execution_plan[0]
    figures = json.loads((written / "m.json").read_text())["artifacts"]["target:kws"]
    assert figures["flash_bytes"] == len(shipped) and figures["arena_bytes"] == sum(plan.non_const_buffer_sizes)
    # what ExecuTorch's own runtime takes from the method allocator to load it (a 64-bit host, as qlint's figure)
    sys.path.insert(0, str(Path(__file__).parents[2] / "scripts"))
    import method_allocator

    harness = method_allocator.build(tmp_path)
    assert figures["method_allocator_bytes"] == method_allocator.measure(harness, written / "kws.pte") == 17064
    assert figures["sram_bytes"] == figures["arena_bytes"] + 17064
    assert figures["coverage"] == 1.0 and figures["fp32_islands"] == 0
    [over] = [f for f in found["findings"] if f["code"] == "QL009"]
    assert code == 1 and over["message"].startswith(f"flash {len(shipped):,} B over its budget 16 KiB (16,384 B)")
    largest = over["details"]["contributors"][0]
    assert largest["name"] == "dscnn.feature_extractor.4.pointwise.weight" and largest["what"] == "int8 [64, 1, 1, 64]"

    # The .pte itself, checked directly: measured from its own plan, the same figures.
    code, _, _ = run_cli(["check", str(written / "kws.pte"), "--no-cache", "--config", str(written / ".qlint.yaml"),
                          "--write", f"metrics:{tmp_path / 'pte.json'}"], capsys)
    shipped_figures = json.loads((tmp_path / "pte.json").read_text())["artifacts"]
    [(name, as_shipped)] = shipped_figures.items()
    assert name.endswith("kws.pte") and as_shipped["measured"] == "the .pte as shipped"
    for key in ("flash_bytes", "arena_bytes", "live_peak_bytes", "method_allocator_bytes", "sram_bytes",
                "fp32_islands", "coverage"):
        assert as_shipped[key] == figures[key], key


def test_compare_shows_what_dropping_channels_last_did_and_a_growth_limit_fails_it(
        channels_last: Written, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    metrics = channels_last.folder / "m.json"  # the base: the channels_last build
    changed = project(tmp_path, "budgets: {growth: {fp32_islands: 0}}\ntargets:\n  - {name: kws, factory: kws:make}\n")
    summary = tmp_path / "summary.md"
    code, found = check(changed, capsys, "--compare", str(metrics), "--write", f"markdown:{summary}")
    [grew] = [f for f in found["findings"] if f["code"] == "QL009"]
    assert code == 1 and grew["message"].startswith(
        "fp32 islands grew 0 -> 1 (+1), past its growth budget 0 (budgets in .qlint.yaml:1)")
    before, after = (found["compare"]["artifacts"][0][k] for k in ("before", "after"))
    assert (before["fp32_islands"], after["fp32_islands"], before["coverage"]) == (0, 1, 1.0)
    assert after["arena_bytes"] > before["arena_bytes"]
    table = summary.read_text()
    assert "| target:kws | fp32_islands | 0 | 1 | +1 |" in table
    assert f"| target:kws | arena_bytes | {before['arena_bytes']:,} B | {after['arena_bytes']:,} B |" in table


@pytest.mark.model("make_attention")
def test_the_api_holds_a_program_to_the_configs_budgets_as_the_cli_does(
        quantized: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`qlint.api.lint` returns QL009 where `qlint check` reports it: the rule runs with the others,
    not in a reporter. Measured as `--fix` writes it, the attention example needs more than 1 KiB of
    SRAM and of flash."""
    import torch

    from qlint.api import lint
    from qlint.settings.config import load_config

    config_path = tmp_path / ".qlint.yaml"
    config_path.write_text("budgets: {flash: 1KiB, sram: 1KiB}\n")
    config = load_config(config_path)
    program = quantized("make_attention")
    found = [f for f in lint(program, config, artifact="attention.pt2") if f.code == "QL009"]
    torch.export.save(program, str(tmp_path / "attention.pt2"))
    _, out, _ = run_cli(["check", "--config", str(config_path), "--no-cache", "--output-format", "json",
                         str(tmp_path / "attention.pt2")], capsys)
    by_cli = [f for f in json.loads(out)["findings"] if f["code"] == "QL009"]
    assert sorted(f.details["budget"] for f in found) == ["flash", "sram"]
    assert sorted(f.message for f in found) == sorted(f["message"] for f in by_cli)
    # Without budgets, no figure is measured and none is found.
    assert not [f for f in lint(program, artifact="attention.pt2") if f.code == "QL009"]


@pytest.mark.model("make_attention")
def test_a_check_measures_the_folded_program_without_running_it(
        quantized: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Running the program before and after on every verification input is `--fix`'s work: a check
    with budgets folds a copy and serializes it, and its figures are those of what `--fix` writes."""
    import qlint.fix.apply
    from qlint.api import fix
    from qlint.fix.measure import measure
    from qlint.full.lint import lint_program
    from qlint.loading.inputs import sample_inputs, verification_inputs
    from qlint.settings.config import Config
    from qlint.settings.options import RunOptions

    program = quantized("make_attention")
    written = fix(program)
    assert written.serialized is not None and written.summary.folds
    monkeypatch.setattr(qlint.fix.apply, "run_program", lambda *args: pytest.fail("a check ran the program"))
    linted = lint_program(program, "a", Config())
    figures = measure(program, linted, "a", Config(), verification_inputs(sample_inputs(program)), RunOptions())
    assert figures.measured == "as --fix writes it"
    assert (figures.arena_bytes, figures.flash_bytes) == (written.serialized.arena_bytes, len(written.serialized.pte))
    assert (figures.fp32_islands, figures.fp32_elements) == (written.stats.fp32_islands, written.stats.fp32_elements)
