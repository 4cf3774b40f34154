"""What every tier shares: paths, the CLI runner, and session-wide programs built on first use.

Nothing here imports torch at module level, so `python -m pytest tests/unit` never loads it; the
stack and the forkserver start only when a session collects a test outside tests/unit. Programs
(quantized, linted, saved as .pt2) are built once per test process. Under pytest-xdist each worker
is such a process, so tests are grouped by the model they read (`pytest_collection_modifyitems`):
one worker builds each model, and a file's other tests stay together."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

UNIT = ROOT / "tests" / "unit"
CHECKOUT = "<qlint-checkout>"  # the checkout's path in stored programs
STORE_VERSIONED = ("torch", "executorch", "torchao", "transformers", "segment-anything")
# Fixtures that build one model whatever the test: their tests join that model's group.
MODEL_FIXTURES = {"sam_pt2": "make_two_way_transformer", "sam_from_target": "make_two_way_transformer",
                  "attention_plan": "make_attention"}


def named_model(item: pytest.Item) -> str | None:
    """The model a test's body names (`linted("make_mobilevit")`), if one: such a test must carry
    `@pytest.mark.model(NAME)`, which collection checks (the mark groups it, never this guess)."""
    import inspect
    import re

    function = getattr(item, "function", None)
    try:
        source = inspect.getsource(function) if function is not None else ""
    except (OSError, TypeError):
        return None
    named = set(re.findall(r"[\"'](make_\w+)[\"']", source))
    return named.pop() if len(named) == 1 else None


def in_unit_tier(item: pytest.Item) -> bool:
    return item.path.is_relative_to(UNIT)


# The tiers in the order their groups are handed to the workers: the long groups first (a corpus, a
# remedy search), so the short ones fill in beside them and no worker is left with one long group at
# the end (pyproject.toml turns off xdist's own order, by number of tests, which does the reverse).
TIER_ORDER = ("slow", "integration", "full", "unit")


def tier_rank(item: pytest.Item) -> int:
    return next((rank for rank, tier in enumerate(TIER_ORDER) if item.path.is_relative_to(ROOT / "tests" / tier)),
                len(TIER_ORDER))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test joins the group of the model it reads (`@pytest.mark.model(NAME)`, a `name`
    parameter, or a fixture that builds one model), else its file's group: under `--dist loadgroup`
    a group runs on one worker, so no model is exported, quantized or lowered by both. A test whose
    body names a model without any of these is a collection error. Groups are handed out in
    TIER_ORDER."""
    items.sort(key=tier_rank)  # stable: a file's tests keep their order
    for item in items:
        params = getattr(item, "callspec", None)
        name = params.params.get("name") if params is not None else None
        fixture = next((MODEL_FIXTURES[f] for f in getattr(item, "fixturenames", ()) if f in MODEL_FIXTURES), None)
        marked = item.get_closest_marker("model")
        group = (marked.args[0] if marked is not None else
                 name if isinstance(name, str) and name.startswith("make_") else fixture)
        if group is None and (model := named_model(item)) is not None:
            raise pytest.UsageError(f"{item.nodeid} builds {model} by name: mark it "
                                    f"@pytest.mark.model({model!r}) so that one worker builds it")
        item.add_marker(pytest.mark.xdist_group(group or item.path.name))
        if any(item.path.is_relative_to(ROOT / "tests" / tier) for tier in ("slow", "integration")):
            item.add_marker(pytest.mark.slow)  # the one rule: the tier decides, never a mark by hand


@pytest.fixture(scope="session", autouse=True)
def stack(request: pytest.FixtureRequest) -> None:
    """The stack is loaded, and the forkserver children fork from started, only for a session
    that has tests outside the torch-free unit tier."""
    if all(in_unit_tier(item) for item in request.session.items):
        return
    from qlint.run import collector
    from qlint.run.isolation import warm_up

    collector.own_the_process()  # a worker is the suite's process, as the command's is qlint's
    collector.freeze_the_stack()
    warm_up()  # children fork from a server that imports torch first: start it while tests run


@pytest.fixture(scope="session", autouse=True)
def isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tests never read or write the user's result cache."""
    folder = tmp_path_factory.mktemp("qlint-cache")
    os.environ["QLINT_CACHE_DIR"] = str(folder)
    return folder


