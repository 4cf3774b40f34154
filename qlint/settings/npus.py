"""The Arm Ethos-U NPUs a run may lower for, as ExecuTorch's `EthosUCompileSpec(target, system_config,
memory_mode)` takes them: an accelerator configuration (`ethos-u55-128`), a system config and a memory
mode, the last two sections of Vela's `vela.ini`.

The table is data, `npus.yaml` beside this module, one row a family with its source in ExecuTorch and
Vela. A system config or memory mode is checked against the sections of the `vela.ini` the installed
Vela ships, read as text (Vela is an optional extra; without it a name is taken as written and Vela
judges it when it lowers). Nothing here imports torch or Vela.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources

import yaml

from qlint.io.reads import printable

CPU_ONLY = "cortex-m"   # the target that means no NPU: the Cortex-M flow alone
VELA_EXTRA = "pip install 'qlint[ethos-u]' (Arm's Vela compiler, ethos-u-vela)"  # what the NPU flow adds
VELA_INI = "config_files/Arm/vela.ini"   # in Vela's `ethosu` package; ExecuTorch passes --config=Arm/vela.ini
_SECTION = re.compile(r"^\[(System_Config|Memory_Mode)\.([^\]\s]+)\]\s*$", re.M)


@dataclass(frozen=True)
class Npu:
    """An Ethos-U configuration as ExecuTorch's EthosUCompileSpec takes it."""

    accelerator: str      # "ethos-u55-128": Vela's --accelerator-config
    system_config: str    # a System_Config section of Vela's vela.ini
    memory_mode: str      # a Memory_Mode section of Vela's vela.ini

    @property
    def family(self) -> str:
        """`ethos-u55`, `ethos-u65` or `ethos-u85`."""
        return _family_name(self.accelerator)

    @property
    def macs(self) -> int:
        """The 8x8 MACs a cycle: 128 for ethos-u55-128."""
        return int(self.accelerator.rsplit("-", 1)[1])


@dataclass(frozen=True)
class Family:
    """One row of `npus.yaml`: a family's configurations and EthosUCompileSpec's defaults for it."""

    name: str
    macs: tuple[int, ...]
    system_config: str
    memory_mode: str
    source: str

    @property
    def accelerators(self) -> tuple[str, ...]:
        return tuple(f"{self.name}-{macs}" for macs in self.macs)


@dataclass(frozen=True)
class NpuChoice:
    """What one level of the settings names (the config's top level, a board, a config target, the
    command line): a target (an accelerator or `cortex-m`), a system config, a memory mode; None for
    what it leaves to the levels below."""

    target: str | None = None
    system_config: str | None = None
    memory_mode: str | None = None

    @property
    def empty(self) -> bool:
        return self.target is None and self.system_config is None and self.memory_mode is None


@functools.cache
def families() -> dict[str, Family]:
    """The table in `npus.yaml` beside this module."""
    text = resources.files("qlint.settings").joinpath("npus.yaml").read_text(encoding="utf-8")
    return {name: Family(name, tuple(row["macs"]), row["system_config"], row["memory_mode"], row["source"])
            for name, row in yaml.safe_load(text).items()}


def accelerators() -> tuple[str, ...]:
    """Every accelerator configuration, family by family."""
    return tuple(name for family in families().values() for name in family.accelerators)


def targets() -> tuple[str, ...]:
    """What `target:` and `--target` accept: `cortex-m` and every accelerator configuration."""
    return (CPU_ONLY, *accelerators())


def _family(accelerator: str) -> Family | None:
    family = families().get(_family_name(accelerator))
    return family if family is not None and accelerator in family.accelerators else None


@functools.cache
def vela_sections() -> tuple[frozenset[str], frozenset[str]] | None:
    """The System_Config and Memory_Mode section names of the installed Vela's vela.ini, or None when
    Vela is not installed (the file is read as text: importing Vela would cost its start-up)."""
    try:
        text = resources.files("ethosu").joinpath(VELA_INI).read_text(encoding="utf-8")
    except (ModuleNotFoundError, OSError, UnicodeDecodeError):
        return None
    found: dict[str, set[str]] = {"System_Config": set(), "Memory_Mode": set()}
    for kind, name in _SECTION.findall(text):
        found[kind].add(name)
    return frozenset(found["System_Config"]), frozenset(found["Memory_Mode"])


