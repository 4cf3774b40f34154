"""Run qlint over inputs: find artifacts and targets, answer from the cache, lint or fix each one.

The per-program work (lower, run the rules) is `qlint.full.lint`; this module
owns discovery, the cache, shards, child processes and writing fixes.

The cache: `entry` decides which answers are kept and under which key, for a file (its bytes) and
a target (its sources) alike. A file's entry is read and written by `lint_file`, which has its
bytes; a target's is read by `run` before any child starts (a cached target needs no torch) and
written by `run_one` after its child answered.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import os
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qlint.full.over_budget import figure_findings
from qlint.io.reads import CONFIGURED, ReadError, first_line, printable, shown_path
from qlint.records.results import FixSummary, InputError, Report
from qlint.run.cache import Cache
from qlint.settings.config import Config, RemedyName, Target
from qlint.settings.options import FixOptions, RunOptions

if TYPE_CHECKING:
    from qlint.fix.program import FixResult
    from qlint.full.rules import Linted


def _matches(rel: str, patterns: Iterable[str]) -> bool:
    return any(
        fnmatch.fnmatch(rel, p) or (p.startswith("**/") and fnmatch.fnmatch(rel, p[3:])) for p in patterns
    )


def collect(paths: list[Path], config: Config,
            options: RunOptions | None = None) -> tuple[list[Path], list[InputError]]:
    """Files to check, in a stable order: explicit files as given, directories walked.

    Walking never follows a symlinked folder (no loops); a matching name that is
    not a regular file (a FIFO, a device, a dangling link) is an error, not a skip,
    and so is a folder that cannot be listed (too deep for the OS's path limit,
    unreadable): it may hold artifacts, and a run must not pass by not seeing them.
    A walk passes over the files of a kind the run's mode does not take (a `.pte` under
    `--fix`, which a first fix may have written beside its `.pt2`, or under `--static`);
    named on the command line, such a file is an error (`_reader`).
    """
    files: list[Path] = []
    errors: list[InputError] = []
    for path in paths:
        try:
            folder = stat.S_ISDIR(path.stat().st_mode)
        except OSError as exc:
            if not os.path.lexists(path):  # a dangling link is read (and refused) like any file
                errors.append(InputError(display(path), _missing(exc)))
                continue
            folder = False
        if folder:
            _walk(path, config, files, errors, options)
        else:
            files.append(path)
    return files, errors


def _passed_over(path: Path, options: RunOptions | None) -> bool:
    """Whether a folder walk leaves `path` out: a kind qlint reads, but not in this run's mode."""
    reader = READERS.get(path.suffix)
    return options is not None and reader is not None and _refusal(reader, path, options) is not None


def _missing(exc: OSError) -> str:
    """Why a path given on the command line cannot be found."""
    if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
        return "no such file or directory"
    return f"cannot read: {exc.strerror or exc}"


def _walk(top: Path, config: Config, files: list[Path], errors: list[InputError], options: RunOptions | None) -> None:
    """`os.walk`'s top-down, sorted order, without its recursion (a deep tree is no RecursionError)
    or its silence about the folders it cannot list."""
    stack = [top]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError as exc:
            errors.append(InputError(display(folder), f"cannot list this folder: {exc.strerror or exc}"))
            continue
        subfolders = []
        for entry in entries:
            found = folder / entry.name
            if _is_folder(entry):
                subfolders.append(found)
                continue
            rel = found.relative_to(top).as_posix()
            if not _matches(rel, config.include) or _matches(rel, config.exclude) or _passed_over(found, options):
                continue
            problem = _not_regular(found)
            if problem is None:
                files.append(found)
            else:
                errors.append(InputError(display(found), problem))
        stack.extend(reversed(subfolders))


def _is_folder(entry: os.DirEntry[str]) -> bool:
    """A real folder (a symlink to one is not walked into)."""
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _not_regular(path: Path) -> str | None:
    """Why a walked name that matches cannot be checked, or None for a regular file (symlinks followed)."""
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):  # a dangling link
        return "not a regular file"
    except OSError as exc:  # a symlink loop, a path over the OS's limit
        return f"cannot read: {exc.strerror or exc}"
    return None if stat.S_ISREG(mode) else "not a regular file"


