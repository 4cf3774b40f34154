"""The rule registry and the one-evaluation promise: deselected rules cost nothing, and each
island or requantize pair is run on every input integer at most once per run."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

import qlint.graph.regions
import qlint.graph.rules
from qlint.api import fix
from qlint.graph.lint import lint_program
from qlint.rules.catalog import load_catalog
from qlint.rules.table import TABLE, Scope, static_codes
from qlint.settings.config import Config


def example(name: str) -> tuple[Any, ...]:
    from examples import models

    return getattr(models, name)()[1]


@pytest.fixture
def evaluations(monkeypatch: pytest.MonkeyPatch) -> Counter[tuple[str, ...]]:
    """Counts exhaustive evaluations, keyed by the evaluated region's output nodes."""
    counts: Counter[tuple[str, ...]] = Counter()
    original = qlint.graph.regions.evaluate

    def counting(view: Any, island: Any, dq: Any, values: Any) -> Any:
        counts[tuple(o.name for o in island.outputs)] += 1
        return original(view, island, dq, values)

    monkeypatch.setattr(qlint.graph.regions, "evaluate", counting)
    return counts


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts island classifications and fold plans."""
    counts: Counter[str] = Counter()
    for module, name in ((qlint.graph.regions, "classify"), (qlint.graph.rules, "plan_region")):
        original = getattr(module, name)

        def counting(*args: Any, _name: str = name, _original: Any = original) -> Any:
            counts[_name] += 1
            return _original(*args)

        monkeypatch.setattr(module, name, counting)
    return counts


def test_the_rule_table_names_one_function_per_tier_for_every_catalog_rule() -> None:
    import qlint.report.suppressions
    import qlint.static.rules

    catalog = load_catalog()
    assert [row.code for row in TABLE] == sorted(catalog) == sorted(load_catalog())
    assert {code: rule.scope for code, rule in catalog.items()} == {
        "QL001": Scope.REGION, "QL002": Scope.REGION, "QL003": Scope.LOWERING,
        "QL004": Scope.REGION, "QL005": Scope.PROGRAM, "QL006": Scope.REPORT, "QL007": Scope.PROGRAM,
        "QL008": Scope.REGION,
        "QL009": Scope.FIGURES,
    }
    assert catalog["QL001"].function() is qlint.graph.rules.constant_scale
    assert catalog["QL006"].function() is qlint.report.suppressions.unused_suppressions
    assert catalog["QL004"].function("static") is qlint.static.rules.requantize_findings
    assert static_codes() == ("QL001", "QL004")
    for rule in catalog.values():
        assert callable(rule.function()), rule.code
    with pytest.raises(LookupError, match="QL003 has no static-tier function"):
        catalog["QL003"].function("static")
    # A function the table names exists nowhere else: no rule is registered twice or by a side door.
    names = [row.full for row in TABLE] + [row.static for row in TABLE if row.static]
    assert len(names) == len(set(names))


def test_each_region_is_evaluated_once_for_its_finding_and_its_fold(
    quantized: Callable[..., Any], evaluations: Counter[tuple[str, ...]], calls: Counter[str]
) -> None:
    """attention: a QL001 island (evaluated for its identity text, then for its table) and a
    QL004 pair; both findings are fixable, so both plans ran on the shared evaluation."""
    linted = lint_program(quantized("make_attention"), "a", Config())
    assert sorted(f.code for f in linted.findings) == ["QL001", "QL004", "QL005"]
    assert all(f.fixable for f in linted.findings if f.code != "QL005")
    assert len(evaluations) == 2 and set(evaluations.values()) == {1}
    assert calls["plan_region"] == 2


def test_the_fixed_program_reuses_the_evaluations_of_what_it_kept(
    quantized: Callable[..., Any], evaluations: Counter[tuple[str, ...]]
) -> None:
    """int16 with the default guards: the QL001 island is evaluated for its finding, its fold
    is blocked, and the check of the (unchanged) fixed program does not evaluate it again.
    Fixing a copy of an earlier lint reuses that lint's evaluation, moved onto the copy's nodes."""
    program = quantized("make_scale", int16=True)
    result = fix(program, [example("make_scale")])
    assert [f.code for f in result.findings if f.code == "QL001"] == ["QL001"]
    assert [left.reason for left in result.summary.left] == ["blocked by fold.dtypes: int16 not in [int8]"]
    assert list(evaluations.values()) == [1]
    linted = lint_program(program, "<program>", Config())
    assert list(evaluations.values()) == [2]
    again = fix(program, [example("make_scale")], linted=linted)
    assert list(evaluations.values()) == [2]
    assert again.pte == result.pte and again.findings == result.findings and again.summary == result.summary


def test_a_deselected_rule_does_no_analysis(
    quantized: Callable[..., Any], evaluations: Counter[tuple[str, ...]], calls: Counter[str]
) -> None:
    program = quantized("make_attention")
    only_coverage = lint_program(program, "a", Config(select=("QL005",)))
    assert [f.code for f in only_coverage.findings] == ["QL005"]
    assert only_coverage.stats.fp32_islands == 1  # the summary still counts islands
    assert calls == Counter() and evaluations == Counter()
    # QL002 selected: islands must be classified to know they are not QL002, but the
    # QL001 island is neither evaluated nor planned, and pairs are not looked for.
    assert lint_program(program, "a", Config(select=("QL002",))).findings == []
    assert calls == Counter({"classify": 1}) and evaluations == Counter()


@pytest.mark.slow
def test_fix_leaves_what_a_deselected_rule_would_fold(fixed: Callable[..., Any], quantized: Callable[..., Any]) -> None:
    """ruff's rule: --fix fixes only what the selected rules report."""
    from qlint.graph.islands import requantize_pairs
    from qlint.graph.view import GraphView

    program = quantized("make_attention")
    everything = fixed("make_attention")
    assert sorted(f.code for f in everything.summary.folds) == ["QL001", "QL004"]
    assert requantize_pairs(GraphView(everything.program)) == []
    without_ql004 = fix(program, [example("make_attention")], Config(ignore=("QL004",)))
    assert [f.code for f in without_ql004.summary.folds] == ["QL001"]
    assert len(requantize_pairs(GraphView(without_ql004.program))) == 1
