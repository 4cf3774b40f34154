"""Session-wide programs: each model is exported and quantized once per test run."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from qlint.graph import stack  # noqa: E402

stack.load()


@pytest.fixture(scope="session", autouse=True)
def forkserver() -> None:
    """Child processes fork from a server that imports torch first: start it while other tests run."""
    from qlint.run.isolation import warm_up

    warm_up()


@pytest.fixture(scope="session", autouse=True)
def isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tests never read or write the user's result cache."""
    import os

    folder = tmp_path_factory.mktemp("qlint-cache")
    os.environ["QLINT_CACHE_DIR"] = str(folder)
    return folder


@pytest.fixture(scope="session")
def quantized() -> Callable[..., Any]:
    """`quantized("make_attention", int16=False)` -> a quantized ExportedProgram, cached."""
    from examples import models, sam, zoo
    from qlint.graph.quantize import quantize

    cache: dict[tuple[str, bool], Any] = {}

    def get(name: str, int16: bool = False) -> Any:
        if (name, int16) not in cache:
            module = next(m for m in (models, sam, zoo) if hasattr(m, name))
            factory = getattr(module, name)
            model, example, calibration = factory()
            config = None
            if int16:
                from executorch.backends.cortex_m.quantizer.quantization_configs import (
                    INT16_PER_TENSOR_CONFIG,
                )

                config = INT16_PER_TENSOR_CONFIG
            cache[(name, int16)] = quantize(model, example, calibration, config)
        return cache[(name, int16)]

    return get


@pytest.fixture(scope="session")
def linted(quantized: Callable[..., Any]) -> Callable[..., Any]:
    """`linted("make_pool")` -> the model linted with the default config, lowered once per session.

    Lowering is most of a test's time; the result is only read (findings, the
    unfixed program to compare a fix against), never changed.
    """
    from qlint.graph.lint import lint_program
    from qlint.settings.config import Config

    cache: dict[tuple[str, bool], Any] = {}

    def get(name: str, int16: bool = False) -> Any:
        if (name, int16) not in cache:
            cache[(name, int16)] = lint_program(quantized(name, int16), name, Config())
        return cache[(name, int16)]

    return get


@pytest.fixture(scope="session")
def pt2_dir(tmp_path_factory: pytest.TempPathFactory, quantized: Callable[..., Any]) -> Callable[[str], Path]:
    """`pt2_dir("make_attention")` -> a .pt2 file saved with torch.export.save, cached."""
    import torch

    folder = tmp_path_factory.mktemp("pt2")

    def get(name: str) -> Path:
        path = folder / f"{name.removeprefix('make_')}.pt2"
        if not path.exists():
            torch.export.save(quantized(name), str(path))
        return path

    return get


@pytest.fixture(scope="session")
def attention_plan(tmp_path_factory: pytest.TempPathFactory, quantized: Callable[..., Any]) -> tuple[Path, Any]:
    """The attention example as to_executorch writes it (unfolded), and the live peak of its plan."""
    from executorch.backends.cortex_m.edge_compile_config import cortex_m_edge_compile_config
    from executorch.exir import EdgeProgramManager

    from qlint.graph.lint import lint_program
    from qlint.graph.memory import live_peak
    from qlint.settings.config import Config

    checked = lint_program(quantized("make_attention"), "a", Config())  # to_executorch changes it: not the shared one
    manager = EdgeProgramManager({"forward": checked.lowered}, compile_config=cortex_m_edge_compile_config())
    path = tmp_path_factory.mktemp("pte") / "attention.pte"
    program = manager.to_executorch()
    path.write_bytes(program.buffer)
    return path, live_peak(program.exported_program().graph_module, Path("."))


@pytest.fixture(scope="session")
def sam_pt2(pt2_dir: Callable[[str], Path]) -> Path:
    return pt2_dir("make_two_way_transformer")


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from qlint.cli.main import main

    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def run_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code, out, _ = run_cli([*args, "--output-format", "json"], capsys)
    return code, json.loads(out)


# Runs qlint in a fresh interpreter and prints its peak memory on stderr (`MAXRSS_KB=`).
# VmHWM, not getrusage: Linux carries the parent's peak into a vfork-spawned child's ru_maxrss,
# so a large pytest process would be measured instead of qlint.
PROBE = (
    "import sys\n"
    "from qlint.cli.main import main\n"
    "code = main(sys.argv[1:])\n"
    "[hwm] = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')]\n"
    "print(f'MAXRSS_KB={hwm}', file=sys.stderr)\n"
    "raise SystemExit(code)\n"
)
