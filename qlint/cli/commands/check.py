"""`qlint check` (and `qlint fix`, which is `check --fix`): check the inputs, print the report,
exit by the findings.

`cmd_check` is six steps, in this order, each under its heading below: validate the options,
select the inputs (and read the base run's metrics), check them (`qlint.run.check`, which
`qlint.api.check` calls too: the engine, which runs every rule, QL009 over the measured figures too,
then suppressions and the baseline), compare with the base run, write the outputs (or the
baseline), decide the exit code. A step that ends the run returns its exit code and the later ones
do not run. Torch is imported by the engine only, once a program has to be read: with `--static`
never.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from qlint.cli.exit_codes import EXIT_ERROR, EXIT_FINDINGS, EXIT_OK
from qlint.cli.output import emit, say, to_devnull, usage_error
from qlint.io.reads import printable
from qlint.report import OUTPUT_FORMATS
from qlint.settings.options import FixOptions, LoweringOrder, RunOptions

if TYPE_CHECKING:
    from qlint.records.results import Report
    from qlint.settings.config import Config

# The severities that make the exit code 1, for each `--fail-on`.
FAILING = {"error": ("error",), "warning": ("error", "warning"), "info": ("error", "warning", "info"), "never": ()}


def cmd_check(args: argparse.Namespace) -> int:
    """`qlint check`: the steps below in order; the first that ends the run gives the exit code."""
    problem = _selection_error(args) or _option_error(args)
    if problem:
        return usage_error(problem)
    config = _config(args)
    if config is None:
        return EXIT_ERROR
    problem = _output_on_input(args, config)
    if problem:
        return usage_error(problem)
    options = _run_options(args, config)
    if options is None:
        return EXIT_ERROR
    base = _base_metrics(args)
    if base is False:
        return EXIT_ERROR
    report = _run(args, config, options, base)
    if report is None:
        return EXIT_ERROR
    _compare(report, args, base)
    _no_artifacts(report, args)
    ended = _write_baseline(report, args)
    if ended is not None:
        return ended
    written = _write_outputs(report, args, config)
    return _exit_code(report, args, written)


# Validate the options and the config: what the parser cannot see, refused before anything is read.


def _selection_error(args: argparse.Namespace) -> str | None:
    """The usage error in --select/--ignore (an unknown rule code), or None."""
    from qlint.settings.config import ConfigError, validate_selectors

    def error(message: str) -> ConfigError:
        return ConfigError("<command line>", 0, "", message)

    for option, codes in (("--select", args.select), ("--extend-select", args.extend_select),
                          ("--ignore", args.ignore)):
        try:
            validate_selectors(codes or (), error)
        except ConfigError as exc:
            return f"argument {option}: {exc.message}"
    return None


def _option_error(args: argparse.Namespace) -> str | None:
    """Options that do not go together, or None."""
    if args.static and (args.fix or args.diff or args.targets_only):
        what = "--fix and --diff" if args.fix or args.diff else "config targets"
        return f"{what} need the full check (lowering); drop --static"
    if args.static and (args.compare or any(kind == "metrics" for kind, _ in args.write)):
        # The static tier measures no memory plan or coverage: its metrics would be empty, and a
        # comparison would list every artifact as removed.
        return "--compare and --write metrics: need the full check (figures are measured on the lowered program); " \
               "drop --static"
    if args.unsafe_fixes and not (args.fix or args.diff):
        return "--unsafe-fixes needs --fix or --diff"
    if args.profile is not None and (len(args.paths) != 1 or Path(args.paths[0]).suffix not in (".pte", ".pt2")
                                     or args.static or args.fix or args.diff or args.targets_only):
        return ("--profile reads an ETDump of one program: give the one .pte it was recorded with (or the .pt2 "
                "`--fix` wrote it from), no --static or --fix")
    if args.etrecord is not None and (args.profile is None or Path(args.paths[0]).suffix != ".pt2"):
        return "--etrecord maps a --profile to the .pt2 it was fixed from: give one .pt2 and --profile"
    if args.profile is None and any(kind == "profile-comparison" for kind, _ in args.write):
        return "--write profile-comparison: needs --profile"
    return _shared_output(args)


def _shared_output(args: argparse.Namespace) -> str | None:
    """Two outputs named to one file (however spelled: `./x`, a link to it): the last written would
    replace the other silently, so the run is refused before it starts. (A fix written to one of
    them is refused by the engine, which knows where each fix goes.)"""
    from qlint.io.writes import same_file

    claimed: dict[tuple[object, ...], str] = {}
    for option, path in _outputs(args):
        key = same_file(path)
        if key in claimed:
            return f"{claimed[key]} and {option} name one file: give each output its own path"
        claimed[key] = option
    return None


def _output_on_input(args: argparse.Namespace, config: Config) -> str | None:
    """An output named to a file the run reads besides its artifacts (the config, a baseline, the base
    metrics, a profile and its ETRecord): writing it would replace an input, so the run is refused.
    (An artifact is an input the engine finds: `engine.OutputOnInput`.)"""
    from qlint.io.writes import same_file

    read = [("the config", config.path), ("the baseline", args.baseline), ("the base metrics", args.compare),
            ("the profile", args.profile), ("the ETRecord", args.etrecord)]
    taken = _taken(args)
    for what, path in read:
        if path is not None and (output := taken.get(same_file(path))) is not None:
            return f"{output} names {what} the run reads: give that output another path"
    return None


def _outputs(args: argparse.Namespace) -> list[tuple[str, Path]]:
    """Every file the options name to be written, with the option that names it (`--fix`'s aside)."""
    outputs = [(f"--write {fmt}:{path}", path) for fmt, path in args.write]
    if args.write_baseline is not None:
        outputs.append((f"--write-baseline {args.write_baseline}", args.write_baseline))
    return outputs


def _config(args: argparse.Namespace) -> Config | None:
    """The config the run uses (`named_or_found`), with the command line's board, CPU and rule
    selection (`Config.with_selection`: layered on the config's, as ruff does); None after an error line."""
    from qlint.settings.config import ConfigError, named_or_found

    try:
        config = named_or_found(args.config)
    except ConfigError as exc:
        say(f"qlint: config error: {printable(str(exc))}")
        return None
    problem = _npu_names(args)
    if problem:
        say(f"qlint: {problem}")
        return None
    try:
        config = _with_board(config, args)
    except ValueError as exc:  # --board names no board, a board and a CPU that disagree, a section without an NPU
        say(f"qlint: {_option(args, exc)}: {exc}")
        return None
    problem = None if args.static else _npu_unmet(config, args)
    if problem:
        say(f"qlint: error: {problem}")
        return None
    return config.with_selection(None if args.select is None else tuple(args.select), tuple(args.extend_select or ()),
                                 tuple(args.ignore or ()))


def _npu_unmet(config: Config, args: argparse.Namespace) -> str | None:
    """What an Ethos-U target in this run needs and does not have (Vela, the `ethos-u` extra); None
    when no NPU is named."""
    from qlint.settings.npus import vela_missing

    named = [config.npu] if config.npu is not None else []
    named += [npu for t in config.targets if (npu := config.for_target(t).npu) is not None
              and (args.targets_only or not args.paths)]
    if not named:
        return None
    if args.paths and not args.targets_only and all(str(p).endswith(".pte") for p in args.paths):
        return None  # a `.pte` is read as it was lowered: nothing to compile
    return vela_missing(named[0])


def _npu_names(args: argparse.Namespace) -> str | None:
    """`--target`, `--system-config` or `--memory-mode` naming what ExecuTorch and Vela do not have, as
    `OPTION: message`, or None."""
    from qlint.settings.npus import check_section, check_target

    checks = (("--target", args.target, check_target),
              ("--system-config", args.system_config, lambda name: check_section("System_Config", name)),
              ("--memory-mode", args.memory_mode, lambda name: check_section("Memory_Mode", name)))
    for option, name, check in checks:
        try:
            if name is not None:
                check(name)
        except ValueError as exc:
            return f"{option}: {exc}"
    return None


def _option(args: argparse.Namespace, exc: ValueError) -> str:
    """The option an error of `_with_board` is about: the Vela section left without an NPU when the
    command line names it, else `--board` or `--target-cpu`."""
    from qlint.settings.npus import NoNpu

    if isinstance(exc, NoNpu):
        named = args.system_config if "system" in exc.named else args.memory_mode
        if named is not None:
            return "--system-config" if "system" in exc.named else "--memory-mode"
    return "--board" if args.board is not None else "--target" if args.target is not None else "--target-cpu"


def _with_board(config: Config, args: argparse.Namespace) -> Config:
    """`config` for `--board`, `--target-cpu` and the NPU options (`run.check.for_board`). Raises ValueError."""
    from qlint.run.check import for_board
    from qlint.settings.npus import NpuChoice

    return for_board(config, args.board, args.target_cpu, NpuChoice(args.target, args.system_config, args.memory_mode))


def _run_options(args: argparse.Namespace, config: Config) -> RunOptions | None:
    """How each input is checked (and fixed); None after an error line when `--output-dir` cannot be made.

    The output folder is made before the run, so that a fix is never computed only to find
    nowhere to write it; `--diff` writes nothing and needs none.
    """
    fix = None
    if args.fix or args.diff:
        if args.output_dir is not None and not args.diff:
            from qlint.io.writes import ensure_directory

            problem = ensure_directory(args.output_dir)
            if problem:
                say(f"qlint: error: --output-dir {printable(str(args.output_dir))}: {problem}")
                return None
        fix = FixOptions(output_dir=args.output_dir, dry_run=args.diff, unsafe_fixes=args.unsafe_fixes)
    from qlint.run.check import measures

    measure = measures(config, args.compare is not None or any(fmt == "metrics" for fmt, _ in args.write))
    return RunOptions(order=LoweringOrder(args.lowering), verbose=args.verbose, fix=fix, static=args.static,
                      measure=measure and not args.static,
                      profile=None if args.profile is None else str(args.profile),
                      etrecord=None if args.etrecord is None else str(args.etrecord))


# Check the inputs: the engine, then suppressions and the baseline (`qlint.run.check`).


def _run(args: argparse.Namespace, config: Config, options: RunOptions,
         base: dict[str, dict[str, Any]] | None) -> Report | None:
    """The report of every selected input, answered from the result cache where it has one, with
    the rules over the measured figures (QL009 against `base`, the metrics `--compare` names), the
    suppressions and `--baseline` applied; None after an error line when the baseline cannot be read
    (it is read before anything is checked). With `--write-baseline` no baseline is applied: it
    records what is shown after the suppressions."""
    from qlint.loading import stack
    from qlint.run.check import check, inputs
    from qlint.run.engine import OutputOnInput
    from qlint.run.suppressions import BaselineError

    stack.quiet_logs(args.verbose)
    cache = None
    if not args.no_cache:
        from qlint.run.cache import Cache, default_dir

        cache = Cache(args.cache_dir or default_dir(), config, options)
        if cache.untrusted is not None:
            say(f"qlint: warning: the result cache {printable(str(cache.directory))} is not used: {cache.untrusted}")
    if args.static:
        _say_static_scope()
        if config.npu is not None:
            _say_static_npu(config)
    paths, targets = inputs(args.paths, config, targets_only=args.targets_only, static=args.static)
    try:
        return check(paths, targets, config, options, cache, baseline=None if args.write_baseline else args.baseline,
                     jobs=args.jobs, shard=args.shard, progress=_progress_bar(args), base=base, taken=_taken(args))
    except (BaselineError, OutputOnInput) as exc:
        say(f"qlint: error: {exc}")
        return None


def _taken(args: argparse.Namespace) -> dict[tuple[object, ...], str]:
    """The files the run's other outputs write, which no fix may be written to (`engine.plan_work`)."""
    from qlint.io.writes import same_file

    return {same_file(path): option for option, path in _outputs(args)}


def _say_static_scope() -> None:
    """What the static tier checks and what it leaves to `qlint check`, so a clean run is not read as more."""
    from qlint.rules.table import full_check_codes, static_codes

    full_only = ", ".join(full_check_codes())
    say(f"qlint: static tier: {' and '.join(static_codes())} from the graph of each .pt2, without lowering (an island "
        f"whose constant it cannot compute: undecided); {full_only}, budgets, config targets, .pte files and fixes "
        "need `qlint check`")


def _say_static_npu(config: Config) -> None:
    """That the static tier checks the Cortex-M CPU flow only, when the run names an Ethos-U NPU: its
    findings are of the program as the CPU alone would run it, not of what the NPU leaves to the CPU."""
    assert config.npu is not None
    say(f"qlint: notice: --static checks the Cortex-M CPU flow only, not the {config.npu.accelerator} target the "
        "config or command line names: `qlint check` without --static lowers for it")


def _progress_bar(args: argparse.Namespace) -> Callable[[int, int, str], None] | None:
    """A one-line progress bar on stderr for interactive text runs only."""
    if args.output_format != "text" or args.quiet or os.environ.get("CI") or not sys.stderr.isatty():
        return None

    def show(done: int, total: int, name: str) -> None:
        if total < 2:
            return
        width = 24
        filled = width * done // total
        end = "\n" if done == total else ""
        try:
            print(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {name[-40:]:<40}", end=end,
                  file=sys.stderr, flush=True)
        except (OSError, ValueError):  # the terminal went away: the run goes on
            to_devnull(sys.stderr)

    return show


# Read the base run's metrics, and compare with them.


def _base_metrics(args: argparse.Namespace) -> dict[str, dict[str, Any]] | None | Literal[False]:
    """The base run's metrics named by `--compare` (None without it), read before anything is checked;
    False after an error line when they cannot be read."""
    if args.compare is None:
        return None
    from qlint.report.metrics import MetricsError, read_metrics

    try:
        return read_metrics(args.compare)
    except MetricsError as exc:
        say(f"qlint: error: --compare: {printable(str(exc))}")
        return False


def _compare(report: Report, args: argparse.Namespace, base: dict[str, dict[str, Any]] | None) -> None:
    """What changed against the base run `--compare` names, for the reports to show."""
    if base is not None:
        from qlint.report.metrics import deltas

        report.compared, report.deltas = printable(str(args.compare)), deltas(report, base)


# Say an empty run; write the baseline.


def _no_artifacts(report: Report, args: argparse.Namespace) -> None:
    """Warn when nothing was found to check (the run goes on: exit 0 but for errors)."""
    if report.checked == 0 and not report.errors:
        where = f" in shard {args.shard[0]}/{args.shard[1]}" if args.shard else ""
        say(f"qlint: warning: no artifacts found{where}")


def _write_baseline(report: Report, args: argparse.Namespace) -> int | None:
    """With `--write-baseline`, record the findings shown (the run ends: its exit code); else None: go on."""
    from qlint.run.suppressions import BaselineError, write_baseline

    if not args.write_baseline:
        return None
    if report.errors:  # a baseline without an input's findings would report them all as new once it reads
        for error in report.errors:
            say(f"qlint: error: {error}")
        say(f"qlint: error: {len(report.errors)} input{'s' if len(report.errors) != 1 else ''} could not be "
            f"checked: {printable(str(args.write_baseline))} not written")
        return EXIT_ERROR
    try:
        write_baseline(report, args.write_baseline)
    except BaselineError as exc:
        say(f"qlint: error: {exc}")
        return EXIT_ERROR
    say(f"wrote {len(report.findings)} findings to {printable(str(args.write_baseline))}")
    return EXIT_OK


# Write the outputs.


def _write_outputs(report: Report, args: argparse.Namespace, config: Config) -> bool:
    """The input errors on stderr, the report on stdout, then every `--write` file; False when the
    report or a file could not be written.

    A failed write does not stop the others: each output that can be written is.
    """
    from qlint.report import formats

    for error in report.errors:
        say(f"qlint: error: {error}")
    if args.statistics:
        shown = emit(formats.statistics_json(report) if args.output_format == "json" else formats.statistics(report))
    elif args.output_format == "text":
        shown = emit(formats.text(report, quiet=args.quiet))
    else:
        shown = emit(formats.FORMATS[args.output_format](report))
    return _write_files(report, args.write, config) and shown


def _write_files(report: Report, writes: list[tuple[str, Path]], config: Config) -> bool:
    """Every `--write`, the pictures and node data first so the markdown summary can point at them.
    A write that fails is one error line and the others are still written; False when one failed."""
    written: list[Path] = []
    ok = True
    for fmt, path in sorted(writes, key=lambda w: w[0] == "markdown"):
        problem = _write_one(report, fmt, path, config, written)
        if problem is not None:
            say(f"qlint: error: {printable(problem)}")
            ok = False
    return ok


def _write_one(report: Report, fmt: str, path: Path, config: Config, written: list[Path]) -> str | None:
    """Write one `--write FORMAT:PATH` (adding the files to `written`); why it failed, or None."""
    try:
        return WRITERS[fmt](report, path, config, written)
    except OSError as exc:
        return f"cannot write {path}: {exc.strerror or exc}"


def _report_writer(fmt: str) -> Writer:
    def write(report: Report, path: Path, config: Config, written: list[Path]) -> str | None:
        from qlint.io.writes import write_atomic
        from qlint.report import formats

        write_atomic(path, (formats.FORMATS[fmt](report) + "\n").encode())
        return None

    return write


def _write_markdown(report: Report, path: Path, config: Config, written: list[Path]) -> str | None:
    """The job summary, linking the files written before it."""
    from qlint.io.writes import write_atomic
    from qlint.report import formats

    write_atomic(path, (formats.markdown(report, attachments=_relative_to(written, path.parent)) + "\n").encode())
    return None


def _write_model_explorer(report: Report, path: Path, config: Config, written: list[Path]) -> str | None:
    from qlint.io.writes import ensure_directory
    from qlint.report.model_explorer import OverlayUnavailable, write_overlays

    problem = ensure_directory(path)
    if problem:
        return f"model-explorer:{path}: {problem}"
    try:
        written += write_overlays(report, path)
    except OverlayUnavailable as exc:
        return str(exc)
    return None


def _write_memory_plot(report: Report, path: Path, config: Config, written: list[Path]) -> str | None:
    from qlint.report.memory_plot import PlotError, write_plot

    try:
        write_plot(report, path)
    except PlotError as exc:
        return str(exc)
    written.append(path)
    return None


def _write_time_plot(report: Report, path: Path, config: Config, written: list[Path]) -> str | None:
    from qlint.report import time_plot
    from qlint.report.memory_plot import PlotError, write_plot

    try:
        write_plot(report, path, time_plot.figure, "time plot")
    except PlotError as exc:
        return str(exc)
    written.append(path)
    return None


def _write_patch(report: Report, path: Path, config: Config, written: list[Path]) -> str | None:
    from qlint.io.writes import write_atomic
    from qlint.remedies.patch import remedy_patch

    patch = remedy_patch(report.remedies, config.root)
    for note in patch.notes:
        say(f"qlint: patch: {printable(note)}")
    write_atomic(path, patch.diff.encode())
    return None


def _write_metrics(report: Report, path: Path, config: Config, written: list[Path]) -> str | None:
    from qlint.io.writes import write_atomic
    from qlint.report.metrics import metrics_json

    write_atomic(path, (metrics_json(report) + "\n").encode())
    return None


def _write_profile_comparison(report: Report, path: Path, config: Config, written: list[Path]) -> str | None:
    from qlint.io.writes import write_atomic
    from qlint.report.metrics import profile_comparison

    if path.suffix.lower() not in (".csv", ".json"):
        return "profile-comparison: is written as .csv or .json"
    write_atomic(path, profile_comparison(report, path.suffix.lower()).encode())
    return None


# What each `--write KIND:PATH` writes: a function (report, path, config, files written so far) ->
# why it failed, or None. Every kind the parser accepts has one (`cli.main.WRITTEN_FORMATS`).
Writer = Callable[["Report", Path, "Config", list[Path]], "str | None"]
WRITERS: dict[str, Writer] = {
    **{fmt: _report_writer(fmt) for fmt in OUTPUT_FORMATS[1:] if fmt != "markdown"},
    "markdown": _write_markdown, "model-explorer": _write_model_explorer, "memory-plot": _write_memory_plot,
    "patch": _write_patch, "metrics": _write_metrics, "time-plot": _write_time_plot,
    "profile-comparison": _write_profile_comparison,
}


def _relative_to(paths: list[Path], folder: Path) -> list[str]:
    """How a file in `folder` links to each of `paths`."""
    return [os.path.relpath(p, folder) for p in paths]


# Decide the exit code.


def _exit_code(report: Report, args: argparse.Namespace, written: bool) -> int:
    """2 when an input or an output failed (a missing output is worse than a finding), else 1 when
    a finding is at a `--fail-on` severity (not with `--exit-zero`), else 0."""
    if not written or report.errors:
        return EXIT_ERROR
    if not args.exit_zero and any(f.severity in FAILING[args.fail_on] for f in report.findings):
        return EXIT_FINDINGS
    return EXIT_OK
