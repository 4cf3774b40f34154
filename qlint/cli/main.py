"""The `qlint` command line: the parser, the dispatch to `qlint.cli.commands`, and how a run
ends (a usage error, Ctrl-C, a closed stdout or pipe), with ruff's habits. Torch is imported only
when a program is read; the exit codes are listed in `qlint.cli.exit_codes`.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import NoReturn

from qlint import __version__
from qlint.cli.commands.boards import BOARD_FORMATS, cmd_boards
from qlint.cli.commands.check import cmd_check
from qlint.cli.commands.init import cmd_init
from qlint.cli.commands.rule import cmd_rule
from qlint.cli.commands.rules import RULE_FORMATS, cmd_rules
from qlint.cli.exit_codes import EXIT_ERROR, EXIT_INTERRUPTED
from qlint.cli.output import say, to_devnull, usage_error
from qlint.report import EXTRA_WRITES, OUTPUT_FORMATS
from qlint.settings.options import LoweringOrder

COMMANDS = ("check", "fix", "rule", "rules", "boards", "init")


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


def _codes(value: str) -> tuple[str, ...]:
    codes = tuple(v.strip() for v in value.split(",") if v.strip())
    if not codes:  # an empty --select would select every rule, or none: neither is what was written
        raise argparse.ArgumentTypeError(f"{value!r} names no rule code")
    return codes


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


WRITTEN_FORMATS = (*OUTPUT_FORMATS[1:], *EXTRA_WRITES)  # text is for stdout


def _write_spec(value: str) -> tuple[str, Path]:
    fmt, _, path = value.partition(":")
    if fmt not in WRITTEN_FORMATS or not path:
        known = ", ".join(WRITTEN_FORMATS)
        raise argparse.ArgumentTypeError(f"{value!r} is not FORMAT:PATH with FORMAT one of {known}")
    return fmt, Path(path)


def _selection_options(check: argparse.ArgumentParser) -> None:
    """Which rules run."""
    check.add_argument("--select", type=_codes, action="extend",
                       help="comma-separated rule codes or prefixes to enable instead of the config's selection")
    check.add_argument("--extend-select", type=_codes, action="extend",
                       help="comma-separated rule codes or prefixes to enable on top of the config's selection")
    check.add_argument("--ignore", type=_codes, action="extend",
                       help="comma-separated rule codes or prefixes to disable, besides the config's ignore")


def _output_options(check: argparse.ArgumentParser) -> None:
    """What the report looks like, where else it is written, and the exit code."""
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
        help=f"also write the report in FORMAT ({', '.join(OUTPUT_FORMATS[1:])}) to PATH; repeatable. "
        "patch:PATH writes the kept channels-last remedy as a diff of each target's factory; "
        "model-explorer:DIR node data for each .pt2 to open in Model Explorer; "
        "memory-plot:PATH (.svg/.png) the live memory plan of each --fix, before and after the folds; "
        "time-plot:PATH (.svg/.png) each program's costliest ops in the estimate (or --profile), int8 and fp32; "
        "profile-comparison:PATH (.csv/.json) with --profile, the estimate beside the measured cycles per operator; "
        "metrics:PATH each artifact's figures (SRAM, flash, fp32 work, coverage) as JSON, for --compare",
    )


def _lowering_options(check: argparse.ArgumentParser) -> None:
    """Which inputs are read, and how they are lowered."""
    from qlint.settings.config import CPUS

    check.add_argument("--target-cpu", choices=CPUS, help="Cortex-M CPU to lower for (overrides the config)")
    check.add_argument("--board", metavar="NAME",
                       help="the board to estimate for: its CPU, clock, FPU and NPU (`qlint boards` lists them; "
                            "overrides the config's `board:`)")
    check.add_argument("--target", metavar="NAME",
                       help="an Ethos-U NPU to lower for beside the Cortex-M (ethos-u55-32 ... ethos-u85-2048), or "
                            "cortex-m for the CPU alone (overrides the config and the board)")
    check.add_argument("--system-config", metavar="NAME",
                       help="with an Ethos-U target: a System_Config section of Vela's vela.ini (default: "
                            "EthosUCompileSpec's for the NPU)")
    check.add_argument("--memory-mode", metavar="NAME",
                       help="with an Ethos-U target: a Memory_Mode section of Vela's vela.ini (default: "
                            "EthosUCompileSpec's for the NPU)")
    check.add_argument("--profile", metavar="ETDUMP", type=Path,
                       help="an ETDump ExecuTorch's runner recorded on the board with the one .pte checked (or the "
                            ".pte --fix wrote from the one .pt2 checked): its measured cycles replace the estimate, "
                            "set beside it per operator (docs/profiles.md)")
    check.add_argument("--etrecord", metavar="FILE", type=Path,
                       help="with --profile and a .pt2: the ETRecord --fix wrote beside the profiled .pte, "
                            "which must stay beside it (default: <name>.etrecord beside the .pt2)")
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


def _fix_options(check: argparse.ArgumentParser) -> None:
    """What `--fix` writes."""
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
        help="with --fix: also try every remedy of each target's flow (export/quantization changes that change "
             "numerics; on an Ethos-U target, where each LayerNorm runs)",
    )


def _run_options(check: argparse.ArgumentParser) -> None:
    """Comparisons, baselines, parallelism, the cache and verbosity."""
    check.add_argument(
        "--compare", type=Path, metavar="FILE",
        help="report what changed against the metrics FILE another run wrote (--write metrics:FILE on the base "
        "branch); budgets' growth limits are checked against it",
    )
    check.add_argument(
        "--baseline", type=Path, metavar="FILE", help="accept the findings recorded in FILE; only new ones count"
    )
    check.add_argument(
        "--write-baseline", type=Path, metavar="FILE",
        help="record the current findings in FILE and exit 0 (2, FILE not written, if an input could not be checked)",
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


def build_parser() -> _Parser:
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
    for options in (_selection_options, _output_options, _lowering_options, _fix_options, _run_options):
        options(check)

    rule = sub.add_parser("rule", help="explain a rule (or every rule, --all)")
    rule.add_argument("code", nargs="?", help="the rule's code, e.g. QL001")
    rule.add_argument("--all", action="store_true", help="every rule's page, in code order")
    rule.add_argument("--output-format", choices=RULE_FORMATS, default="text",
                      help="json: the rule's fields and its page (a list with --all)")
    rules = sub.add_parser("rules", help="list the rules")
    rules.add_argument("--output-format", choices=RULE_FORMATS, default="text",
                       help="json: every field of every rule, its page included")
    boards = sub.add_parser("boards", help="list the boards a budget can name, with their SRAM and flash")
    boards.add_argument("--config", type=Path, help="config file whose own `boards:` to list too "
                        "(default: .qlint.yaml here or above)")
    boards.add_argument("--output-format", choices=BOARD_FORMATS, default="text",
                        help="json: every field of every board, its sources included")
    boards.add_argument("-v", "--verbose", action="store_true",
                        help="print where each board's figures come from under the table")
    init = sub.add_parser("init", help="write a commented default .qlint.yaml")
    init.add_argument("path", nargs="?", type=Path, default=Path(".qlint.yaml"))
    parser.commands = {"check": check, "rule": rule, "rules": rules, "boards": boards, "init": init}
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


def main(argv: list[str] | None = None) -> int:
    """The `qlint` command; its exit code (`qlint.cli.exit_codes` lists them)."""
    if _reserve_standard_fds():
        say("qlint: error: stdout is closed: nowhere to print the report (redirect it instead, e.g. >/dev/null)")
        return EXIT_ERROR
    if argv is None:  # the command itself, not a call in-process (a script, the tests)
        from qlint.run import collector

        collector.own_the_process()
    try:
        return _dispatch(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:
        # A second Ctrl-C must not add a traceback to the line, nor to the exit after it. Called
        # in-process (`main(argv)`: a script, the tests), the caller gets its Ctrl-C back, and the
        # processes it starts later do not inherit an ignored SIGINT.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        say("qlint: interrupted")
        if argv is not None and previous is not None:
            signal.signal(signal.SIGINT, previous)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # a write to a closed pipe that no helper above caught: end quietly
        to_devnull(sys.stdout)
        return EXIT_ERROR
    finally:
        _flush_quietly()


def _flush_quietly() -> None:
    """Flush what argparse printed (`--help`, `--version`): a closed pipe then is no traceback at exit."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        to_devnull(sys.stdout)


def _dispatch(argv: list[str]) -> int:
    """Parse `argv` and run its command (`check` when none is named); the command's exit code."""
    parser = build_parser()
    args, extra = parser.parse_known_args(_normalize_argv(argv))
    if extra:
        parser.commands.get(args.command, parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "rules":
        return cmd_rules(args.output_format)
    if args.command == "rule":
        if (args.code is None) == (not args.all):
            parser.commands["rule"].error("give one rule code, or --all" if args.code is None
                                          else "argument --all: not allowed with a rule code")
        return cmd_rule(None if args.all else args.code, args.output_format)
    if args.command == "boards":
        return cmd_boards(args.config, args.output_format, args.verbose)
    if args.command == "init":
        return cmd_init(args.path)
    return cmd_check(args)
