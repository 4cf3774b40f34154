"""The `qlint` command line: ruff habits, torch imported only when a program is read.

Exit codes (the one list; the README repeats it):
  0    no finding at error severity (`--fail-on` moves the line);
  1    findings at error severity;
  2    usage, config, input or output errors: a bad option (one line and a `--help` hint),
       a path that cannot be read, a `--write` that cannot be written, stdout closed (`>&-`);
  130  interrupted (Ctrl-C): one line, and no temp file or half-written output is left.
A reader that stops reading stdout early (`qlint check | head -1`) ends the report quietly and
does not change the exit code: the `--write` files are still written and the code is the run's.
(Ruff and ripgrep exit 0 there, Python's docs suggest 1; either would say something about the
programs that the run did not find, and under `set -o pipefail` a 0 would pass a failing gate.)
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn

from qlint import __version__
from qlint.io.reads import printable
from qlint.settings.options import FixOptions, LoweringOrder, RunOptions

if TYPE_CHECKING:
    from qlint.rules.records import Report

EXIT_OK, EXIT_FINDINGS, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130
COMMANDS = ("check", "fix", "rule", "rules", "init")
OUTPUT_FORMATS = ("text", "json", "github", "sarif", "markdown")


def _say(line: str) -> None:
    """One line on stderr. A closed or broken stderr (`2>&1 | head -1`) does not stop the run."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        _to_devnull(sys.stderr)


def _emit(text: str) -> bool:
    """Print the report on stdout, flushed now so that a failed write shows here, not at exit.

    A reader that stopped reading (`| head -1`, a closed pager) ends the output quietly and the
    run goes on. False, after one error line, when stdout cannot be written (`>/dev/full`).
    """
    try:
        print(text, flush=True)
    except BrokenPipeError:
        _to_devnull(sys.stdout)
    except OSError as exc:
        _to_devnull(sys.stdout)
        _say(f"qlint: error: cannot write the report to stdout: {exc.strerror or exc}")
        return False
    return True


