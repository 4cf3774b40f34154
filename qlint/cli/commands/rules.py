"""`qlint rules`: the catalog as a table, one rule a row, with how its fix applies; `--output-format
json`: every field of every rule, its page included (`catalog.rule_record`)."""

from __future__ import annotations

import json

from qlint.cli.exit_codes import EXIT_ERROR, EXIT_OK
from qlint.cli.output import emit

RULE_FORMATS = ("text", "json")


def cmd_rules(output_format: str = "text") -> int:
    from tabulate import tabulate

    from qlint.rules.catalog import load_catalog, rule_record

    if output_format == "json":
        return EXIT_OK if emit(json.dumps([rule_record(r) for r in load_catalog().values()], indent=2)) else EXIT_ERROR
    rows = [[r.code, r.name, r.default_severity, r.fix_text, r.summary] for r in load_catalog().values()]
    return EXIT_OK if emit(tabulate(rows, headers=["code", "name", "severity", "fix", "summary"],
                                    tablefmt="simple")) else EXIT_ERROR
