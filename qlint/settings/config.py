"""`.qlint.yaml`: discovery, parsing with line numbers, validation.

Every error names the file, the line and the key, because a config error in CI
is only cheap to fix when it points at the spot.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import astuple, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from qlint._compat import StrEnum
from qlint.io.limits import CONFIG_MAX_BYTES, Limits
from qlint.io.reads import ReadError, printable, read_input
from qlint.records.results import Severity
from qlint.rules.catalog import load_catalog
from qlint.rules.table import Code
from qlint.settings.boards import Board
from qlint.settings.budgets import (
    COUNT_KEYS,
    GROWTH_KEYS,
    SIZE_KEYS,
    TIME_KEYS,
    Budget,
    Budgets,
    Growth,
    parse_percent,
    parse_percentage,
)
from qlint.settings.cycles import CPUS, default_fpu
from qlint.settings.npus import NoNpu, Npu, NpuChoice, check_section, check_target, npu, resolve
from qlint.settings.sizes import parse_clock, parse_count, parse_duration_ms, parse_size

CONFIG_NAME = ".qlint.yaml"
# The YAML tags a config may carry: plain scalars, lists and mappings (no
# !!python/..., !!timestamp, !!binary or application tags).
_PLAIN_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "seq", "map")}
FOLD_DTYPES = ("int8", "int16")
FACTORY_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
# A target's name names its outputs (`--fix` writes `NAME.pte` into --output-dir), so it is a name,
# not a path: no separator, no `..`, nothing hidden or read as an option.
TARGET_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$", re.ASCII)
# What names the NPU, at the top level, per config target and on a board (`qlint.settings.npus`).
NPU_KEYS = ("target", "system_config", "memory_mode")
NO_CHOICE = NpuChoice()   # a level that names none of them


class ConstantKind(StrEnum):
    """Where a constant operand lives in the program."""

    PARAMETER = "parameter"
    BUFFER = "buffer"
    CONSTANT = "constant"   # a lifted tensor constant
    LITERAL = "literal"     # a number written into the graph
    COMPUTED = "computed"   # built in the graph from constants: aten.full, a mask, ...


class RemedyName(StrEnum):
    """The export/quantization changes `--fix` may make to a target (see `qlint.remedies.all_remedies`)."""

    CHANNELS_LAST = "channels-last"
    UNFUSED_ATTENTION = "unfused-attention"
    DERIVED_SCALE_QPARAMS = "derived-scale-qparams"
    INT8_IO = "int8-io"
    INT8_LAYERNORM = "int8-layernorm"
    EXPAND_BROADCASTS = "expand-broadcasts"
    CONV1D_AS_CONV2D = "conv1d-as-conv2d"
    LAYERNORM_PLACEMENT = "layernorm-placement"


class ConfigError(Exception):
    """A config problem, printed as `file:line: key: message`."""

    def __init__(self, path: Path | str, line: int, key: str, message: str) -> None:
        self.path, self.line, self.key, self.message = str(path), line, key, message
        super().__init__(f"{path}:{line}: {key}: {message}")


@dataclass(frozen=True)
class FoldGuards:
    constant_kinds: tuple[ConstantKind, ...] = tuple(ConstantKind)
    max_elements: int = 1
    dtypes: tuple[str, ...] = ("int8",)
    require_equal_qrange: bool = True


@dataclass(frozen=True)
class Target:
    name: str
    factory: str
    line: int = 0
    remedies: tuple[RemedyName, ...] | None = None  # None: the config's list
    budgets: Budget | None = None  # its own limits over the config's
    board: str | None = None       # its own board (CPU, clock, FPU, NPU) over the config's
    npu: NpuChoice = NpuChoice()   # its own target:, system_config:, memory_mode: over the board's and the config's


@dataclass(frozen=True)
class Config:
    path: Path | None = None
    root: Path = field(default_factory=lambda: find_repo_root(Path.cwd()))
    target_cpu: str = "cortex-m55"
    include: tuple[str, ...] = ("**/*.pt2", "**/*.pte")
    exclude: tuple[str, ...] = ()
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    severities: dict[Code, Severity] = field(default_factory=dict)
    coverage_threshold: float = 0.9
    coverage_by: str = "ops"                # QL005 by op count, or by the estimated time ("time")
    fold: FoldGuards = field(default_factory=FoldGuards)
    limits: Limits = field(default_factory=Limits)
    targets: tuple[Target, ...] = ()
    remedies: tuple[RemedyName, ...] = ()   # unsafe fixes `--fix` applies to targets without --unsafe-fixes
    remedy_max_sqnr_drop_db: float = 1.0    # a remedy costing more accuracy than this is refused
    budgets: Budgets = field(default_factory=Budgets)
    board: str | None = None                # the board a run is for: its CPU, clock, FPU and NPU (`--board`)
    npu_choice: NpuChoice = NpuChoice()     # the top level's target:, system_config:, memory_mode:
    npu_override: NpuChoice = NpuChoice()   # --target, --system-config, --memory-mode
    npu: Npu | None = None                  # the Ethos-U the run lowers for (resolved); None: the Cortex-M CPU alone

    @property
    def base(self) -> Path:
        """The config file's folder: target factories are imported relative to it."""
        return self.path.parent.resolve() if self.path else Path.cwd()

    def severity(self, code: Code) -> Severity:
        """Effective severity: off when deselected, else the config's or the catalog's."""
        if not self.selects(code):
            return Severity.OFF
        return self.severities.get(code) or Severity(load_catalog()[code].default_severity)

    def selects(self, code: Code) -> bool:
        """Whether `select` and `ignore` leave rule `code` on (no `select` selects every rule). As in
        ruff, the more specific selector decides (`select: [QL001]` beats `ignore: [QL0]`); at
        equal specificity the ignore does."""
        return _layered(code, not self.select, self.select, self.ignore)

    def with_selection(self, select: tuple[str, ...] | None, extend_select: tuple[str, ...] = (),
                       ignore: tuple[str, ...] = ()) -> Config:
        """This config with the command line's selection layered on it, as ruff layers them: `--select`
        starts the selection anew (the config's `select` and `ignore` no longer apply), `--extend-select`
        adds to it, `--ignore` takes from it; within the layer the more specific selector decides, an
        ignore at equal specificity. The result is written as the rules it leaves off."""
        if select is None and not extend_select and not ignore:
            return self
        chosen = (*(select or ()), *extend_select)
        off = tuple(code for code in Code
                    if not _layered(code, self.selects(code) if select is None else False, chosen, ignore))
        return replace(self, select=(), ignore=off)

    def enabled(self, code: Code) -> bool:
        """Whether rule `code` runs at all: a deselected rule costs nothing."""
        return self.severity(code) != Severity.OFF

    def with_overrides(self, **changes: Any) -> Config:
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def selected_board(self) -> Board | None:
        """The board `board:` or `--board` names (the config's own boards first), if one."""
        return self.budgets.board(self.board) if self.board else None

    def with_board(self, name: str, cpu: str | None = None) -> Config:
        """This config for board `name`: lowered for its CPU unless `cpu` (`--target-cpu`) says
        otherwise. Raises ValueError for an empty name, a board neither the table nor the config has,
        and one that says it has an FPU on a CPU without one."""
        from qlint.settings.boards import builtin_boards, fpu_error

        if not name:
            raise ValueError("needs a board name (`qlint boards` lists them)")
        board = self.budgets.board(name)
        if board is None:
            known = ", ".join(sorted({*builtin_boards(), *self.budgets.boards}))
            raise ValueError(f"unknown board {printable(name)[:80]!r} (known: {known}; a board of your own goes "
                             "under `boards:` in .qlint.yaml)")
        target_cpu = cpu or board.cpu or self.target_cpu
        problem = fpu_error(board, target_cpu)
        if problem:
            raise ValueError(problem)
        config = replace(self, board=name, target_cpu=target_cpu)
        return replace(config, npu=config.resolve_npu())

    def resolve_npu(self, own: NpuChoice = NO_CHOICE) -> Npu | None:
        """The NPU of this config's run (with `own`, a config target's keys): the command line over the
        target's own over the board's over the top level (`npus.resolve`). Raises ValueError."""
        board = self.selected_board()
        levels = (self.npu_choice, board.npu_choice if board else NpuChoice(), own)
        if self.npu_override.target is None and resolve(levels) is None:
            return None   # the CPU alone: the command line's Vela sections are for the runs with an NPU
        return resolve((*levels, self.npu_override))

    def with_npu(self, choice: NpuChoice) -> Config:
        """This config with the command line's `--target`, `--system-config`, `--memory-mode` over every
        level of the config (`--target cortex-m`: no NPU); a system config or memory mode alone applies
        where the config names an NPU, and is an error when it names none. Raises ValueError, one line."""
        if choice.empty:
            return self
        config = replace(self, npu_override=choice)
        config = replace(config, npu=config.resolve_npu())
        if choice.target is None and config.npu is None and all(config.for_target(t).npu is None
                                                                 for t in config.targets):
            raise NoNpu("a system config" if choice.system_config else "a memory mode")
        return config

    def for_target(self, target: Target) -> Config:
        """This config for config target `target`: its own board (CPU, clock, FPU, NPU) and its own
        `target:`, `system_config:`, `memory_mode:` (checked when the config was read). Raises ValueError."""
        config = self.with_board(target.board) if target.board is not None else self
        return replace(config, npu=config.resolve_npu(target.npu))