def display(path: Path) -> str:
    """How an artifact is named in reports: relative to the working directory when inside it."""
    return shown_path(path, Path.cwd()) or path.as_posix()


def fix_into(
    report: Report,
    program: Any,
    artifact: str,
    destination: Path,
    inputs: list[tuple[Any, ...]],
    config: Config,
    options: RunOptions,
) -> None:
    """Fix one program and write its .pte atomically; on any failure write nothing."""
    from qlint.fix.apply import fix_program
    from qlint.fix.errors import FixError, VerificationError

    try:
        result = fix_program(program, artifact, config, inputs, options)
        _measured_fix(report, artifact, result, options)
    except FixError as exc:
        if exc.refused is None:
            report.errors.append(InputError(artifact, str(exc)))
            return
        # A finding of the check is why: the check's report, and the fix it did not write
        _checked(report, program, exc.refused, artifact, config, options, inputs)
        report.fixes.append(FixSummary(artifact, not_written=exc.why))
        return
    except VerificationError as exc:
        report.errors.append(InputError(artifact, f"fix failed verification, nothing written: {exc}"))
        return
    record_fix(report, result, artifact, destination)


def _measured_fix(report: Report, artifact: str, result: FixResult, options: RunOptions) -> None:
    """The figures of a fix that was made, when budgets or metrics ask (`--diff` writes no program:
    its figures have no memory, and a memory budget says it was not measured)."""
    if options.measure:
        from qlint.fix.measure import of_fix

        figures = of_fix(artifact, result.findings, result)
        if result.serialized is None:
            figures.measured = "not measured: --diff serializes no program"
        report.figures.append(figures)


# What `--fix` writes beside `<name>.pte`: its ETRecord, for ExecuTorch's Inspector and `--profile`.
ETRECORD_SUFFIX = ".etrecord"


def record_fix(report: Report, result: FixResult, artifact: str, destination: Path) -> None:
    """Write a verified fix's .pte (none for a dry run) and add its findings and summary to the report."""
    from qlint.fix.program import etrecord
    from qlint.io.writes import OutputFailed, write_all

    if result.pte is not None:
        record = destination.with_suffix(ETRECORD_SUFFIX)
        try:
            recorded = etrecord(result.program, result.serialized) if result.serialized is not None else None
        except Exception as exc:  # ExecuTorch could not record the program it serialized: write neither

            report.errors.append(InputError(artifact, f"cannot record the ETRecord of the fixed program, nothing "
                                                      f"written: {type(exc).__name__}: {first_line(exc)}"))
            return
        try:  # the program and its record, or neither
            destination.parent.mkdir(parents=True, exist_ok=True)  # a folder --output-dir mirrors
            write_all([(destination, result.pte), *([(record, recorded)] if recorded is not None else [])])
        except OSError as exc:
            failed = exc.path if isinstance(exc, OutputFailed) else destination.parent
            report.errors.append(InputError(artifact, f"cannot write {display(failed)}: {exc.strerror or exc}"))
            return
        result.summary.output = display(destination)
    report.findings.extend(result.findings)
    report.stats.append(result.stats)
    report.fixes.append(result.summary)


def lint_file(path: Path, config: Config, options: RunOptions, cache: Cache | None = None, *,
              isolate: bool = False) -> Report:
    """Read one artifact's bytes once (bounded), answer from the cache or lint them.

    The cache is consulted here, before any child process or torch import. What the artifact's
    kind allows (`READERS`: the static tier, `--fix`, decoding in a child) is decided here too.
    """
    from qlint.io.reads import read_input
    from qlint.run.isolation import run_isolated

    artifact = display(path)
    try:
        reader = _reader(path, options)
        data = read_input(path, config.limits.file_bytes, "artifact", CONFIGURED)
    except ReadError as exc:
        return Report(errors=[InputError(artifact, str(exc))])
    key = entry(cache, config, options, data=data, artifact=artifact)
    hit = cache.get(key, artifact) if cache is not None and key is not None else None
    if hit is not None:
        return hit
    if options.static:
        report = lint_static_bytes(data, artifact, config)
    elif isolate or reader.isolated or options.profile is not None:  # a profile decodes like a `.pte`
        report = run_isolated(
            lint_bytes, (path, data, artifact, config, options), name=artifact, limits=config.limits,
            verbose=options.verbose,
        )
    else:
        report = lint_bytes(path, data, artifact, config, options)
    if cache is not None and key is not None:
        cache.put(key, report)
    return report


