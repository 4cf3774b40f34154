"""`qlint rule CODE`: one rule's page: what it finds, why it matters, an example, its fix applicability
and safety; `qlint rule --all`: every rule's page, in code order (as `ruff rule --all`); with
`--output-format json`, the rule's record (a list of them with `--all`), its page as `explanation`."""

from __future__ import annotations

import json

from qlint.cli.exit_codes import EXIT_ERROR, EXIT_OK
from qlint.cli.output import emit, say
from qlint.io.reads import printable


def cmd_rule(code: str | None, output_format: str = "text") -> int:
    """One rule's page (`code`), or every rule's (None: `--all`)."""
    from qlint.rules.catalog import load_catalog, render_rule, rule_record

    catalog = load_catalog()
    if code is None:
        rules = list(catalog.values())
    else:
        found = next((rule for known, rule in catalog.items() if known == code.upper()), None)
        if found is None:
            say(f"qlint: error: unknown rule {printable(repr(code))} (known: {', '.join(catalog)})")
            say("Run 'qlint rules' for the list.")
            return EXIT_ERROR
        rules = [found]
    if output_format == "json":
        records = [rule_record(r) for r in rules]
        text = json.dumps(records if code is None else records[0], indent=2)
    else:
        text = "\n".join(render_rule(r) for r in rules).removesuffix("\n")
    return EXIT_OK if emit(text) else EXIT_ERROR
