"""The rule registry and the one-evaluation promise: deselected rules cost nothing, and each
island or requantize pair is run on every input integer at most once per run."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

import qlint.analysis.regions
import qlint.full.rules
from qlint.api import fix
from qlint.full.lint import lint_program
from qlint.rules.catalog import load_catalog
from qlint.rules.table import TABLE, Code, Scope, static_codes
from qlint.settings.config import Config


def example(name: str) -> tuple[Any, ...]:
    from examples import models

    return getattr(models, name)()[1]


@pytest.fixture
def evaluations(monkeypatch: pytest.MonkeyPatch) -> Counter[tuple[str, ...]]:
    """Counts exhaustive evaluations, keyed by the evaluated region's output nodes."""
    counts: Counter[tuple[str, ...]] = Counter()
    original = qlint.analysis.regions.evaluate

    def counting(view: Any, island: Any, dq: Any, values: Any) -> Any:
        counts[tuple(o.name for o in island.outputs)] += 1
        return original(view, island, dq, values)

    monkeypatch.setattr(qlint.analysis.regions, "evaluate", counting)
    return counts


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts island classifications and fold plans."""
    counts: Counter[str] = Counter()
    for module, name in ((qlint.analysis.regions, "classify"), (qlint.full.rules, "plan_region")):
        original = getattr(module, name)

        def counting(*args: Any, _name: str = name, _original: Any = original) -> Any:
            counts[_name] += 1
            return _original(*args)

        monkeypatch.setattr(module, name, counting)
    return counts


def test_each_tiers_registry_has_exactly_the_table_rows_of_its_scope() -> None:
    """Every rule of the table has one function in the registry of the layer that computes it, and
    no registry holds a code the table does not give it: the table decides what runs, typed."""
    from qlint.full.over_budget import FIGURE_RULES
    from qlint.run.suppressions import REPORT_RULES
    from qlint.static.rules import STATIC_RULES

    catalog = load_catalog()
    assert [row.code for row in TABLE] == sorted(catalog) == list(Code)
    by_scope = {scope: {row.code for row in TABLE if row.scope == scope} for scope in Scope}
    assert set(qlint.full.rules.LOWERING_RULES) == by_scope[Scope.LOWERING]
    assert set(qlint.full.rules.REGION_RULES) == by_scope[Scope.REGION]
    assert set(qlint.full.rules.PROGRAM_RULES) == by_scope[Scope.PROGRAM]
    assert set(REPORT_RULES) == by_scope[Scope.REPORT] and set(FIGURE_RULES) == by_scope[Scope.FIGURES]
    assert set(STATIC_RULES) == set(static_codes()) == {Code.CONSTANT_SCALE_ISLAND, Code.REQUANTIZE_PAIR}
    assert qlint.full.rules.REGION_RULES[Code.CONSTANT_SCALE_ISLAND] is qlint.full.rules.constant_scale
    # A function is registered once: no rule runs twice or by a side door.
    functions = [*qlint.full.rules.FULL_RULES.values(), *STATIC_RULES.values(), *REPORT_RULES.values(),
                 *FIGURE_RULES.values()]
    assert len(functions) == len(set(functions)) == len(TABLE) + len(STATIC_RULES)


def test_a_rule_code_is_spelled_only_in_the_rule_table() -> None:
    """`Code` names every rule; a "QL00x" literal anywhere else in the package could drift from it."""
    import re
    from pathlib import Path

    package = Path(qlint.full.rules.__file__).parents[1]
    spelled = {str(path.relative_to(package)) for path in package.rglob("*.py")
               if re.search(r"([\"'])QL\d{3}\1", path.read_text())}
    assert spelled == {"rules/table.py"}


@pytest.mark.model("make_attention")
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


@pytest.mark.model("make_scale")
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


@pytest.mark.model("make_attention")
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


@pytest.mark.model("make_attention")
def test_fix_leaves_what_a_deselected_rule_would_fold(fixed: Callable[..., Any], quantized: Callable[..., Any]) -> None:
    """ruff's rule: --fix fixes only what the selected rules report."""
    from qlint.analysis.islands import requantize_pairs
    from qlint.loading.view import GraphView

    program = quantized("make_attention")
    everything = fixed("make_attention")
    assert sorted(f.code for f in everything.summary.folds) == ["QL001", "QL004"]
    assert requantize_pairs(GraphView(everything.program)) == []
    without_ql004 = fix(program, [example("make_attention")], Config(ignore=("QL004",)))
    assert [f.code for f in without_ql004.summary.folds] == ["QL001"]
    assert len(requantize_pairs(GraphView(without_ql004.program))) == 1