@dataclass(frozen=True)
class Reader:
    """How one kind of artifact is checked: its full check, and what else its kind allows."""

    full: Callable[[Path, bytes, str, Config, RunOptions], Report]
    static: bool      # the static tier reads it, no torch
    fixable: bool     # `--fix` writes a `.pte` from it
    isolated: bool    # always decoded in a child: a `.pte`'s flatbuffer can share one table many times
                      # over, so its decoding is bounded by the child's memory budget and timeout


def _reader(path: Path, options: RunOptions) -> Reader:
    """The reader of `path`'s kind, or a ReadError when the run asks what its kind cannot do."""
    reader = READERS.get(path.suffix)
    if reader is None:
        raise ReadError(f"unsupported file type {path.suffix or '(none)'!r}: expected {' or '.join(READERS)}")
    problem = _refusal(reader, path, options)
    if problem is not None:
        raise ReadError(problem)
    return reader


def _refusal(reader: Reader, path: Path, options: RunOptions) -> str | None:
    """Why the run's mode cannot take a file of `reader`'s kind (`--fix`, `--static`), or None."""
    if options.fix is not None and not reader.fixable:
        return f"{path.suffix} files can be checked but not fixed: fix the .pt2 it came from"
    if options.static and not reader.static:
        return (f"{path.suffix} files need the full check (ExecuTorch's reader imports torch): "
                "qlint check without --static")
    return None


def lint_static_bytes(data: bytes, artifact: str, config: Config) -> Report:
    """The static tier on the bytes of a `.pt2`: in this process, torch never imported."""
    from qlint.static.rules import lint_static

    try:
        return lint_static(data, artifact, config)
    except (ReadError, OverflowError) as exc:
        return Report(errors=[InputError(artifact, input_problem(exc))])


def input_problem(exc: ReadError | OverflowError) -> str:
    """The one-line error of an artifact that could not be read. An OverflowError can only come
    from the artifact's numbers (an integer too large for a float): the file is corrupt, qlint is not."""
    if isinstance(exc, OverflowError):

        return f"corrupt artifact: a number out of range ({first_line(exc)})"
    return str(exc)


def lint_bytes(path: Path, data: bytes, artifact: str, config: Config, options: RunOptions) -> Report:
    """Lint (or fix) the bytes of one artifact, by its kind's reader (in a child, when isolated)."""
    from qlint.run.collector import freeze_the_stack

    freeze_the_stack()  # in qlint's own process, before the reader's lowering allocates
    report = Report()
    try:
        return READERS[path.suffix].full(path, data, artifact, config, options)
    except (ReadError, OverflowError) as exc:
        report.errors.append(InputError(artifact, input_problem(exc)))
    return report


def _lint_pt2(path: Path, data: bytes, artifact: str, config: Config, options: RunOptions) -> Report:
    from qlint.loading.inputs import sample_inputs
    from qlint.loading.readers import read_pt2

    report = Report()
    program = read_pt2(data, config.limits)
    with _profile_errors(options):
        measure = _through_etrecord(path, config, options) if options.profile is not None else None
        _lint_or_fix(report, program, artifact, config, options, Work(path=path), sample_inputs(program), [],
                     measure)
    return report


def _lint_pte(path: Path, data: bytes, artifact: str, config: Config, options: RunOptions) -> Report:
    from qlint.full.lint import lint_pte

    with _profile_errors(options):
        return lint_pte(data, artifact, config, options.measure, _input(options.profile, "ETDump", config))


