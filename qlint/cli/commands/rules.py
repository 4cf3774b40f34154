"""`qlint rules`: the catalog as a table, one rule a row, with how its fix applies."""

from __future__ import annotations

from qlint.cli.exit_codes import EXIT_ERROR, EXIT_OK
from qlint.cli.output import emit


def cmd_rules() -> int:
    from tabulate import tabulate

    from qlint.rules.catalog import load_catalog

    rows = [[r.code, r.name, r.default_severity, r.fix_text, r.summary] for r in load_catalog().values()]
    return EXIT_OK if emit(tabulate(rows, headers=["code", "name", "severity", "fix", "summary"],
                                    tablefmt="simple")) else EXIT_ERROR