@pytest.fixture(scope="session")
def quantized(program_store: Path) -> Callable[..., Any]:
    """`quantized("make_attention", int16=False, npu=None)` -> a quantized ExportedProgram, built once;
    with `npu` (an accelerator, `ethos-u55-128`), quantized for it as Arm's flow does, the ops
    `examples.npu.FLOAT_OPS` names for the factory left in float (a factory of `examples.npu` first,
    then of the CPU's examples).

    In memory for the session; on disk (`program_store`) for the next run, since quantizing is most
    of a large model's cost (the histogram observers' search: 4 minutes for MobileViT here)."""
    import torch

    from examples import models, npu, sam, zoo
    from qlint.loading.quantize import quantize

    cache: dict[tuple[str, bool, str | None], Any] = {}

    def build(name: str, int16: bool, accelerator: str | None) -> Any:
        module = next(m for m in ((npu,) if accelerator else ()) + (models, sam, zoo) if hasattr(m, name))
        model, example, calibration = getattr(module, name)()
        if accelerator:
            return npu_quantized(model, example, calibration, accelerator, npu.FLOAT_OPS.get(name, ()))
        config = None
        if int16:
            from executorch.backends.cortex_m.quantizer.quantization_configs import INT16_PER_TENSOR_CONFIG

            config = INT16_PER_TENSOR_CONFIG
        return quantize(model, example, calibration, config)

    def get(name: str, int16: bool = False, npu: str | None = None) -> Any:
        key = (name, int16, npu)
        if key not in cache:
            stored = program_store / f"{name}{'-int16' if int16 else ''}{'-' + npu_key(npu) if npu else ''}.pt2"
            if not stored.exists():
                program = relocated(build(*key), str(ROOT), CHECKOUT)
                temp = stored.with_name(f".{stored.name}.{os.getpid()}.tmp")  # two workers may race: rename wins
                torch.export.save(program, str(temp))
                temp.replace(stored)
            cache[key] = relocated(torch.export.load(str(stored)), CHECKOUT, str(ROOT))
        return cache[key]

    return get


def npu_key(accelerator: str) -> str:
    """An NPU program's name in the store: its accelerator and the code of the quantizer Arm's flow sets
    up (`ethos_u.quantizer`), so a change to that builds them again and nothing else."""
    import hashlib
    import inspect

    from qlint.loading import ethos_u

    return f"{accelerator}-{hashlib.sha256(inspect.getsource(ethos_u.quantizer).encode()).hexdigest()[:12]}"


def npu_quantized(model: Any, example: tuple[Any, ...], calibration: Any, accelerator: str,
                  float_ops: tuple[str, ...]) -> Any:
    """A model quantized for an Ethos-U as Arm's flow does, with `float_ops` (`aten.div.Tensor`) left in
    float as a user leaves them (`set_node_target(op, None)`)."""
    import functools

    import torch

    from qlint.loading import ethos_u
    from qlint.loading.quantize import export_float, quantize_graph
    from qlint.settings.npus import npu

    quantizer = ethos_u.quantizer(npu(accelerator))
    for name in float_ops:
        quantizer.set_node_target(functools.reduce(getattr, name.split("."), torch.ops), None)
    return quantize_graph(export_float(model, example), example, calibration, quantizer)


def relocated(program: Any, old: str, new: str) -> Any:
    """`program` with `old` replaced by `new` in every node's stack trace (where findings find the model
    source): stored programs name the checkout as CHECKOUT, so any clone reads them as its own."""
    import torch

    for module in program.graph_module.modules():
        if isinstance(module, torch.fx.GraphModule):
            for node in module.graph.nodes:
                if isinstance(node.meta.get("stack_trace"), str):
                    node.meta["stack_trace"] = node.meta["stack_trace"].replace(old, new)
    return program