def _input(path: str | None, what: str, config: Config, named: str = "") -> bytes | None:
    """The bytes of a file the run was given besides the artifact (bounded like one), None without one;
    a ProfileError saying why not (after `named`)."""
    from qlint.device.profile import ProfileError
    from qlint.io.reads import read_input

    if path is None:
        return None
    try:
        return read_input(Path(path), config.limits.file_bytes, what, CONFIGURED)
    except ReadError as exc:
        raise ProfileError(f"{named}{exc}") from None


def _through_etrecord(path: Path, config: Config, options: RunOptions) -> Callable[..., Any]:
    """How a `.pt2`'s lowering is measured by a profile of the `.pte` `--fix` wrote from it: through
    that fix's ETRecord (`--etrecord`, else `<name>.etrecord` beside the `.pt2`, where `--fix` writes it),
    the profile held to the instructions of the `.pte` written with it (`<name>.pte` beside it)."""
    from qlint.device.profile import (
        ProfileError,
        check_profile,
        check_record,
        measured_through,
        read_etrecord,
        read_profile,
    )

    etrecord = options.etrecord or str(path.with_suffix(ETRECORD_SUFFIX))
    if not Path(etrecord).exists() and options.etrecord is None:
        raise ProfileError(f"a profile of a .pt2 maps to it through the ETRecord `qlint check --fix` wrote; "
                           f"{printable(etrecord)} does not exist (--etrecord FILE)")
    named = f"ETRecord {printable(etrecord)}: "
    pte = str(Path(etrecord).with_suffix(".pte"))
    try:
        record = read_etrecord(_input(etrecord, "ETRecord", config) or b"", config.limits)
        steps = _instructions(pte, config)
        check_record(record, steps, printable(pte))
    except ProfileError as exc:
        raise ProfileError(named + str(exc)) from None
    profile = read_profile(_input(options.profile, "ETDump", config) or b"", config.limits)
    check_profile(profile, steps, f"{printable(pte)}, the .pte written with the ETRecord")
    return functools.partial(measured_through, profile, record)


def _instructions(pte: str, config: Config) -> list[str]:
    """The instructions of the `.pte` written with an ETRecord, or a ProfileError naming it."""
    from qlint.device.profile import ProfileError
    from qlint.loading.pte import pte_steps

    try:
        return pte_steps(_input(pte, ".pte", config) or b"", config.limits)
    except ReadError as exc:
        raise ProfileError(f"the .pte written with it, {printable(pte)}: {exc}") from None


@contextlib.contextmanager
def _profile_errors(options: RunOptions) -> Iterator[None]:
    """A profile (or ETRecord) that cannot be read, or is of another program: one line naming it."""
    from qlint.device.profile import ProfileError, ProfileMismatch

    named = f"profile {printable(str(options.profile))}"
    try:
        yield
    except ProfileMismatch as exc:
        raise ReadError(f"{named} is not of this program: {exc}") from None
    except ProfileError as exc:
        raise ReadError(f"{named}: {exc}") from None


# The artifact kinds qlint reads, by suffix: the one place a suffix decides anything.
READERS = {
    ".pt2": Reader(_lint_pt2, static=True, fixable=True, isolated=False),
    ".pte": Reader(_lint_pte, static=False, fixable=False, isolated=True),
}


