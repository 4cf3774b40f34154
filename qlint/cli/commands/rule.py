"""`qlint rule CODE`: one rule's page: what it finds, why it matters, an example, its fix applicability and safety."""

from __future__ import annotations

from qlint.cli.exit_codes import EXIT_ERROR, EXIT_OK
from qlint.cli.output import emit, say
from qlint.io.reads import printable


def cmd_rule(code: str) -> int:
    from qlint.rules.catalog import load_catalog, render_rule

    catalog = load_catalog()
    found = next((rule for known, rule in catalog.items() if known == code.upper()), None)
    if found is None:
        say(f"qlint: error: unknown rule {printable(repr(code))} (known: {', '.join(catalog)})")
        say("Run 'qlint rules' for the list.")
        return EXIT_ERROR
    return EXIT_OK if emit(render_rule(found).removesuffix("\n")) else EXIT_ERROR