def _to_devnull(stream: IO[str]) -> None:
    """Point `stream`'s fd at /dev/null: what is still buffered, and what comes, goes nowhere, silently."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError):  # not a real file (a test's capture)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
    try:
        stream.flush()
    except (OSError, ValueError):
        pass


def _reserve_standard_fds() -> bool:
    """Open /dev/null on each of fds 0-2 that was closed; True when stdout (1) was.

    A closed fd is the next one `open` returns: an output file would become stdout
    or stderr, and whatever a library prints there would land in it. A closed
    stderr (`2>&-`) gets a `sys.stderr` again, writing to /dev/null, so that
    nothing that prints there (qlint, warnings, logging) meets None.
    """
    closed = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            closed.append(fd)
            os.open(os.devnull, os.O_RDWR)  # the lowest free fd: this one
    if sys.stderr is None:
        sys.stderr = open(2, "w", errors="backslashreplace", closefd=False)  # open as long as the process
    return 1 in closed


class _Parser(argparse.ArgumentParser):
    """argparse with ruff-style usage errors: one line and where to look, not the usage block."""

    commands: dict[str, argparse.ArgumentParser]

    def error(self, message: str) -> NoReturn:
        usage_error(message, self.prog)
        raise SystemExit(EXIT_ERROR)


def usage_error(message: str, prog: str = "qlint check") -> int:
    """`qlint: error: MESSAGE` and a `--help` hint on stderr; the exit code."""
    _say(f"qlint: error: {printable(message)}")
    _say(f"Run '{prog} --help' for usage.")
    return EXIT_ERROR


def _codes(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def _shard(value: str) -> tuple[int, int]:
    try:
        index, count = (int(v) for v in value.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not I/N") from None
    if not 1 <= index <= count:
        raise argparse.ArgumentTypeError(f"{value!r}: need 1 <= I <= N")
    return index, count


def _jobs(value: str) -> int:
    try:
        jobs = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if jobs < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: need N >= 1")
    return jobs


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
            _to_devnull(sys.stderr)

    return show


# `--write` kinds beside the report formats: files about the run, not the report itself.
EXTRA_WRITES = ("patch", "model-explorer", "memory-plot")


def _write_spec(value: str) -> tuple[str, Path]:
    fmt, _, path = value.partition(":")
    if (fmt not in OUTPUT_FORMATS and fmt not in EXTRA_WRITES) or fmt == "text" or not path:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not FORMAT:PATH with FORMAT one of json, github, sarif, markdown, {', '.join(EXTRA_WRITES)}"
        )
    return fmt, Path(path)


def build_parser() -> _Parser:
    from qlint.settings.config import CPUS

    parser = _Parser(
        prog="qlint",
        description="Find (and fold) the fp32 islands that quantized PyTorch programs keep after Cortex-M lowering.",
    )
    parser.add_argument("--version", action="version", version=f"qlint {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    check = sub.add_parser("check", help="check .pt2/.pte files, directories and config targets (default)")
    check.add_argument(
        "paths",
        nargs="*",
        type=Path,
        metavar="PATH",
        help="files or directories; without any, the config's targets and the current directory",
    )
    check.add_argument(
        "--config", type=Path, help="config file (default: .qlint.yaml found upward from the current directory)"
    )
    check.add_argument("--select", type=_codes, help="comma-separated rule codes or prefixes to enable")
    check.add_argument("--ignore", type=_codes, help="comma-separated rule codes or prefixes to disable")
    check.add_argument("--output-format", choices=OUTPUT_FORMATS, default="text")
    check.add_argument("--statistics", action="store_true", help="print counts per rule instead of each finding")
    check.add_argument("--exit-zero", action="store_true", help="exit 0 even when there are error findings")
    check.add_argument(
        "--fail-on",
        choices=("error", "warning", "info", "never"),
        default="error",
        help="lowest severity that makes the exit code 1 (default: error)",
    )
    check.add_argument(
        "--write",
        action="append",
        type=_write_spec,
        default=[],
        metavar="FORMAT:PATH",
        help="also write the report in FORMAT (json, github, sarif, markdown) to PATH; repeatable. "
        "patch:PATH writes the kept channels-last remedy as a diff of each target's factory; "
        "model-explorer:DIR node data for each .pt2 to open in Model Explorer; "
        "memory-plot:PATH (.svg/.png) the live memory plan of each --fix, before and after the folds",
    )
    check.add_argument("--target-cpu", choices=CPUS, help="Cortex-M CPU to lower for (overrides the config)")
    check.add_argument(
        "--lowering",
        choices=tuple(LoweringOrder),
        default="repaired",
        help="pass order: qlint's repaired order (default) or ExecuTorch's stock order",
    )
    check.add_argument("--targets-only", action="store_true", help="check only the config's targets")
    check.add_argument(
        "--static", action="store_true",
        help="the static tier: QL001 and QL004 read from each .pt2's graph, no torch, no lowering "
        "(milliseconds; the fast local hook, with the full check in CI)",
    )
    check.add_argument(
        "--fix",
        action="store_true",
        help="fold the islands that have a proven exact fold and write a verified <name>.pte",
    )
    check.add_argument(
        "--diff", action="store_true", help="with --fix: print what each fold would change, write nothing"
    )
    check.add_argument(
        "--output-dir", type=Path,
        help="with --fix: write .pte files here instead of next to each input (created when missing)",
    )
    check.add_argument(
        "--unsafe-fixes",
        action="store_true",
        help="with --fix: also try every remedy on targets (export/quantization changes that change numerics)",
    )
    check.add_argument(
        "--baseline", type=Path, metavar="FILE", help="accept the findings recorded in FILE; only new ones count"
    )
    check.add_argument(
        "--write-baseline", type=Path, metavar="FILE", help="record the current findings in FILE and exit 0"
    )
    check.add_argument(
        "--jobs", "-j", type=_jobs, default=1, metavar="N",
        help="check in N worker processes, at most one per CPU (same output order)",
    )
    check.add_argument(
        "--shard", type=_shard, metavar="I/N", help="check only the I-th of N deterministic slices of the inputs"
    )
    check.add_argument("--no-cache", action="store_true", help="always re-check; do not read or write the result cache")
    check.add_argument(
        "--cache-dir", type=Path, help="result cache folder (default: $QLINT_CACHE_DIR or ~/.cache/qlint)"
    )
    check.add_argument("-q", "--quiet", action="store_true", help="print findings only")
    check.add_argument("-v", "--verbose", action="store_true", help="print full tracebacks and framework logs")

    rule = sub.add_parser("rule", help="explain a rule")
    rule.add_argument("code")
    rules = sub.add_parser("rules", help="list the rules")
    init = sub.add_parser("init", help="write a commented default .qlint.yaml")
    init.add_argument("path", nargs="?", type=Path, default=Path(".qlint.yaml"))
    parser.commands = {"check": check, "rule": rule, "rules": rules, "init": init}
    return parser


def _normalize_argv(argv: list[str]) -> list[str]:
    """`qlint PATHS` and `qlint --select X PATHS` mean `qlint check ...`."""
    if any(a in ("-h", "--help", "--version") for a in argv[:1]):
        return argv
    if not argv or argv[0] not in COMMANDS:
        return ["check", *argv]
    if argv[0] == "fix":  # `qlint fix` is `qlint check --fix`
        return ["check", "--fix", *argv[1:]]
    return argv


def cmd_rules() -> int:
    from tabulate import tabulate

    from qlint.rules.catalog import load_catalog

    rows = [
        [r.code, r.name, r.default_severity, "yes" if r.fixable else "", r.summary] for r in load_catalog().values()
    ]
    return EXIT_OK if _emit(tabulate(rows, headers=["code", "name", "severity", "fix", "summary"],
                                     tablefmt="simple")) else EXIT_ERROR


def cmd_rule(code: str) -> int:
    from qlint.rules.catalog import load_catalog, render_rule

    catalog = load_catalog()
    if code.upper() not in catalog:
        _say(f"qlint: error: unknown rule {printable(repr(code))} (known: {', '.join(catalog)})")
        _say("Run 'qlint rules' for the list.")
        return EXIT_ERROR
    return EXIT_OK if _emit(render_rule(catalog[code.upper()]).removesuffix("\n")) else EXIT_ERROR


def cmd_init(path: Path) -> int:
    from qlint.io.writes import write_atomic
    from qlint.settings.config import DEFAULT_CONFIG

    if path.exists() or path.is_symlink():
        _say(f"qlint: {printable(str(path))} already exists; not overwriting")
        return EXIT_ERROR
    try:
        write_atomic(path, DEFAULT_CONFIG.encode())
    except OSError as exc:
        _say(f"qlint: error: cannot write {printable(str(path))}: {exc.strerror or exc}")
        return EXIT_ERROR
    return EXIT_OK if _emit(f"wrote {printable(str(path))}") else EXIT_ERROR


def _baseline(report: Report, args: argparse.Namespace) -> int | None:
    """Write the baseline (the run ends: its exit code) or drop what it accepts (None: go on)."""
    from qlint.report.suppressions import BaselineError, apply_baseline, write_baseline

    try:
        if args.write_baseline:
            write_baseline(report, args.write_baseline)
            _say(f"wrote {len(report.findings)} findings to {printable(str(args.write_baseline))}")
            return EXIT_ERROR if report.errors else EXIT_OK
        if args.baseline:
            apply_baseline(report, args.baseline)
    except BaselineError as exc:
        _say(f"qlint: error: {exc}")
        return EXIT_ERROR
    return None


def _selection_error(args: argparse.Namespace) -> str | None:
    """The usage error in --select/--ignore (an unknown rule code), or None."""
    from qlint.settings.config import ConfigError, validate_selectors

    def error(message: str) -> ConfigError:
        return ConfigError("<command line>", 0, "", message)

    for option, codes in (("--select", args.select), ("--ignore", args.ignore)):
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
    if args.unsafe_fixes and not (args.fix or args.diff):
        return "--unsafe-fixes needs --fix or --diff"
    return None


def cmd_check(args: argparse.Namespace) -> int:
    from qlint.settings.config import ConfigError, find_config, load_config

    problem = _selection_error(args) or _option_error(args)
    if problem:
        return usage_error(problem)
    try:
        config_path = args.config if args.config else find_config(Path.cwd())
        if args.config and not (args.config.exists() or args.config.is_symlink()):
            raise ConfigError(args.config, 0, "<file>", "no such config file")
        config = load_config(config_path)
        config = config.with_overrides(target_cpu=args.target_cpu, select=args.select, ignore=args.ignore)
    except ConfigError as exc:
        _say(f"qlint: config error: {printable(str(exc))}")
        return EXIT_ERROR

    from qlint.graph import stack
    from qlint.report import formats
    from qlint.run import engine

    stack.quiet_logs(args.verbose)
    fix = None
    if args.fix or args.diff:
        if args.output_dir is not None and not args.diff:
            from qlint.io.writes import ensure_directory

            problem = ensure_directory(args.output_dir)
            if problem:
                _say(f"qlint: error: --output-dir {printable(str(args.output_dir))}: {problem}")
                return EXIT_ERROR
        fix = FixOptions(output_dir=args.output_dir, dry_run=args.diff, unsafe_fixes=args.unsafe_fixes)
    options = RunOptions(order=LoweringOrder(args.lowering), verbose=args.verbose, fix=fix, static=args.static)
    cache = None
    if not args.no_cache:
        from qlint.run.cache import Cache, default_dir

        cache = Cache(args.cache_dir or default_dir(), config, options)
    if args.targets_only:
        paths, targets = [], list(config.targets)
    elif args.paths:
        paths, targets = list(args.paths), []
    else:
        paths, targets = [Path(".")], [] if args.static else list(config.targets)
    if args.static:
        from qlint.rules.table import static_codes

        _say(f"qlint: static tier: {' and '.join(static_codes())} from the graph of each .pt2, without lowering "
             "(an island whose constant it cannot compute: undecided); QL002, QL003, QL005, QL007, QL008, "
             "config targets, .pte files and fixes need `qlint check`")
    report = engine.run(
        paths, targets, config, options, cache, jobs=args.jobs, shard=args.shard, progress=_progress_bar(args)
    )

    from qlint.report.suppressions import apply_suppressions

    apply_suppressions(report, config)
    if report.checked == 0 and not report.errors:
        where = f" in shard {args.shard[0]}/{args.shard[1]}" if args.shard else ""
        _say(f"qlint: warning: no artifacts found{where}")
    ended = _baseline(report, args)
    if ended is not None:
        return ended
    for error in report.errors:
        _say(f"qlint: error: {error}")
    if args.statistics:
        shown = _emit(formats.statistics(report))
    elif args.output_format == "text":
        shown = _emit(formats.text(report, quiet=args.quiet))
    else:
        shown = _emit(formats.FORMATS[args.output_format](report))

    if not _write_files(report, args.write, config) or not shown or report.errors:
        return EXIT_ERROR
    failing = {"error": ("error",), "warning": ("error", "warning"), "info": ("error", "warning", "info"), "never": ()}
    if not args.exit_zero and any(f.severity in failing[args.fail_on] for f in report.findings):
        return EXIT_FINDINGS
    return EXIT_OK


def _write_files(report: Any, writes: list[tuple[str, Path]], config: Any) -> bool:
    """Every `--write`, the pictures and node data first so the markdown summary can point at them.
    A write that fails is one error line and the others are still written; False when one failed."""
    written: list[Path] = []
    ok = True
    for fmt, path in sorted(writes, key=lambda w: w[0] == "markdown"):
        problem = _write_one(report, fmt, path, config, written)
        if problem is not None:
            _say(f"qlint: error: {printable(problem)}")
            ok = False
    return ok


def _write_one(report: Any, fmt: str, path: Path, config: Any, written: list[Path]) -> str | None:
    """Write one `--write FORMAT:PATH` (adding the files to `written`); why it failed, or None."""
    from qlint.io.writes import ensure_directory, write_atomic
    from qlint.report import formats

    try:
        if fmt == "model-explorer":
            from qlint.report.model_explorer import OverlayUnavailable, write_overlays

            problem = ensure_directory(path)
            if problem:
                return f"model-explorer:{path}: {problem}"
            try:
                written += write_overlays(report, path)
            except OverlayUnavailable as exc:
                return str(exc)
            return None
        if fmt == "memory-plot":
            from qlint.report.memory_plot import PlotError, write_plot

            try:
                write_plot(report, path)
            except PlotError as exc:
                return str(exc)
            written.append(path)
            return None
        if fmt == "patch":
            from qlint.remedies.patch import remedy_patch

            patch = remedy_patch(report.remedies, config.root)
            for note in patch.notes:
                _say(f"qlint: patch: {printable(note)}")
            text = patch.diff
        elif fmt == "markdown":
            text = formats.markdown(report, attachments=_relative_to(written, path.parent)) + "\n"
        else:
            text = formats.FORMATS[fmt](report) + "\n"
        write_atomic(path, text.encode())
    except OSError as exc:
        return f"cannot write {path}: {exc.strerror or exc}"
    return None


def _relative_to(paths: list[Path], folder: Path) -> list[str]:
    """How a file in `folder` links to each of `paths`."""
    return [os.path.relpath(p, folder) for p in paths]


def main(argv: list[str] | None = None) -> int:
    """The `qlint` command; its exit code (the module docstring lists them)."""
    if _reserve_standard_fds():
        _say("qlint: error: stdout is closed: nowhere to print the report (redirect it instead, e.g. >/dev/null)")
        return EXIT_ERROR
    try:
        return _dispatch(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not add a traceback to the line
        _say("qlint: interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # a write to a closed pipe that no helper above caught: end quietly
        _to_devnull(sys.stdout)
        return EXIT_ERROR
    finally:
        _flush_quietly()


def _flush_quietly() -> None:
    """Flush what argparse printed (`--help`, `--version`): a closed pipe then is no traceback at exit."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        _to_devnull(sys.stdout)


def _dispatch(argv: list[str]) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(_normalize_argv(argv))
    if extra:
        parser.commands.get(args.command, parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "rules":
        return cmd_rules()
    if args.command == "rule":
        return cmd_rule(args.code)
    if args.command == "init":
        return cmd_init(args.path)
    return cmd_check(args)