def lint_target(target: Target, config: Config, options: RunOptions) -> Report:
    """Export, quantize and lint one config target (run in a child process by `run`).

    With `--fix` and remedies selected, the remedies that help are applied first
    (`qlint.remedies.search`), and the folds act on that build.
    """
    from qlint.loading.quantize import BuildError, call_factory, quantize

    artifact = f"target:{target.name}"
    report = Report()
    config = config.for_target(target)  # its board and NPU, checked when the config was read
    try:
        model, example, calibration = call_factory(target, config.base, config.root)
        remedies = target_remedies(target, config, options)
        if remedies:
            from qlint.loading.quantize import module_file
            from qlint.remedies.remedy import Build
            from qlint.remedies.search import remediate

            remediated = remediate(Build(model, example, tuple(calibration or ())), remedies, config, artifact)
            remediated.report.factory = target.factory
            remediated.report.factory_file = module_file(target.factory.split(":")[0]) or ""
            report.remedies.append(remediated.report)
            if remediated.error is not None:
                report.errors.append(InputError(artifact, remediated.error))
                return report
            assert options.fix is not None
            if not options.fix.dry_run:  # the build remediate chose is already fixed and verified
                destination = fix_destination(Work(target=target), config, options.fix)
                _measured_fix(report, artifact, remediated.fixed, options)
                record_fix(report, remediated.fixed, artifact, destination)
                return report
            program, built = remediated.program, remediated.build
            example, calibration = built.example, list(built.calibration) or None
        else:
            program = quantize(model, example, calibration, npu=config.npu)
    except BuildError as exc:
        report.errors.append(InputError(artifact, str(exc)))
        return report
    except Exception as exc:  # the factory's model made export or quantization raise

        cause = f"{type(exc).__name__}: {first_line(exc)}"
        report.errors.append(InputError(artifact, f"export/quantization failed: {cause}"))
        return report
    try:
        _lint_or_fix(report, program, artifact, config, options, Work(target=target), example, calibration or [])
    except ReadError as exc:  # what lowering needs and this machine lacks (Vela for an NPU target)
        report.errors.append(InputError(artifact, str(exc)))
    return report


def target_remedies(target: Target, config: Config, options: RunOptions) -> tuple[RemedyName, ...]:
    """What `--fix` may change in how a target is built: all with --unsafe-fixes, else the config's."""
    if options.fix is None:
        return ()
    if options.fix.unsafe_fixes:
        from qlint.remedies.search import remedies_for

        return remedies_for(config)
    return target.remedies if target.remedies is not None else config.remedies


def _lint_or_fix(report: Report, program: Any, artifact: str, config: Config, options: RunOptions,
                 work: Work, example: tuple[Any, ...] | None, extra: list[tuple[Any, ...]],
                 measured: Callable[..., Any] | None = None) -> None:
    """The step files and targets share: lint a quantized program, or fix it into its `.pte`
    (`fix_destination`; `measured`: cycles a profile measured, `lint_program`'s `measure`)."""
    from qlint.loading.inputs import verification_inputs

    if options.fix is None:
        from qlint.full.lint import lint_program

        linted = lint_program(program, artifact, config, options, measure=measured)
        _checked(report, program, linted, artifact, config, options,
                 verification_inputs(example, extra) if options.measure else [])
        return

    destination = fix_destination(work, config, options.fix)
    fix_into(report, program, artifact, destination, verification_inputs(example, extra), config, options)


def _checked(report: Report, program: Any, linted: Linted, artifact: str, config: Config, options: RunOptions,
             inputs: list[tuple[Any, ...]]) -> None:
    """A check's findings, stats and (when budgets or metrics ask) figures, measured on `inputs`, into `report`."""
    report.findings.extend(linted.findings)
    report.stats.append(linted.stats)
    if options.measure:
        from qlint.fix.measure import measure

        figures = measure(program, linted, artifact, config, inputs, options)
        if linted.stats.measured_runs:
            figures.timed_by(linted.stats)
        report.figures.append(figures)


@dataclass(frozen=True)
class Work:
    """One unit of checking: a file or a config target."""

    path: Path | None = None
    target: Target | None = None

    @property
    def name(self) -> str:
        if self.path is not None:
            return display(self.path)
        assert self.target is not None
        return f"target:{self.target.name}"


def fix_destination(work: Work, config: Config, fix: FixOptions) -> Path:
    """The `.pte` `--fix` writes for one unit (its `.etrecord` beside it): a file's by its path, a
    config target's by its name (`FixOptions.output`)."""
    if work.path is not None:
        return fix.output(work.path.parent, work.path.stem, mirrored=True)
    assert work.target is not None
    return fix.output(config.base, work.target.name)