def _specificity(code: Code, selectors: tuple[str, ...]) -> int:
    """The length of the longest of `selectors` (codes or prefixes) that names rule `code`; -1 for none."""
    return max((len(s) for s in selectors if code.startswith(s)), default=-1)


def _layered(code: Code, below: bool, select: tuple[str, ...], ignore: tuple[str, ...]) -> bool:
    """Whether one layer of `select` and `ignore` leaves rule `code` on, `below` being its state under
    the layer: the more specific selector that names it decides, the ignore at equal specificity."""
    chosen, dropped = _specificity(code, select), _specificity(code, ignore)
    return below if chosen < 0 and dropped < 0 else chosen > dropped


def find_repo_root(start: Path) -> Path:
    """The enclosing git checkout, else `start`: source paths are shown relative to it."""
    start = start.resolve()
    for directory in (start, *start.parents):
        if (directory / ".git").exists():
            return directory
    return start


def find_config(start: Path) -> Path | None:
    for directory in (start.resolve(), *start.resolve().parents):
        candidate = directory / CONFIG_NAME
        if candidate.is_file():
            return candidate
    return None


def named_or_found(path: Path | None) -> Config:
    """The config a command runs with: the file `--config` names (an error when there is none), else
    `.qlint.yaml` here or in a parent folder, else the defaults: a user who names a file asked for it."""
    if path is not None and not (path.exists() or path.is_symlink()):
        raise ConfigError(path, 0, "<file>", "no such config file")
    return load_config(path if path is not None else find_config(Path.cwd()))


