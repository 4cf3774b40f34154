"""Kept remedies as a unified diff of each target's factory, where the change is mechanical.

A remedy that changes what a factory returns (`Remedy.edits_factory`; the table in
`qlint.remedies.all_remedies` says which) is written as a change to the factory, by its own
`edit_factory`. The other remedies belong in the user's export script, which qlint does not know;
their lines are printed. The factory's file is parsed, never imported, and never written: the
diff goes to the path the user names with `--write patch:PATH`.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

from qlint.io.limits import SOURCE_MAX_BYTES
from qlint.io.reads import ReadError, read_input
from qlint.records.results import RemedyReport, RemedyStatus
from qlint.remedies.remedy import Remedy


@dataclass(frozen=True)
class Patch:
    diff: str          # unified diff, "" when nothing is mechanical
    notes: list[str]   # per target: what was written, or why not


def _in_factory(kept: set[str]) -> list[Remedy]:
    """The kept remedies that change what the factory returns, in the table's order.

    The table imports the stack, so it is read only here, once remedies were kept, which only a
    full run has: `--static --write patch:PATH` stays torch-free.
    """
    from qlint.remedies.all_remedies import REMEDIES

    return [remedy for name, remedy in REMEDIES.items() if name in kept and remedy.edits_factory]


def remedy_patch(reports: list[RemedyReport], root: Path) -> Patch:
    """One unified diff over every target whose kept remedies include one that changes the factory."""
    edited: dict[Path, tuple[list[str], list[str]]] = {}
    notes: list[str] = []
    done: set[tuple[Path, str]] = set()
    for report in reports:
        kept = {o.remedy for o in report.outcomes if o.status == RemedyStatus.KEPT}
        in_factory = _in_factory(kept) if kept else []
        if not in_factory:
            if kept:
                notes.append(f"{report.artifact}: {', '.join(sorted(kept))} change the export script, "
                             "not the factory: add the printed lines by hand")
            continue
        if not report.factory_file:
            notes.append(f"{report.artifact}: the factory's file is not known")
            continue
        path = Path(report.factory_file)
        if (path, report.factory) in done:  # two targets of one factory: one change
            continue
        done.add((path, report.factory))
        try:
            if path not in edited:
                text = read_input(path, SOURCE_MAX_BYTES, "factory source").decode("utf-8")
                edited[path] = (text.splitlines(keepends=True), text.splitlines(keepends=True))
        except (ReadError, UnicodeDecodeError) as exc:
            notes.append(f"{report.artifact}: cannot read {path.name}: {exc}")
            continue
        for remedy in in_factory:
            changed = remedy.edit_factory("".join(edited[path][1]), report.factory.rsplit(":", 1)[1])
            if isinstance(changed, str):
                notes.append(f"{report.artifact}: {remedy.name} is not mechanical in {path.name}: {changed}")
                continue
            edited[path] = (edited[path][0], changed)
            notes.append(f"{report.artifact}: {remedy.name} written as a change to {path.name}")
    diff: list[str] = []
    for path, (before, after) in edited.items():
        if before == after:
            continue
        name = path.resolve().relative_to(root.resolve()).as_posix() if path.resolve().is_relative_to(
            root.resolve()) else path.name
        diff.extend(difflib.unified_diff(before, after, f"a/{name}", f"b/{name}"))
    return Patch("".join(diff), notes)