def with_inputs_root(options: RunOptions, paths: list[Path]) -> RunOptions:
    """`options` with the folder that `--output-dir` mirrors the inputs below: the deepest one that
    holds every named path (a named folder holds itself)."""
    if options.fix is None or options.fix.output_dir is None or not paths:
        return options
    folders = [os.path.abspath(p if os.path.isdir(p) else p.parent) for p in paths]
    return replace(options, fix=replace(options.fix, inputs_root=os.path.commonpath(folders)))


def _apart(work: list[Work], config: Config, fix: FixOptions, errors: list[InputError],
           taken: Mapping[tuple[object, ...], str]) -> list[Work]:
    """`work` without the units whose fix would be written to a file that another unit's fix, or
    another output of the run, writes too (`taken`: the `same_file` key of each and the option that
    names it): the last write would win, silently. Each clash is one error and none of its units is
    fixed, since which one the file should hold is not qlint's to guess. One input named twice is one."""
    from qlint.io.writes import same_file

    claims: dict[tuple[object, ...], dict[object, Work]] = {}
    for unit in work:
        if not _writes_a_fix(unit):
            continue
        identity = same_file(unit.path) if unit.path is not None else unit.name
        claims.setdefault(same_file(fix_destination(unit, config, fix)), {}).setdefault(identity, unit)
    refused: set[tuple[object, ...]] = set()
    for key, units in claims.items():
        first, *others = units.values()
        pte = fix_destination(first, config, fix)
        if others:
            problem = (f"--fix would write {display(pte)} for {', '.join(o.name for o in others)} too: "
                       f"{'neither' if len(others) == 1 else 'none'} is fixed (rename one, or fix them apart)")
        else:
            named = [f"{display(p)}, which {taken[k]} names too" for p in (pte, pte.with_suffix(ETRECORD_SUFFIX))
                     if (k := same_file(p)) in taken]
            if not named:
                continue
            problem = f"--fix would write {named[0]}: not fixed (give that output another path)"
        errors.append(InputError(first.name, problem))
        refused.add(key)
    return [u for u in work if not _writes_a_fix(u) or same_file(fix_destination(u, config, fix)) not in refused]


class OutputOnInput(ValueError):
    """An output of the run names a file the run reads: writing it would replace an input."""


def _outputs_apart_from(files: list[Path], taken: Mapping[tuple[object, ...], str]) -> None:
    """Raise OutputOnInput when an output the run writes (`taken`) is one of its input files, however
    spelled: inputs are never modified, so the run is refused before anything is read."""
    if not taken:
        return
    from qlint.io.writes import same_file

    for path in files:
        option = taken.get(same_file(path))
        if option is not None:
            raise OutputOnInput(f"{option} names the input {display(path)}: give that output another path")


def _writes_a_fix(unit: Work) -> bool:
    """Whether `--fix` writes a program for `unit`: a target, or a file of a kind it fixes (a named
    `.pte` is refused by its reader and writes nothing, so it claims no file)."""
    reader = READERS.get(unit.path.suffix) if unit.path is not None else None
    return unit.path is None or (reader is not None and reader.fixable)


def plan_work(
    paths: list[Path], targets: list[Target], config: Config, shard: tuple[int, int] | None = None,
    options: RunOptions | None = None, taken: Mapping[tuple[object, ...], str] | None = None,
) -> tuple[list[Work], list[InputError]]:
    """Every file and target, in a stable order; with `shard=(i, n)` only the i-th of n slices.

    Slices are taken round-robin over the names sorted, so any machine that sees
    the same inputs computes the same partition. With `options.fix`, units whose fixes would be written to
    one file, or to one of the run's other outputs (`taken`), are refused before the slicing
    (`_apart`), so every shard refuses the same ones.
    """
    files, errors = collect(paths, config, options)
    _outputs_apart_from(files, taken or {})
    work = [Work(path=p) for p in files] + [Work(target=t) for t in targets]
    fix = options.fix if options is not None else None
    if fix is not None and not fix.dry_run:
        work = _apart(work, config, fix, errors, taken or {})
    if shard is not None:
        index, count = shard
        ordered = sorted(work, key=lambda w: w.name)
        chosen = {id(w) for position, w in enumerate(ordered) if position % count == index - 1}
        work = [w for w in work if id(w) in chosen]
    return work, errors


