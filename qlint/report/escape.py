"""How a name or message from an input is written into each output, so that it stays text.

File names, target and board names, node names and messages come from artifacts, configs and the
file system, which a pull request controls. In a CI log a line that starts with `::` is a workflow
command (`qlint.io.reads.not_a_command`); in a GitHub workflow command `%`, line breaks and, in a
property, `:` and `,` are syntax; in the markdown of a job summary `|` ends a table cell and HTML,
emphasis, links and code spans are markup; a spreadsheet runs a CSV cell that starts with `=` as a
formula. Each function here escapes one of these.
"""

from __future__ import annotations

import re
from urllib.parse import quote

from qlint.io.reads import printable

# The characters that start inline markup inside a line of GitHub's markdown (HTML, entities,
# emphasis, strikethrough, links and images, code spans, a table cell's end); CommonMark renders a
# backslash before any ASCII punctuation as the character itself. (`#`, `-` and `>` start markup
# only at the start of a line, where qlint never puts a name.)
_MARKUP = re.compile(r"([\\`*_\[\]<>|&~])")
_BACKTICKS = re.compile(r"`+")


def github_value(value: str, prop: bool = False) -> str:
    """A workflow command's message (or, with `prop`, a property value) as GitHub reads it back."""
    value = value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if prop:
        value = value.replace(":", "%3A").replace(",", "%2C")
    return value


# What starts a formula in a spreadsheet's cell (OWASP's list; a tab or carriage return is escaped first).
_FORMULA_STARTS = ("=", "+", "-", "@")


def spreadsheet_cell(text: str) -> str:
    """`text` as a CSV cell a spreadsheet shows as text: control characters escaped (a carriage return
    would start a row, a tab be skipped), then a quote before a cell that would start a formula, also
    after leading spaces."""
    text = printable(text)
    return f"'{text}" if text.lstrip().startswith(_FORMULA_STARTS) else text


def markdown_text(text: str) -> str:
    """`text` as plain text in markdown, also inside a table cell: control characters escaped and
    each character that could start markup (HTML, emphasis, links, code, a cell's end) backslashed."""
    return _MARKUP.sub(r"\\\1", printable(text))


def markdown_code(text: str) -> str:
    """`text` as a code span, also inside a table cell: fenced with more backticks than it holds
    in a row, and with `|` escaped (GitHub splits table cells before it reads code spans)."""
    text = printable(text).replace("|", "\\|")
    fence = "`" * (1 + max((len(run) for run in _BACKTICKS.findall(text)), default=0))
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def markdown_link(text: str, target: str, image: bool = False) -> str:
    """A link (or image) to a file the run wrote, its text escaped and its address percent-encoded."""
    return f"{'!' if image else ''}[{markdown_text(text)}]({quote(target, safe='/._-~')})"


def markdown_fence(lines: list[str]) -> list[str]:
    """`lines` (already one line each) as a fenced code block no line of theirs can close."""
    longest = max((len(run) for line in lines for run in _BACKTICKS.findall(line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, *lines, fence]