def check_section(kind: str, name: str) -> str:
    """`name` when Vela's vela.ini has a `kind` section of that name (`System_Config` or `Memory_Mode`),
    or when Vela is not installed; raises ValueError naming the sections it has."""
    sections = vela_sections()
    if sections is None:
        return name
    known = sections[0] if kind == "System_Config" else sections[1]
    if name not in known:
        what = "system config" if kind == "System_Config" else "memory mode"
        raise ValueError(f"unknown {what} {printable(name)[:80]!r} (Vela's vela.ini has: {', '.join(sorted(known))})")
    return name


def check_target(name: str) -> str:
    """`name` when it is `cortex-m` or an accelerator configuration; raises ValueError naming them."""
    if name != CPU_ONLY and _family(name) is None:
        raise ValueError(f"unknown target {printable(name)[:80]!r} (known: {', '.join(targets())})")
    return name


def npu(name: str, system_config: str | None = None, memory_mode: str | None = None) -> Npu:
    """The Ethos-U configuration `name` (`ethos-u55-128`) with `system_config` and `memory_mode`, or
    EthosUCompileSpec's defaults for its family. Raises ValueError for a name no family has (one line
    with the known names) and a section Vela's vela.ini does not have."""
    family = _family(name)
    if family is None:
        raise ValueError(f"unknown Ethos-U configuration {printable(name)[:80]!r} (known: {', '.join(accelerators())}; "
                         f"{CPU_ONLY} for none)")
    return Npu(name, check_section("System_Config", system_config or family.system_config),
               check_section("Memory_Mode", memory_mode or family.memory_mode))


class NoNpu(ValueError):
    """A system config or memory mode named where no NPU is in effect; `named` says which."""

    def __init__(self, named: str) -> None:
        self.named = named
        super().__init__(f"names {named}, and the target is {CPU_ONLY} (no NPU): name an Ethos-U target with it")


def resolve(levels: Iterable[NpuChoice]) -> Npu | None:
    """The NPU of a run whose settings name `levels`, lowest first (the config's top level, the board,
    the config target, the command line): each level's target over those below it. A system config or
    memory mode carries over to a higher level's target of the same family (or to the first target
    named), not to another family's (a section of vela.ini is written for one) nor past `cortex-m`.
    None: the Cortex-M flow alone. Raises `NoNpu` when a system config or memory mode is left with no
    NPU to apply to, ValueError for an unknown name."""
    name: str | None = None
    system_config: str | None = None
    memory_mode: str | None = None
    for level in levels:
        if level.target is not None:
            if level.target == CPU_ONLY or (name is not None and _family_name(level.target) != _family_name(name)):
                system_config = memory_mode = None
            name = level.target
        system_config = level.system_config or system_config
        memory_mode = level.memory_mode or memory_mode
    if name is None or name == CPU_ONLY:
        if system_config or memory_mode:
            raise NoNpu("a system config" if system_config else "a memory mode")
        return None
    return npu(name, system_config, memory_mode)


def _family_name(target: str) -> str:
    return target.rsplit("-", 1)[0]


def vela_missing(npu: Npu) -> str | None:
    """The one line that says lowering for `npu` needs Vela, when Vela cannot be imported; else None.
    Found without importing it (`find_spec` runs only the `ethosu` package's own `__init__`)."""
    import importlib.util

    try:
        found = importlib.util.find_spec("ethosu") is not None and importlib.util.find_spec("ethosu.vela") is not None
    except (ImportError, ValueError):
        found = False
    if found:
        return None
    return f"the {npu.accelerator} target needs Vela, which compiles each NPU partition: {VELA_EXTRA}"