def entry(cache: Cache | None, config: Config, options: RunOptions, *, target: Target | None = None,
          data: bytes = b"", artifact: str = "") -> str | None:
    """The cache key of a check's answer, or None when none is kept: never for a fix (it writes a
    program) or a profiled check (the profile, not the program, decides its figures)."""
    if cache is None or options.fix is not None or options.profile is not None:
        return None
    return cache.target_key(target, config) if target is not None else cache.key(data, artifact)


def run_one(work: Work, config: Config, options: RunOptions, cache: Cache | None = None, *, isolate: bool = False,
            key: str | None = None) -> Report:
    """One file or target; targets always in a child process of their own (`key`: the target's cache entry)."""
    from qlint.run.isolation import run_isolated

    try:
        if work.target is not None:
            report = run_isolated(
                lint_target, (work.target, config, options), name=work.name, limits=config.limits,
                verbose=options.verbose,
            )
            if cache is not None and key is not None:
                cache.put(key, report)
        else:
            assert work.path is not None
            report = lint_file(work.path, config, options, cache, isolate=isolate)
    except Exception as exc:  # a crash in one artifact must not lose the others

        report = Report(errors=[InputError(work.name, f"internal error: {type(exc).__name__}: {first_line(exc)}")])
    report.checked = 1
    return report


def run(
    paths: list[Path],
    targets: list[Target],
    config: Config,
    options: RunOptions | None = None,
    cache: Cache | None = None,
    *,
    jobs: int = 1,
    shard: tuple[int, int] | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    base: dict[str, dict[str, Any]] | None = None,
    taken: Mapping[tuple[object, ...], str] | None = None,
) -> Report:
    """Lint (or fix) everything, reported in the serial order, then run the rules over the measured
    figures (QL009, its growth limits against `base`, a base run's metrics). `taken`: the files the
    run's other outputs write (`plan_work`), which no fix may be written to.

    Targets and `.pte` files always run in a child process (`qlint.run.isolation`);
    with `jobs > 1` so does every artifact, `workers(jobs, ...)` at a time. A child that exits,
    crashes, runs out of its memory budget or times out is one error naming its unit.
    """
    from concurrent.futures import ThreadPoolExecutor

    from qlint.run.isolation import allow_children, stop_children

    options = with_inputs_root(options or RunOptions(), paths)
    work, errors = plan_work(paths, targets, config, shard, options, taken)
    report = Report(errors=errors)
    keys = {id(w): entry(cache, config, options, target=w.target) for w in work if w.target is not None}
    answered = {id(w): hit for w in work
                if cache is not None and (key := keys.get(id(w))) and (hit := cache.get(key, w.name))}
    if work and not options.static and (jobs > 1 or any(w.target is not None and id(w) not in answered for w in work)):
        from qlint.run.isolation import warm_up

        warm_up()  # a child is certain: start importing torch for it now

    def one(item: Work) -> Report:
        if id(item) in answered:
            answered[id(item)].checked = 1
            return answered[id(item)]
        return run_one(item, config, options, cache, isolate=jobs > 1, key=keys.get(id(item)))

    allow_children()
    with ThreadPoolExecutor(max_workers=workers(jobs, len(work))) as pool:
        try:
            results = pool.map(one, work) if jobs > 1 else map(one, work)
            for done, (item, result) in enumerate(zip(work, results, strict=False), 1):
                if progress:
                    progress(done, len(work), item.name)
                report.extend(result)
        except KeyboardInterrupt:  # Ctrl-C: start nothing more, stop the running children, end now
            pool.shutdown(wait=False, cancel_futures=True)
            stop_children()
            raise
    report.findings.extend(figure_findings(report, config, base))
    return report


def workers(jobs: int, units: int) -> int:
    """Threads (each waits on one child) for `--jobs`: no more than the units of work or the CPUs,
    whatever was asked (`--jobs 1000000000` must not start a billion processes)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(jobs, units, cpus))