def validate_selectors(selectors: tuple[str, ...], where: Callable[[str], ConfigError]) -> None:
    codes = load_catalog()
    for selector in selectors:
        if not any(code.startswith(selector) for code in codes):
            raise where(f"unknown rule code {selector!r} (known: {', '.join(codes)})")


def load_config(path: Path | None) -> Config:
    """Read and validate a config file; `None` gives the defaults."""
    if path is None:
        return Config()
    try:
        text = read_input(path, CONFIG_MAX_BYTES, "config file").decode("utf-8")
    except ReadError as exc:
        raise ConfigError(path, 0, "<file>", str(exc)) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(path, 0, "<file>", f"not UTF-8 text (byte {exc.start})") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else 0
        raise ConfigError(path, line, "<yaml>", printable(str(getattr(exc, "problem", exc)))) from None
    except RecursionError:
        raise ConfigError(path, 0, "<yaml>", "nested too deeply") from None
    return _Parser(path).config(node)


class _Parser:
    """Walks the composed YAML node tree so each value keeps its line."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def error(self, node: yaml.Node | None, key: str, message: str) -> ConfigError:
        line = node.start_mark.line + 1 if node is not None else 1
        return ConfigError(self.path, line, key, message)

    def mapping(self, node: yaml.Node, key: str) -> list[tuple[str, yaml.Node, yaml.Node]]:
        if not isinstance(node, yaml.MappingNode):
            raise self.error(node, key, "expected a mapping")
        items: list[tuple[str, yaml.Node, yaml.Node]] = []
        seen: dict[str, yaml.Node] = {}
        for k, v in node.value:
            if not isinstance(k, yaml.ScalarNode) or k.tag not in _PLAIN_TAGS:
                raise self.error(k, key, "keys must be plain names")
            if k.value in seen:  # YAML keeps the last silently: one of the two would be lost
                first = seen[k.value].start_mark.line + 1
                raise self.error(k, key, f"{printable(k.value)[:80]!r} appears twice (first on line {first})")
            seen[k.value] = k
            items.append((k.value, k, v))
        return items

    def scalar(self, node: yaml.Node, key: str, kind: type) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise self.error(node, key, f"expected {kind.__name__}")
        if node.tag not in _PLAIN_TAGS:
            raise self.error(node, key, f"unsupported YAML tag {printable(node.tag)!r}")
        if kind is str:
            return node.value  # raw text: YAML 1.1 would read `off` as False
        try:
            value = yaml.constructor.SafeConstructor().construct_object(node)
        except Exception:  # noqa: BLE001 - a tagged scalar whose text the tag rejects
            raise self.error(node, key, f"expected {kind.__name__}, got {printable(node.value)[:80]!r}") from None
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            try:
                value = float(value)
            except OverflowError:  # an integer past any float
                raise self.error(node, key, f"number out of range: {printable(node.value)[:80]}") from None
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.error(node, key, f"expected {kind.__name__}, got {value!r}")
        return value

    def strings(self, node: yaml.Node, key: str) -> tuple[str, ...]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.error(node, key, "expected a list of strings")
        return tuple(self.scalar(item, key, str) for item in node.value)

    def choices(self, node: yaml.Node, key: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
        values = self.strings(node, key)
        for index, (item, value) in enumerate(zip(node.value, values, strict=True)):
            if value not in allowed:
                raise self.error(item, key, f"{printable(value)[:80]!r} is not one of {', '.join(allowed)}")
            if value in values[:index]:
                raise self.error(item, key, f"{value!r} is listed twice")
        return values

    def config(self, root: yaml.Node | None) -> Config:
        config = Config(path=self.path, root=find_repo_root(self.path.parent))
        if root is None:
            return config
        self.board_names: list[tuple[yaml.Node, str, str]] = []  # checked once `boards:` is read
        self.target_nodes: list[yaml.Node] = []  # each config target's mapping, for its NPU's errors
        changes: dict[str, Any] = {}
        for key, knode, value in self.mapping(root, "<root>"):
            handler = getattr(self, f"key_{key}", None)
            if handler is None:
                raise self.error(knode, key, "unknown key")
            changes[key if key != "rules" else "severities"] = handler(value, key)
        boards = changes.pop("boards", {})
        changes["budgets"] = replace(changes.get("budgets", Budgets()), boards=boards)
        changes["npu_choice"] = NpuChoice(*(changes.pop(k, None) for k in NPU_KEYS))
        self.board_cpu(root, changes)
        for node, key, name in self.board_names:
            self.check_board(node, key, name, changes)
        config = replace(config, **changes)
        self.board_npu(root, config)
        try:
            config = replace(config, npu=config.resolve_npu())
        except ValueError as exc:
            raise self.npu_error(root, exc) from None
        for target, item in zip(config.targets, self.target_nodes, strict=True):
            try:
                config.for_target(target)
            except ValueError as exc:
                raise self.npu_error(item, exc, "targets.") from None
        return config

    def npu_error(self, node: yaml.Node, exc: ValueError, prefix: str = "") -> ConfigError:
        """The config error of a level (`node`: the root or a config target) whose NPU does not resolve:
        on the key that names a system config or memory mode with no NPU to apply to."""
        key = "system_config" if isinstance(exc, NoNpu) and "system" in exc.named else "memory_mode"
        named = {k.value: v for k, v in node.value} if isinstance(node, yaml.MappingNode) else {}
        return self.error(named.get(key, node), prefix + key, printable(str(exc)))

    def board_npu(self, root: yaml.Node, config: Config) -> None:
        """A run for a board lowers for the NPU the board names; `target:`, `system_config:` and
        `memory_mode:` beside it must agree with what it names, as `target_cpu:` must with its CPU."""
        board = config.selected_board()
        if board is None or board.npu is None:
            return
        for key, own, boards in zip(NPU_KEYS, astuple(config.npu_choice), astuple(board.npu_choice), strict=True):
            if own is not None and boards is not None and own != boards:
                node = next(v for k, v in root.value if k.value == key)
                raise self.error(node, key, f"{own!r}, but `board: {config.board}` names {boards}: drop one of them")

    def check_board(self, node: yaml.Node, key: str, name: str, changes: dict[str, Any]) -> None:
        """A board `board:` names is in the table or `boards:`; one a run is estimated for (the
        top-level or a target's) has an FPU only if the CPU it runs has one."""
        from qlint.settings.boards import builtin_boards, fpu_error

        board = changes["budgets"].board(name)
        if board is None:
            known = ", ".join(sorted({*builtin_boards(), *changes["budgets"].boards}))
            raise self.error(node, key, f"unknown board {printable(name)[:80]!r} (known: {known}; a board of your "
                                        "own goes under `boards:`)")
        problem = fpu_error(board, board.cpu or changes.get("target_cpu", Config.target_cpu))
        if problem and key in ("board", "targets.board"):
            raise self.error(node, key, problem)

    def board_cpu(self, root: yaml.Node, changes: dict[str, Any]) -> None:
        """A run for a board is lowered for the board's CPU; `target_cpu:` beside it must agree."""
        name = changes.get("board")
        board = changes["budgets"].board(name) if name else None
        if board is None or not board.cpu:
            return
        if changes.setdefault("target_cpu", board.cpu) != board.cpu:
            node = next(v for k, v in root.value if k.value == "target_cpu")
            raise self.error(node, "target_cpu", f"{changes['target_cpu']!r}, but `board: {name}` is a {board.cpu}: "
                                                 "drop one of them")

    def key_board(self, node: yaml.Node, key: str) -> str:
        name = self.scalar(node, key, str)
        self.board_names.append((node, key, name))
        return name

    def key_target(self, node: yaml.Node, key: str) -> str:
        """An Ethos-U configuration (`ethos-u55-128`) or `cortex-m` (no NPU)."""
        try:
            return check_target(self.scalar(node, key, str))
        except ValueError as exc:
            raise self.error(node, key, str(exc)) from None

    def key_system_config(self, node: yaml.Node, key: str) -> str:
        """A System_Config section of Vela's vela.ini (checked when Vela is installed)."""
        try:
            return check_section("System_Config", self.scalar(node, key, str))
        except ValueError as exc:
            raise self.error(node, key, str(exc)) from None

    def key_memory_mode(self, node: yaml.Node, key: str) -> str:
        """A Memory_Mode section of Vela's vela.ini (checked when Vela is installed)."""
        try:
            return check_section("Memory_Mode", self.scalar(node, key, str))
        except ValueError as exc:
            raise self.error(node, key, str(exc)) from None

    def key_target_cpu(self, node: yaml.Node, key: str) -> str:
        value = self.scalar(node, key, str)
        if value not in CPUS:
            raise self.error(node, key, f"{value!r} is not one of {', '.join(CPUS)}")
        return value

    def key_include(self, node: yaml.Node, key: str) -> tuple[str, ...]:
        return self.strings(node, key)

    key_exclude = key_include

    def key_select(self, node: yaml.Node, key: str) -> tuple[str, ...]:
        values = self.strings(node, key)
        for item, value in zip(node.value, values, strict=True):
            validate_selectors((value,), functools.partial(self.error, item, key))
        return values

    key_ignore = key_select

    def key_coverage_threshold(self, node: yaml.Node, key: str) -> float:
        value = self.scalar(node, key, float)
        if not 0.0 <= value <= 1.0:
            raise self.error(node, key, f"must be between 0 and 1, got {value}")
        return value

    def key_coverage_by(self, node: yaml.Node, key: str) -> str:
        value = self.scalar(node, key, str)
        if value not in ("ops", "time"):
            raise self.error(node, key, f"{printable(value)[:40]!r} is not one of ops, time")
        return value

    def key_rules(self, node: yaml.Node, key: str) -> dict[Code, Severity]:
        severities = {}
        for code, knode, value in self.mapping(node, key):
            if code not in tuple(Code):
                raise self.error(knode, f"{key}.{printable(code)}", f"unknown rule code (known: {', '.join(Code)})")
            severity = self.scalar(value, f"{key}.{code}", str)
            if severity not in tuple(Severity):
                raise self.error(value, f"{key}.{code}", f"{severity!r} is not one of {', '.join(Severity)}")
            severities[Code(code)] = Severity(severity)
        return severities

    def key_fold(self, node: yaml.Node, key: str) -> FoldGuards:
        changes: dict[str, Any] = {}
        for name, knode, value in self.mapping(node, key):
            full = f"{key}.{name}"
            if name == "constant_kinds":
                changes[name] = tuple(ConstantKind(k) for k in self.choices(value, full, tuple(ConstantKind)))
            elif name == "dtypes":
                changes[name] = self.choices(value, full, FOLD_DTYPES)
            elif name == "max_elements":
                changes[name] = self.scalar(value, full, int)
                if changes[name] < 1:
                    raise self.error(value, full, "must be at least 1")
            elif name == "require_equal_qrange":
                changes[name] = self.scalar(value, full, bool)
            else:
                raise self.error(knode, full, "unknown key")
        return replace(FoldGuards(), **changes)

    def key_limits(self, node: yaml.Node, key: str) -> Limits:
        changes: dict[str, float] = {}
        for name, knode, value in self.mapping(node, key):
            full = f"{key}.{name}"
            if name not in {f.name for f in fields(Limits)}:
                raise self.error(knode, full, "unknown key")
            changes[name] = self.scalar(value, full, float)
            if not 0 < changes[name] < 1e9:
                raise self.error(value, full, f"must be a positive number, got {changes[name]}")
        return replace(Limits(), **changes)

    def key_remedies(self, node: yaml.Node, key: str) -> tuple[RemedyName, ...]:
        return tuple(RemedyName(name) for name in self.choices(node, key, tuple(RemedyName)))

    def key_remedy_max_sqnr_drop_db(self, node: yaml.Node, key: str) -> float:
        value = self.scalar(node, key, float)
        if not 0.0 <= value < 1000.0:
            raise self.error(node, key, f"must be a number of dB from 0, got {value}")
        return value

    def cycles_a_byte(self, node: yaml.Node, key: str) -> float:
        value = self.scalar(node, key, float)
        if not 0.0 <= value < 1000.0:  # nan fails both
            raise self.error(node, key, f"must be CPU cycles a byte from 0, got {value}")
        return value

    def origin(self, node: yaml.Node, key: str) -> str:
        return f"{key} in {self.path.name}:{node.start_mark.line + 1}"

    def size_or_count(self, node: yaml.Node, key: str, name: str) -> float:
        """A size (`sram`, `flash`: bytes or KiB/MiB), a duration (`latency`: 50ms), a count, or a share
        (`coverage`: 90% or 0.9)."""
        text = self.scalar(node, key, str)
        try:
            if name in SIZE_KEYS:
                return parse_size(text)
            if name in TIME_KEYS:
                return parse_duration_ms(text)
            if name == "coverage":
                return parse_percent(text)
            return parse_count(text, name.replace("_", " "))
        except ValueError as exc:
            raise self.error(node, key, printable(str(exc))) from None

    def growth(self, node: yaml.Node, key: str) -> dict[str, Growth]:
        """`{sram: 5%, fp32_islands: 0}`: a share of the base's figure, or an amount in its unit."""
        limits = {}
        for name, knode, value in self.mapping(node, key):
            full = f"{key}.{name}"
            if name not in GROWTH_KEYS:
                raise self.error(knode, full, f"unknown key (known: {', '.join(GROWTH_KEYS)})")
            text = self.scalar(value, full, str).strip()
            if name == "coverage" or text.endswith("%"):  # coverage: a drop in percentage points
                try:
                    amount = parse_percentage(text)
                except ValueError as exc:
                    raise self.error(value, full, printable(str(exc))) from None
                limits[name] = Growth(amount / 100, False) if name == "coverage" else Growth(amount, True)
            else:
                limits[name] = Growth(self.size_or_count(value, full, name), False)
        return limits

    def budget(self, node: yaml.Node, key: str) -> Budget:
        return self.budget_level(node, key, per_file=False)[0]

    def budget_level(self, node: yaml.Node, key: str, per_file: bool) -> tuple[Budget, tuple[tuple[str, Budget], ...]]:
        """One level of budgets; the top level may hold `per_file` globs with their own."""
        limits: dict[str, float] = {}
        board, growth = None, {}
        globs: list[tuple[str, Budget]] = []
        for name, knode, value in self.mapping(node, key):
            full = f"{key}.{name}"
            if name in (*SIZE_KEYS, *COUNT_KEYS, *TIME_KEYS, "coverage"):
                limits[name] = self.size_or_count(value, full, name)
            elif name == "board":
                board = self.scalar(value, full, str)
                self.board_names.append((value, full, board))
            elif name == "growth":
                growth = self.growth(value, full)
            elif name == "per_file" and per_file:
                globs = [(pattern, self.budget(v, f"{full}.{pattern}")) for pattern, _, v in self.mapping(value, full)]
            else:
                known = ", ".join((*SIZE_KEYS, *COUNT_KEYS, *TIME_KEYS, "coverage", "board", "growth")
                                  + (("per_file",) if per_file else ()))
                raise self.error(knode, full, f"unknown key (known: {known})")
        return Budget(self.origin(node, key), limits, board, growth), tuple(globs)

    def key_budgets(self, node: yaml.Node, key: str) -> Budgets:
        default, per_file = self.budget_level(node, key, per_file=True)
        return Budgets(default=None if default.empty else default, per_file=per_file)

    def key_boards(self, node: yaml.Node, key: str) -> dict[str, Board]:
        """The user's own boards: `{my-board: {cpu: cortex-m33, clock: 128MHz, fpu: true, sram: 512KiB,
        flash: 1MiB, flash_read: 0.5, npu: ethos-u55-128, system_config: ..., memory_mode: ...}}` (sram
        and flash required); one that redefines a board of the
        table says so (`override: true`), so a typo cannot shadow the table's figures."""
        from qlint.settings.boards import builtin_boards

        boards = {}
        for name, knode, value in self.mapping(node, key):
            where = f"{key}.{printable(name)}"
            if not name:
                raise self.error(knode, where, "a board needs a name")
            sizes: dict[str, int] = {}
            override, cpu, clock, fpu, flash_read = False, "", None, None, None
            fpu_node: yaml.Node | None = None
            npu_keys: dict[str, str] = {}
            for field_, fnode, size in self.mapping(value, where):
                if field_ == "npu":
                    npu_keys["npu"] = self.key_npu(size, f"{where}.npu")
                elif field_ in ("system_config", "memory_mode"):
                    npu_keys[field_] = getattr(self, f"key_{field_}")(size, f"{where}.{field_}")
                elif field_ == "override":
                    override = self.scalar(size, f"{where}.override", bool)
                elif field_ in SIZE_KEYS:
                    sizes[field_] = int(self.size_or_count(size, f"{where}.{field_}", field_))
                elif field_ == "cpu":
                    cpu = self.key_target_cpu(size, f"{where}.cpu")
                elif field_ == "clock":
                    try:
                        clock = parse_clock(self.scalar(size, f"{where}.clock", str))
                    except ValueError as exc:
                        raise self.error(size, f"{where}.clock", printable(str(exc))) from None
                elif field_ == "fpu":
                    fpu, fpu_node = self.scalar(size, f"{where}.fpu", bool), size
                elif field_ == "flash_read":
                    flash_read = self.cycles_a_byte(size, f"{where}.flash_read")
                else:
                    known = ("unknown key (known: cpu, clock, fpu, sram, flash, flash_read, npu, system_config, "
                             "memory_mode, override)")
                    raise self.error(fnode, f"{where}.{printable(field_)}", known)
            if fpu and cpu and not default_fpu(cpu):
                raise self.error(fpu_node, f"{where}.fpu", f"true, but a {cpu} has no FPU: drop it, or correct `cpu`")
            missing = [k for k in SIZE_KEYS if k not in sizes]
            if missing:
                raise self.error(value, where, f"a board needs {' and '.join(missing)}")
            if "npu" not in npu_keys and len(npu_keys):
                section = next(iter(npu_keys))
                raise self.error(value, f"{where}.{section}", "names a Vela section, and the board names no `npu:`")
            if override != (name in builtin_boards()):
                raise self.error(knode, where, "redefines the built-in board of that name: add `override: true`"
                                 if not override else "`override: true`, but no built-in board has that name")
            boards[name] = Board(name, cpu, sizes["sram"], sizes["flash"], self.origin(value, where),
                                 clock_hz=clock, fpu=fpu, flash_read=flash_read, **npu_keys)
        return boards

    def key_npu(self, node: yaml.Node, key: str) -> str:
        """A board's Ethos-U configuration (`ethos-u55-128`)."""
        try:
            return npu(self.scalar(node, key, str)).accelerator
        except ValueError as exc:
            raise self.error(node, key, str(exc)) from None

    def key_targets(self, node: yaml.Node, key: str) -> tuple[Target, ...]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.error(node, key, "expected a list of {name, factory[, remedies][, budgets][, board][, target]"
                                        "[, system_config][, memory_mode]} mappings")
        targets: list[Target] = []
        for item in node.value:
            fields: dict[str, str] = {}
            remedies, budgets, board = None, None, None
            npu_keys: dict[str, str] = {}
            for name, knode, value in self.mapping(item, key):
                if name in NPU_KEYS:
                    npu_keys[name] = getattr(self, f"key_{name}")(value, f"{key}.{name}")
                    continue
                if name == "remedies":
                    remedies = self.key_remedies(value, f"{key}.remedies")
                    continue
                if name == "board":
                    board = self.key_board(value, f"{key}.board")
                    continue
                if name == "budgets":
                    budgets = self.budget(value, f"{key}.budgets")
                    continue
                if name not in ("name", "factory"):
                    raise self.error(knode, f"{key}.{name}", "unknown key")
                fields[name] = self.scalar(value, f"{key}.{name}", str)
            if "factory" not in fields:
                raise self.error(item, key, "a target needs `factory: package.module:function`")
            if not FACTORY_RE.match(fields["factory"]):
                raise self.error(item, f"{key}.factory", f"{fields['factory']!r} is not `package.module:function`")
            name = fields.get("name") or fields["factory"].rsplit(":", 1)[1]
            if not TARGET_NAME_RE.match(name):
                raise self.error(item, f"{key}.name", f"{printable(name)[:80]!r} is not a target name: letters, "
                                 "digits, _, . and - (not starting with . or -), since --fix writes NAME.pte")
            if name in (t.name for t in targets):
                first = next(t.line for t in targets if t.name == name)
                raise self.error(item, f"{key}.name", f"{name!r} names two targets (the first on line {first})")
            if budgets is not None:  # named for the target, which its name may follow
                budgets = replace(budgets, origin=budgets.origin.replace(f"{key}.budgets", f"target {name}'s budgets"))
            targets.append(Target(name=name, factory=fields["factory"], line=item.start_mark.line + 1,
                                  remedies=remedies, budgets=budgets, board=board, npu=NpuChoice(**npu_keys)))
            self.target_nodes.append(item)
        return tuple(targets)


DEFAULT_CONFIG = """\
# qlint configuration: https://github.com/qlint/qlint/blob/main/docs/configuration.md
# Cortex-M CPU to lower for: cortex-m0 ... cortex-m85.
target_cpu: cortex-m55
# The board the run is for (`qlint boards`): its CPU instead of target_cpu, its clock and FPU for
# the estimated cycles and milliseconds (docs/cost-model.md). `--board NAME` overrides it.
# board: nucleo-l4r5zi
# An Arm Ethos-U NPU beside the core, lowered for by ExecuTorch's Arm backend: ethos-u55-32 ...
# ethos-u85-2048, or cortex-m for the CPU alone (the default; a board with an NPU gives its own).
# system_config and memory_mode name sections of Vela's vela.ini (default: EthosUCompileSpec's for
# the NPU). `--target`, `--system-config`, `--memory-mode` override them.
# target: ethos-u55-128
# system_config: Ethos_U55_High_End_Embedded
# memory_mode: Shared_Sram

# Files checked when a directory is given (globs relative to this file's folder).
include: ["**/*.pt2", "**/*.pte"]
exclude: []

# Rule selection, ruff-style: codes or code prefixes; the more specific one decides, an ignore at
# equal specificity. On the command line --select replaces this selection, --extend-select and
# --ignore add to it.
# select: [QL001, QL002]
# ignore: [QL005]

# Per-rule severity: error | warning | info | off. Exit code 1 only for errors.
rules:
  QL001: error
  QL002: warning
  QL003: error
  QL004: warning
  QL005: warning
  QL006: off
  QL007: error
  QL008: warning
  QL009: error
  QL010: warning

# QL005 fires when the share of compute ops running as int kernels is below this
# (`coverage_by: time`: the int8 share of the estimated cycles instead).
coverage_threshold: 0.9
coverage_by: ops

# Guards for folding an island (QL001/QL004); a blocked fold names its guard.
fold:
  constant_kinds: [parameter, buffer, constant, literal, computed]  # where the constant may live
  max_elements: 1              # elements in the constant (1 = scalar only)
  dtypes: [int8]               # activation dtypes that may be folded (int8, int16)
  require_equal_qrange: true   # input and output quantize must share dtype and clamp range

# What one input may cost; over a limit it is an error naming the input (exit 2).
# limits: {file_mb: 64, entry_mb: 32, tensor_mb: 256, graph_objects: 400000, timeout_s: 900, memory_mb: 4096,
#          pte_instructions: 100000, pte_entries: 500000, profile_entries: 200000}

# Model factories checked without artifacts: `package.module:function` returning
# (module, example_inputs) or (module, example_inputs, calibration_inputs).
targets: []
#  - name: attention
#    factory: models.attention:make_model
#    remedies: [unfused-attention]   # this target's list instead of the one below
#    board: nrf5340-dk               # this target's board instead of the config's
#    target: ethos-u85-256           # this target's NPU (and system_config, memory_mode) over the board's

# Remedies: export/quantization changes `qlint check --fix` makes to targets
# (unsafe fixes: they change numerics). Each is tried alone and kept only if it
# helps and the SQNR against the float model drops by at most the guard.
# `--unsafe-fixes` tries all of the target's flow. Known: channels-last, unfused-attention,
# derived-scale-qparams, int8-io, int8-layernorm, expand-broadcasts, conv1d-as-conv2d
# (Cortex-M CPU); layernorm-placement (Ethos-U: each LayerNorm on the NPU or the CPU, the cheaper).
remedies: []
remedy_max_sqnr_drop_db: 1.0

# Budgets (QL009): what each artifact and target may need, measured on the program `--fix`
# writes (a .pte: as shipped). Sizes in bytes, KiB or MiB; `board:` takes sram and flash from
# a board (docs/budgets.md lists them); `growth:` limits apply with `--compare FILE`.
# budgets:
#   sram: 64KiB                  # the planned activation arena and the method allocator
#   flash: 256KiB                # the .pte's length
#   fp32_islands: 0
#   coverage: 90%                # a minimum
#   latency: 50ms                # estimated, at the board's clock
#   growth: {sram: 5%, fp32_islands: 0, fp32_cycles: 0}
#   per_file:
#     "models/kws*.pt2": {board: nrf52840-dk}
# boards:
#   my-board: {cpu: cortex-m33, clock: 128MHz, fpu: true, sram: 512KiB, flash: 1MiB}
#   my-npu-board: {cpu: cortex-m55, npu: ethos-u55-256, sram: 2MiB, flash: 4MiB}
"""
