"""Ethos-U targets in the settings: the table of what ExecuTorch's EthosUCompileSpec and Vela accept,
the four levels a run's NPU resolves from, the command line's options, the boards that carry an NPU,
the cache key and the static tier's notice. Torch-free."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from conftest import run_cli

from qlint.settings import npus
from qlint.settings.boards import builtin_boards
from qlint.settings.config import Config, ConfigError, load_config
from qlint.settings.npus import CPU_ONLY, Npu, NpuChoice, npu, resolve

ACCELERATORS = ("ethos-u55-32, ethos-u55-64, ethos-u55-128, ethos-u55-256, ethos-u65-256, ethos-u65-512, "
                "ethos-u85-128, ethos-u85-256, ethos-u85-512, ethos-u85-1024, ethos-u85-2048")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / ".qlint.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_the_table_has_every_configuration_with_each_familys_defaults() -> None:
    assert ", ".join(npus.accelerators()) == ACCELERATORS
    assert npus.targets() == (CPU_ONLY, *npus.accelerators())
    assert npu("ethos-u55-128") == Npu("ethos-u55-128", "Ethos_U55_High_End_Embedded", "Shared_Sram")
    assert npu("ethos-u65-512") == Npu("ethos-u65-512", "Ethos_U65_High_End", "Dedicated_Sram_384KB")
    assert npu("ethos-u85-2048") == Npu("ethos-u85-2048", "Ethos_U85_SYS_DRAM_Mid", "Sram_Only")
    assert (npu("ethos-u55-128").family, npu("ethos-u55-128").macs) == ("ethos-u55", 128)
    assert (npu("ethos-u85-1024").family, npu("ethos-u85-1024").macs) == ("ethos-u85", 1024)
    assert npu("ethos-u85-256", "Ethos_U85_SYS_Flash_High", "Shared_Sram") == Npu(
        "ethos-u85-256", "Ethos_U85_SYS_Flash_High", "Shared_Sram")
    for family in npus.families().values():
        assert "compile_spec.py" in family.source and "architecture_features.py" in family.source


def test_the_table_is_executorchs_and_velas_own() -> None:
    """Each row against the source it cites: Vela's Accelerator enum, ExecuTorch's defaults."""
    pytest.importorskip("ethosu")
    from importlib import resources

    vela = resources.files("ethosu").joinpath("vela/architecture_features.py").read_text(encoding="utf-8")
    for name in npus.accelerators():
        assert f'= "{name}"' in vela, name
    sections = npus.vela_sections()
    assert sections is not None
    for family in npus.families().values():
        assert family.system_config in sections[0] and family.memory_mode in sections[1]


@pytest.mark.parametrize("name", ["ethos-u55-512", "ethos-u75-128", "cortex-m", "ETHOS-U55-128", ""])
def test_an_unknown_configuration_is_one_line_naming_the_known(name: str) -> None:
    with pytest.raises(ValueError) as raised:
        npu(name)
    assert str(raised.value) == f"unknown Ethos-U configuration {name!r} (known: {ACCELERATORS}; cortex-m for none)"


def test_a_vela_section_is_checked_against_the_installed_velas_ini(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(npus, "vela_sections", lambda: (frozenset({"A", "B"}), frozenset({"M"})))
    with pytest.raises(ValueError) as raised:
        npu("ethos-u55-128", "Nope")
    assert str(raised.value) == "unknown system config 'Nope' (Vela's vela.ini has: A, B)"
    with pytest.raises(ValueError) as raised:
        npu("ethos-u55-128", "A", "Nope")
    assert str(raised.value) == "unknown memory mode 'Nope' (Vela's vela.ini has: M)"
    # Without Vela a name is taken as written: Vela judges it when it lowers.
    monkeypatch.setattr(npus, "vela_sections", lambda: None)
    assert npu("ethos-u55-128", "Nope", "Nope") == Npu("ethos-u55-128", "Nope", "Nope")


def test_velas_ini_is_read_as_text_from_the_installed_package() -> None:
    pytest.importorskip("ethosu")
    npus.vela_sections.cache_clear()
    sections = npus.vela_sections()
    assert sections is not None
    assert {"Ethos_U55_High_End_Embedded", "Ethos_U65_High_End", "Ethos_U85_SYS_DRAM_Mid"} <= sections[0]
    assert {"Shared_Sram", "Sram_Only", "Dedicated_Sram_384KB"} <= sections[1]


@pytest.mark.parametrize(
    ("levels", "expected"),
    [
        ([], None),
        ([NpuChoice("ethos-u55-64")], Npu("ethos-u55-64", "Ethos_U55_High_End_Embedded", "Shared_Sram")),
        # a higher level's target wins; a section carries over within a family
        ([NpuChoice("ethos-u55-64", "Ethos_U55_Deep_Embedded"), NpuChoice("ethos-u55-256")],
         Npu("ethos-u55-256", "Ethos_U55_Deep_Embedded", "Shared_Sram")),
        # ... and not to another family's NPU
        ([NpuChoice("ethos-u55-64", "Ethos_U55_Deep_Embedded", "Sram_Only"), NpuChoice("ethos-u85-256")],
         Npu("ethos-u85-256", "Ethos_U85_SYS_DRAM_Mid", "Sram_Only")),
        # a section named before any target goes to the first one named
        ([NpuChoice(memory_mode="Sram_Only"), NpuChoice("ethos-u55-128")],
         Npu("ethos-u55-128", "Ethos_U55_High_End_Embedded", "Sram_Only")),
        # cortex-m turns the NPU off, with whatever sections were below it
        ([NpuChoice("ethos-u55-64", "Ethos_U55_Deep_Embedded"), NpuChoice(CPU_ONLY)], None),
        ([NpuChoice(CPU_ONLY), NpuChoice("ethos-u65-256")], Npu("ethos-u65-256", "Ethos_U65_High_End",
                                                               "Dedicated_Sram_384KB")),
    ],
)
def test_the_levels_resolve_each_over_the_ones_below(levels: list[NpuChoice], expected: Npu | None) -> None:
    assert resolve(levels) == expected


def test_a_section_with_no_npu_to_apply_to_is_refused() -> None:
    with pytest.raises(npus.NoNpu) as raised:
        resolve([NpuChoice(system_config="Ethos_U55_Deep_Embedded")])
    assert str(raised.value) == ("names a system config, and the target is cortex-m (no NPU): name an Ethos-U target "
                                 "with it")
    with pytest.raises(npus.NoNpu) as raised:
        resolve([NpuChoice("ethos-u55-128"), NpuChoice(CPU_ONLY, memory_mode="Sram_Only")])
    assert str(raised.value).startswith("names a memory mode, and the target is cortex-m")


def test_the_config_resolves_the_top_level_each_target_and_the_board(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, """\
        target: ethos-u55-64
        system_config: Ethos_U55_Deep_Embedded
        targets:
          - {name: u85, factory: m:f, target: ethos-u85-256}
          - {name: cpu, factory: m:f, target: cortex-m}
          - {name: mode, factory: m:f, memory_mode: Sram_Only}
          - {name: fvp, factory: m:f, board: corstone-320-fvp}
          - {name: fvp-u85-1024, factory: m:f, board: corstone-320-fvp, target: ethos-u85-1024}
          - {name: plain, factory: m:f}
        """))
    assert config.npu == Npu("ethos-u55-64", "Ethos_U55_Deep_Embedded", "Shared_Sram")
    resolved = {t.name: config.for_target(t).npu for t in config.targets}
    assert resolved == {
        "u85": Npu("ethos-u85-256", "Ethos_U85_SYS_DRAM_Mid", "Sram_Only"),
        "cpu": None,
        "mode": Npu("ethos-u55-64", "Ethos_U55_Deep_Embedded", "Sram_Only"),
        "fvp": Npu("ethos-u85-128", "Ethos_U85_SYS_DRAM_Mid", "Sram_Only"),
        "fvp-u85-1024": Npu("ethos-u85-1024", "Ethos_U85_SYS_DRAM_Mid", "Sram_Only"),
        "plain": Npu("ethos-u55-64", "Ethos_U55_Deep_Embedded", "Shared_Sram"),
    }
    fvp = config.for_target(config.targets[3])
    assert (fvp.board, fvp.target_cpu) == ("corstone-320-fvp", "cortex-m85")
    assert Config().npu is None and load_config(write(tmp_path, "target_cpu: cortex-m85\n")).npu is None


def test_a_board_gives_its_npu_and_a_board_of_your_own_may_name_one(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, """\
        board: mine
        boards:
          mine: {cpu: cortex-m55, npu: ethos-u55-256, memory_mode: Sram_Only, sram: 2MiB, flash: 4MiB}
        """))
    assert config.npu == Npu("ethos-u55-256", "Ethos_U55_High_End_Embedded", "Sram_Only")
    assert load_config(write(tmp_path, "board: corstone-300-fvp\n")).npu == npu("ethos-u55-128")
    # the command line's board and target over the config's
    assert config.with_board("corstone-320-fvp").npu == npu("ethos-u85-128")
    assert config.with_npu(NpuChoice(CPU_ONLY)).npu is None
    assert config.with_npu(NpuChoice("ethos-u55-32")).npu == Npu("ethos-u55-32", "Ethos_U55_High_End_Embedded",
                                                                 "Sram_Only")


@pytest.mark.parametrize(
    ("text", "line", "key", "message"),
    [
        ("target: ethos-u55-512\n", 1, "target",
         f"unknown target 'ethos-u55-512' (known: cortex-m, {ACCELERATORS})"),
        ("target: ethos-u55-128\nsystem_config: Nope\n", 2, "system_config",
         "unknown system config 'Nope' (Vela's vela.ini has: "),
        ("target: ethos-u55-128\nmemory_mode: Nope\n", 2, "memory_mode", "unknown memory mode 'Nope' (Vela's vela.ini"),
        ("target_cpu: cortex-m55\nsystem_config: Ethos_U55_Deep_Embedded\n", 2, "system_config",
         "names a system config, and the target is cortex-m (no NPU): name an Ethos-U target with it"),
        ("target: cortex-m\nmemory_mode: Sram_Only\n", 2, "memory_mode",
         "names a memory mode, and the target is cortex-m (no NPU): name an Ethos-U target with it"),
        ("targets:\n  - {factory: m:f, target: ethos-u99-1}\n", 2, "targets.target", "unknown target 'ethos-u99-1'"),
        ("target: ethos-u55-128\ntargets:\n  - factory: m:f\n    target: cortex-m\n    system_config: Ethos_U55_Deep_"
         "Embedded\n", 5, "targets.system_config", "names a system config, and the target is cortex-m (no NPU)"),
        ("board: corstone-300-fvp\ntarget: ethos-u85-256\n", 2, "target",
         "'ethos-u85-256', but `board: corstone-300-fvp` names ethos-u55-128: drop one of them"),
        ("board: corstone-300-fvp\ntarget: cortex-m\n", 2, "target",
         "'cortex-m', but `board: corstone-300-fvp` names ethos-u55-128: drop one of them"),
        ("boards:\n  b: {npu: cortex-m, sram: 1KiB, flash: 1KiB}\n", 2, "boards.b.npu",
         f"unknown Ethos-U configuration 'cortex-m' (known: {ACCELERATORS}; cortex-m for none)"),
        ("boards:\n  b: {memory_mode: Sram_Only, sram: 1KiB, flash: 1KiB}\n", 2, "boards.b.memory_mode",
         "names a Vela section, and the board names no `npu:`"),
    ],
)
def test_npu_config_errors_name_file_line_and_key(tmp_path: Path, text: str, line: int, key: str,
                                                  message: str) -> None:
    if "Nope" in text:
        pytest.importorskip("ethosu")
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    error = raised.value
    assert (error.line, error.key) == (line, key), str(error)
    assert error.message.startswith(message), error.message


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--target", "ethos-u55-512"], f"qlint: --target: unknown target 'ethos-u55-512' (known: cortex-m, "
                                        f"{ACCELERATORS})"),
        (["--memory-mode", "Sram_Only"], "qlint: --memory-mode: names a memory mode, and the target is cortex-m "
                                         "(no NPU): name an Ethos-U target with it"),
        (["--target", "cortex-m", "--system-config", "Ethos_U55_Deep_Embedded"],
         "qlint: --system-config: names a system config, and the target is cortex-m (no NPU): name an Ethos-U "
         "target with it"),
    ],
)
def test_the_npu_options_refuse_a_bad_name_in_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                               argv: list[str], line: str) -> None:
    code, out, err = run_cli(["check", "--config", str(write(tmp_path, "include: []\n")), *argv, "--static",
                              str(tmp_path)], capsys)
    assert (code, out, err) == (2, "", line + "\n")


def test_an_unknown_vela_section_on_the_command_line_is_one_line_exit_2(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ethosu")
    code, out, err = run_cli(["check", "--config", str(write(tmp_path, "include: []\n")), "--target", "ethos-u55-128",
                              "--system-config", "Nope", "--static", str(tmp_path)], capsys)
    assert (code, out) == (2, "")
    assert err.startswith("qlint: --system-config: unknown system config 'Nope' (Vela's vela.ini has: Ethos_U55_Deep")
    assert err.count("\n") == 1


def test_a_target_without_vela_is_one_line_naming_the_extra_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name.startswith("ethosu") else
                        find_spec(name, *a))
    config = str(write(tmp_path, "include: []\n"))
    code, out, err = run_cli(["check", "--config", config, "--target", "ethos-u55-128", str(tmp_path)], capsys)
    assert (code, out, err) == (2, "", "qlint: error: the ethos-u55-128 target needs Vela, which compiles each NPU "
                                       "partition: pip install 'qlint[ethos-u]' (Arm's Vela compiler, ethos-u-vela)\n")
    code, _, err = run_cli(["check", "--config", config, "--target", "ethos-u55-128", "--static", str(tmp_path)],
                           capsys)
    assert code == 0 and "Vela" not in err  # the static tier lowers nothing
    code, _, err = run_cli(["check", "--config", config, "--target", "ethos-u55-128", str(tmp_path / "no.pte")],
                           capsys)
    assert "Vela" not in err and "no.pte" in err  # a `.pte` is read as lowered: nothing to compile


def test_static_says_it_checks_the_cpu_flow_only_when_an_npu_is_named(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    config = str(write(tmp_path, "include: []\n"))
    notice = ("qlint: notice: --static checks the Cortex-M CPU flow only, not the ethos-u85-256 target the config "
              "or command line names: `qlint check` without --static lowers for it")
    code, _, err = run_cli(["check", "--config", config, "--target", "ethos-u85-256", "--static", str(tmp_path)],
                           capsys)
    assert code == 0 and notice in err.splitlines()
    code, _, err = run_cli(["check", "--config", config, "--static", str(tmp_path)], capsys)
    assert code == 0 and "notice" not in err
    code, _, err = run_cli(["check", "--config", str(write(tmp_path, "include: []\nboard: corstone-320-fvp\n")),
                            "--static", str(tmp_path)], capsys)
    assert code == 0 and "not the ethos-u85-128 target" in err
    code, _, err = run_cli(["check", "--config", str(write(tmp_path, "include: []\nboard: corstone-320-fvp\n")),
                            "--target", "cortex-m", "--static", str(tmp_path)], capsys)
    assert code == 0 and "notice" not in err


def test_boards_show_the_npu(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["boards"], capsys)
    assert code == 0
    row = next(line for line in out.splitlines() if line.startswith("corstone-320-fvp"))
    assert row.split()[:3] == ["corstone-320-fvp", "cortex-m85", "ethos-u85-128"]
    code, out, _ = run_cli(["boards", "--output-format", "json"], capsys)
    records = {r["name"]: r for r in json.loads(out)}
    assert {k: records["corstone-300-fvp"][k] for k in ("cpu", "npu", "system_config", "memory_mode")} == {
        "cpu": "cortex-m55", "npu": "ethos-u55-128", "system_config": None, "memory_mode": None}
    assert records["nucleo-f446re"]["npu"] is None
    assert "run_corstone" in records["corstone-320-fvp"]["npu_source"]
    code, out, _ = run_cli(["boards", "--verbose"], capsys)
    assert "\ncorstone-300-fvp\n  source: https://github.com/zephyrproject-rtos/zephyr/" in out
    assert "\n  NPU: ethos-u55-128, executorch 1.5.1 backends/arm/test/runner_utils.py run_corstone" in out
    assert {b.npu for b in builtin_boards().values()} == {None, "ethos-u55-128", "ethos-u55-256", "ethos-u85-128",
                                                          "ethos-u85-256"}


def test_the_production_boards_with_an_ethos_u_resolve_their_npu(tmp_path: Path) -> None:
    """Every board in the table that names an NPU gives it as the config's, with its family's Vela defaults;
    the Alif cores alone keep their own rows, so `target: cortex-m` on them stays valid."""
    with_npu = {name: b.npu for name, b in builtin_boards().items() if b.npu}
    assert {name: npu_name for name, npu_name in with_npu.items() if name.startswith("alif-")} == {
        "alif-e7-dk-hp-u55": "ethos-u55-256", "alif-e7-dk-he-u55": "ethos-u55-128",
        "alif-e8-dk-hp-u55": "ethos-u55-256", "alif-e8-dk-he-u55": "ethos-u55-128",
        "alif-e8-dk-hp-u85": "ethos-u85-256", "alif-e8-dk-he-u85": "ethos-u85-256"}
    for name, npu_name in with_npu.items():
        assert load_config(write(tmp_path, f"board: {name}\n")).npu == npu(npu_name), name
    assert load_config(write(tmp_path, "board: alif-e8-dk-hp-u85\n")).npu == Npu(
        "ethos-u85-256", "Ethos_U85_SYS_DRAM_Mid", "Sram_Only")
    hp = load_config(write(tmp_path, "board: alif-e8-dk-hp\ntarget: cortex-m\n"))
    assert hp.npu is None and hp.board == "alif-e8-dk-hp"


def test_a_run_for_another_npu_never_answers_from_anothers_cache_entry(tmp_path: Path) -> None:
    """The cache key holds the config's resolved NPU (its fingerprint is every Config field) and each
    target's own NPU keys (its definition): another accelerator, system config or memory mode is
    another entry."""
    from qlint.run.cache import Cache
    from qlint.settings.options import RunOptions

    base = load_config(write(tmp_path, "include: []\n"))
    runs = [base, base.with_npu(NpuChoice("ethos-u55-128")), base.with_npu(NpuChoice("ethos-u55-256")),
            base.with_npu(NpuChoice("ethos-u55-128", "Ethos_U55_Deep_Embedded")),
            base.with_npu(NpuChoice("ethos-u55-128", memory_mode="Sram_Only")),
            base.with_board("corstone-320-fvp")]
    keys = {Cache(tmp_path / "cache", config, RunOptions()).key(b"program", "model.pt2") for config in runs}
    assert len(keys) == len(runs)
    # the same NPU by another route is the same entry
    again = Cache(tmp_path / "cache", base.with_npu(NpuChoice("ethos-u55-128")), RunOptions())
    assert again.key(b"program", "model.pt2") in keys

    (tmp_path / "m.py").write_text("def f():\n    return None\n")
    target_keys = set()
    for own in ("", ", target: ethos-u85-256", ", target: ethos-u85-512", ", target: ethos-u85-512, memory_mode: "
                "Shared_Sram", ", board: corstone-320-fvp"):
        config = load_config(write(tmp_path, f"targets:\n  - {{name: t, factory: m:f{own}}}\n"))
        target_keys.add(Cache(tmp_path / "cache", config, RunOptions()).target_key(config.targets[0], config))
    assert None not in target_keys and len(target_keys) == 5