def code_of(source: Path) -> bytes:
    """What of a module decides the programs it builds: its syntax tree without docstrings (and so
    without comments), so that a change to its prose builds nothing again. An example model's line
    numbers stay (the stored programs' stack traces, and the findings, name them); qlint's modules
    are keyed by their code alone."""
    import ast

    tree = ast.parse(source.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(
                getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str):
            body[0] = ast.Pass()
    return ast.dump(tree, include_attributes=source.parent.name == "examples").encode()


def cache_home() -> Path:
    """Where the suite keeps what it builds for the next run (programs, the corpus, crafted files)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


@pytest.fixture(scope="session")
def program_store() -> Path:
    """Quantized programs of earlier runs, under a folder keyed by the stack's versions and every
    source that decides them (the example models, quantize and the stack loader): a change to any
    of them builds afresh. The checkout's path in their stack traces is stored as CHECKOUT, so a
    fresh clone reuses them. Every program is read back from its file, whether just built or not,
    so a run with an empty store tests what a run with a full one does."""
    import hashlib
    from importlib import metadata

    sources = sorted([*(ROOT / "examples").glob("*.py"), ROOT / "qlint" / "loading" / "quantize.py",
                      ROOT / "qlint" / "loading" / "stack.py"])
    digest = hashlib.sha256(CHECKOUT.encode())  # programs stored with the checkout as CHECKOUT
    for source in sources:
        digest.update(source.relative_to(ROOT).as_posix().encode() + b"\0" + code_of(source))
    versions = "-".join(f"{name}{metadata.version(name)}" for name in STORE_VERSIONED)
    folder = cache_home() / "qlint-test-programs" / f"{versions}-{digest.hexdigest()[:16]}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def linted(quantized: Callable[..., Any]) -> Callable[..., Any]:
    """`linted("make_pool")` -> the model linted with the default config, lowered once per session.

    Lowering is most of a test's time; the result is only read (findings, the
    unfixed program to compare a fix against), never changed.
    """
    from qlint.full.lint import lint_program
    from qlint.settings.config import Config

    cache: dict[tuple[str, bool], Any] = {}

    def get(name: str, int16: bool = False) -> Any:
        if (name, int16) not in cache:
            cache[(name, int16)] = lint_program(quantized(name, int16), name, Config())
        return cache[(name, int16)]

    return get


@pytest.fixture(scope="session")
def fixed(quantized: Callable[..., Any], linted: Callable[..., Any]) -> Callable[..., Any]:
    """`fixed("make_pool")` -> `qlint.api.fix` of the model with the default config, verified on its
    example and 8 seeded batches; folds a copy of `linted(...)`'s lowered program, so nothing is lowered twice."""
    from qlint.api import fix

    cache: dict[tuple[str, bool], Any] = {}

    def get(name: str, int16: bool = False) -> Any:
        if (name, int16) not in cache:
            cache[(name, int16)] = fix(quantized(name, int16), artifact=name, linted=linted(name, int16))
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

    from qlint.device.memory import live_peak
    from qlint.full.lint import lint_program
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


@pytest.fixture(scope="session")
def sam_checked(sam_pt2: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], Path]:
    """`qlint check sam.pt2 --write model-explorer:FOLDER`: exit code, JSON report, and the overlay's folder
    (one lowering of SAM's .pt2 for the tests of its report and of its overlay)."""
    folder = tmp_path_factory.mktemp("sam-overlay")
    code, data = main_json(["check", str(sam_pt2), "--write", f"model-explorer:{folder}"])
    return code, data, folder


def cache_entry(entry: Path) -> Any:
    """What a result cache entry says (its JSON, after the signature line)."""
    return json.loads(entry.read_bytes().partition(b"\n")[2])


def rewrite_cache_entry(entry: Path, data: Any) -> None:
    """Replace an entry's contents and sign them with its folder's key, as qlint would have: what
    is read back is then decided by the contents alone."""
    from qlint.run.cache import KEY_FILE, seal

    folder = entry.parent.parent
    entry.write_bytes(seal((folder / KEY_FILE).read_bytes(), entry.stem, json.dumps(data).encode()))


def main_json(args: list[str]) -> tuple[int, dict[str, Any]]:
    """`qlint ARGS --output-format json` in this process: exit code and report. For fixtures wider than
    a test, which cannot take `capsys`."""
    import contextlib
    import io

    from qlint.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([*args, "--output-format", "json"])
    return code, json.loads(out.getvalue())


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from qlint.cli.main import main

    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def run_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code, out, _ = run_cli([*args, "--output-format", "json"], capsys)
    return code, json.loads(out)


# Runs qlint in a fresh interpreter and prints the heavy packages it imported (`HEAVY=torch,...`).
TORCH_PROBE = (
    "import sys\n"
    "from qlint.cli.main import main\n"
    "try:\n"
    "    code = main(sys.argv[1:])\n"
    "except SystemExit as exc:\n"
    "    code = exc.code\n"
    "heavy = sorted(m for m in ('torch', 'executorch', 'torchao') if m in sys.modules)\n"
    "print('HEAVY=' + ','.join(heavy))\n"
    "raise SystemExit(code)\n"
)


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


# ExecuTorch's own MLPerf Tiny DS-CNN keyword spotter (random weights) as a config target, NCHW
# (`make`) or channels_last (`make_channels_last`): the model the budget tests measure.
KWS = '''\
import torch
from executorch.examples.models.mlperf_tiny.ds_cnn import DSCNNKWS


class KeywordSpotter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dscnn = DSCNNKWS()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dscnn(x)


def make():
    torch.manual_seed(0)
    example = (torch.randn(1, 1, 49, 10),)
    return KeywordSpotter().eval(), example, [example]


def make_channels_last():
    model, example, _ = make()
    example = (example[0].contiguous(memory_format=torch.channels_last),)
    return model.to(memory_format=torch.channels_last), example, [example]
'''
