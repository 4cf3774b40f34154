"""The docs are rendered from the rule catalog and the code, and must not drift from either."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import fields
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
PATH = re.compile(r"`((?:qlint|tests|scripts|examples|rules)/[\w/.-]*\.(?:py|yaml))`")


def render_docs():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("render_docs", ROOT / "scripts" / "render_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rules_page_readme_and_board_tables_are_rendered_from_their_sources() -> None:
    module = render_docs()
    assert (ROOT / "docs" / "rules.md").read_text(encoding="utf-8") == module.render(), (
        "docs/rules.md is stale: run python scripts/render_docs.py"
    )
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert module.render_readme(readme) == readme, "README's rule table is stale: run python scripts/render_docs.py"
    assert module.rule_table() in readme
    budgets = (ROOT / "docs" / "budgets.md").read_text(encoding="utf-8")
    stale = "docs/budgets.md's board table is stale: run scripts/render_docs.py"
    assert module.render_budgets(budgets) == budgets, stale
    cost_model = (ROOT / "docs" / "cost-model.md").read_text(encoding="utf-8")
    assert module.render_cost_model(cost_model) == cost_model, (
        "docs/cost-model.md's coefficient tables are stale: run python scripts/render_docs.py")
    assert module.cycles_tables(module.cost_table()) in cost_model


def test_readme_lists_every_rule_with_its_fix_applicability() -> None:
    from qlint.rules.catalog import load_catalog

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for rule in load_catalog().values():
        assert f"[{rule.code}](docs/rules.md#{rule.name}-{rule.code.lower()})" in readme
        assert f"| {rule.name} | {rule.default_severity} | {rule.fix_text} |" in readme


def test_readme_fits_on_a_page_and_links_every_docs_page() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.encode()) <= 12 * 1024
    for page in DOCS:
        assert f"](docs/{page.name})" in readme, page.name


def test_every_path_the_project_files_name_exists() -> None:
    """The packaging, hook and Action files name repository files in comments and commands too."""
    bare = re.compile(r"(?<![\w/])((?:qlint|tests|scripts|examples|rules)/[\w/.-]*\.(?:py|yaml|sh))\b")
    named = 0
    for name in ("pyproject.toml", ".pre-commit-hooks.yaml", "action.yml"):
        for path in bare.findall((ROOT / name).read_text(encoding="utf-8")):
            named += 1
            assert (ROOT / path).exists(), f"{name}: {path}"
    assert named > 0


def test_every_relative_link_and_named_path_exists() -> None:
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for target in LINK.findall(text):
            if "://" not in target:
                assert (page.parent / target).exists(), f"{page.name}: {target}"
        for path in PATH.findall(text):
            assert (ROOT / path).exists(), f"{page.name}: {path}"


def test_readme_commands_are_the_ones_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)\n```", readme, re.S)
    assert blocks[:2] == ['pip install -e . && qlint check examples/attention.pt2',
                          'pip install -e ".[test]" && python -m pytest']
    assert (ROOT / ".ci" / "run").read_text().rstrip().endswith(blocks[1])


def test_the_cause_classes_page_covers_every_written_check() -> None:
    """docs/causes.md lists the conditions of every ExecuTorch check qlint evaluates, and the
    README links it: a check added to qlint.analysis.conditions without its row fails here."""
    from qlint.analysis import conditions

    page = (ROOT / "docs" / "causes.md").read_text()
    for check in conditions.PATTERN_CONDITIONS:
        assert f"`{check}`" in page, check
    assert conditions.EXECUTORCH in page
    assert "(docs/causes.md)" in (ROOT / "README.md").read_text()


def fenced_block_after(text: str, marker: str) -> str:
    """The body of the first fenced code block after `marker`."""
    start = text.index("```", text.index(marker))
    body = text.index("\n", start) + 1
    return text[body:text.index("```", body)]


def test_readme_example_is_the_real_output() -> None:
    """README quotes `qlint check examples/attention.pt2`; tests/full/test_golden.py holds
    golden/readme.txt to that run, and here the quote to golden/readme.txt ("..." elides lines)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quoted = fenced_block_after(readme, "# qlint")
    command, *shown = quoted.rstrip("\n").split("\n")
    assert command == "$ qlint check examples/attention.pt2"
    golden = (ROOT / "tests" / "full" / "golden" / "readme.txt").read_text(encoding="utf-8")
    exit_line, *real = golden.rstrip("\n").split("\n")
    assert exit_line == "exit 1"
    pattern = "\n".join("[\\s\\S]*" if line == "..." else re.escape(line) for line in shown)
    assert re.fullmatch(pattern, "\n".join(real)), "README's example is not qlint's output: see golden/readme.txt"


def test_cli_page_names_every_option_command_and_exit_code() -> None:
    from qlint.cli import exit_codes, main

    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    parser = main.build_parser()
    for name, command in parser.commands.items():
        assert f"qlint {name}" in page, name
        for action in command._actions:
            for option in set(action.option_strings) - {"-h", "--help"}:
                assert re.search(rf"(?<![\w-]){option}(?![\w-])", page), f"qlint {name} {option}"
            if action.choices and action.option_strings and action.dest != "target_cpu":  # CPUs: "m0 ... m85"
                assert f"{action.option_strings[0]} {'|'.join(action.choices)}" in page, action.option_strings
    for code in (exit_codes.EXIT_OK, exit_codes.EXIT_FINDINGS, exit_codes.EXIT_ERROR, exit_codes.EXIT_INTERRUPTED):
        assert f"**{code}**" in page, code


def test_configuration_page_quotes_what_init_writes() -> None:
    from qlint.rules.catalog import load_catalog
    from qlint.settings.config import DEFAULT_CONFIG, RemedyName

    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert fenced_block_after(page, "`qlint init` writes") == DEFAULT_CONFIG
    for rule in load_catalog().values():  # every rule at its default severity
        assert f"\n  {rule.code}: {rule.default_severity}\n" in DEFAULT_CONFIG, rule.code
    known = " ".join(DEFAULT_CONFIG.replace("# ", "").split()).split("Known: ", 1)[1].split(".", 1)[0]
    assert [name for name in RemedyName if name not in known] == []  # every remedy named, by flow


def test_documented_limits_are_the_defaults() -> None:
    from qlint.io.limits import Limits
    from qlint.settings.config import DEFAULT_CONFIG

    table = dict(re.findall(r"^\| `(\w+)` \| ([\d.]+) \|", (ROOT / "docs" / "inputs.md").read_text(), re.M))
    for field in fields(Limits):
        default = f"{getattr(Limits(), field.name):g}"
        assert table.get(field.name) == default, field.name
        assert f"{field.name}: {default}" in DEFAULT_CONFIG, field.name
