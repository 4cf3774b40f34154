"""ExecuTorch's own Cortex-M test cases as a differential corpus for qlint.

The wheel ships `backends/cortex_m/test/{ops,models}/test_*.py`, each with `McuTestCase`s that
ExecuTorch's maintainers chose to exercise its Cortex-M lowering. Quantized the way their tester
does and saved as `.pt2`, they are programs qlint must account for exactly as the stock flow
lowers them. An independent count of the fp32 ops in the stock-lowered graph is the reference.

Building takes minutes, so the `.pt2` files, the manifest of what was built or failed, and the
stock references are kept under a folder keyed by the stack's versions and a hash of the sources
that decide them (the test modules, their tester, this file): an unchanged stack never rebuilds.
The `.pte` the stock flow writes from each program (`to_executorch` on the lowering the reference
counts) is kept beside that folder (`pte_folder`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import io
import json
import os
import random
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from conftest import cache_home

SUBFOLDERS = ("ops", "models")
PACKAGE = "executorch.backends.cortex_m.test"
VERSIONED = ("torch", "executorch", "torchao")
_PASS_IN_ERROR = re.compile(r"when running the '(\w+)' pass")
SEED = 0  # what ExecuTorch's Cortex-M conftest seeds before each module import and each test

# Ops that only move or reinterpret data, by base name: floats passing through them are not
# computed. A dtype-changing copy is a conversion, and counts (see `_moves_data`).
DATA_MOVEMENT = {
    "view", "view_copy", "_unsafe_view", "reshape", "permute", "permute_copy", "transpose", "transpose_copy",
    "t", "t_copy", "clone", "_clone_dim_order", "contiguous", "expand", "expand_copy", "squeeze", "squeeze_copy",
    "unsqueeze", "unsqueeze_copy", "flatten", "unflatten", "slice", "slice_copy", "select", "select_copy",
    "alias", "alias_copy", "detach", "detach_copy", "split", "split_copy", "split_with_sizes",
    "split_with_sizes_copy", "unbind", "unbind_copy", "chunk", "cat", "stack", "getitem", "identity",
}
LAYOUT_COPIES = {"_to_copy", "_to_dim_order_copy", "to"}
NOT_COMPUTE = {"alloc", "_assert_tensor_metadata", "_assert_scalar", "sym_size", "sym_numel"}


class Case(NamedTuple):
    module: str            # the test module's stem, e.g. "test_add"
    name: str              # its key in the module's dict ("dict.key" outside `test_cases`)
    model: Any
    example_inputs: Any    # a tuple, or a callable returning one

    @property
    def stem(self) -> str:
        return f"{self.module}__{self.name}"


class Collected(NamedTuple):
    cases: list[Case]
    skipped: list[tuple[str, str]]   # (module or module:case, why it is not in the corpus)


@dataclasses.dataclass(frozen=True)
class Reference:
    """What the stock Cortex-M flow makes of one case: its fp32 compute ops, or why it raised; and
    why `to_executorch` could not serialize the lowered program, if it could not."""

    fp32_ops: dict[str, int]
    error: str | None = None
    pte_error: str | None = None


@dataclasses.dataclass(frozen=True)
class Corpus:
    folder: Path
    built: dict[str, Path]                # stem -> .pt2
    failed: dict[str, str]                # stem -> one-line error of quantization/export
    skipped: list[tuple[str, str]]
    cold: bool                            # built in this call (not read from the cache)


def cortex_m_test_folder() -> Path:
    spec = importlib.util.find_spec("executorch")
    assert spec is not None and spec.submodule_search_locations, "executorch is not installed"
    return Path(next(iter(spec.submodule_search_locations))) / "backends" / "cortex_m" / "test"


def module_files() -> list[Path]:
    root = cortex_m_test_folder()
    return sorted(p for sub in SUBFOLDERS for p in (root / sub).glob("test_*.py"))


def one_line(exc: BaseException) -> str:
    """The innermost error's first line (ExecuTorch's pass manager re-raises a pass's error inside
    its own), prefixed with the pass it names; for a fake-tensor failure, whose first line is
    generic, with the `Explanation:` line that names the real error."""
    chain = [exc]
    while (inner := chain[-1].__cause__ or chain[-1].__context__) is not None and inner not in chain:
        chain.append(inner)
    passes = [m[1] for e in chain if (m := _PASS_IN_ERROR.search(str(e)))]
    last = chain[-1]
    text = [line.strip() for line in str(last).strip().splitlines()]
    marked = [line.removeprefix("Explanation:").strip() for line in text if line.startswith("Explanation:")]
    explanation = marked[0] if marked else ""
    message = f"{type(last).__name__}: {text[0]}" if text else type(last).__name__
    message += f": {explanation}" if explanation else ""
    return f"{passes[0]}: {message}" if passes else message


def failed_pass(error: str) -> str | None:
    """The pass a `one_line` error names, if any."""
    head = error.split(":", 1)[0]
    return head if head.endswith("Pass") else None


def seed() -> None:
    """Seeded as ExecuTorch's Cortex-M conftest does, so random weights and inputs are theirs."""
    import torch

    random.seed(SEED)
    torch.manual_seed(SEED)


def _downloads_weights(source: str) -> bool:
    """A torchvision model built with pretrained weights would download them at import."""
    return "torchvision" in source and "_Weights." in source


def _cases_in(value: Any, path: str, found: dict[int, tuple[str, Any]], depth: int = 0) -> None:
    """Every McuTestCase reachable from a module-level value through dicts, sequences and
    dataclasses (ExecuTorch wraps some in a variant record), first path wins."""
    from executorch.backends.cortex_m.test.tester import McuTestCase

    if depth > 4:
        return
    if isinstance(value, McuTestCase):
        found.setdefault(id(value), (path, value))
    elif isinstance(value, dict):
        for key, item in value.items():
            _cases_in(item, f"{path}.{key}", found, depth + 1)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _cases_in(item, f"{path}.{index}", found, depth + 1)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            _cases_in(getattr(value, f.name), path, found, depth + 1)


def _case_name(path: str) -> str:
    """`test_cases.alpha` -> `alpha`; cases of other dicts keep the dict's name."""
    return path.removeprefix("test_cases.")


def collect() -> Collected:
    """Import every Cortex-M test module and gather its McuTestCases; a module that cannot be
    imported here (a missing extra, pretrained weights to download) is skipped with the reason."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    cases: list[Case] = []
    skipped: list[tuple[str, str]] = []
    stems = [p.stem for p in module_files()]
    assert len(stems) == len(set(stems)), f"two test modules share a stem: {stems}"
    for path in module_files():
        stem = path.stem
        if _downloads_weights(path.read_text()):
            missing = "torchvision is not installed; " if importlib.util.find_spec("torchvision") is None else ""
            skipped.append((stem, f"{missing}it builds a torchvision model with pretrained weights, a download"))
            continue
        seed()
        module = importing(stem, functools.partial(importlib.import_module, f"{PACKAGE}.{path.parent.name}.{stem}"),
                           skipped)
        if module is None:
            continue
        found: dict[int, tuple[str, Any]] = {}
        for attr, value in vars(module).items():
            if not attr.startswith("__"):
                _cases_in(value, attr, found)
        for case_path, case in found.values():
            name = _case_name(case_path)
            if case.model is None:
                skipped.append((f"{stem}:{name}", "no model (the test builds it from downloaded weights)"))
                continue
            cases.append(Case(stem, name, case.model, case.example_inputs))
    names = [c.stem for c in cases]
    assert len(names) == len(set(names)), "two cases share a file name"
    return Collected(cases, skipped)


def importing(stem: str, load: Callable[[], Any], skipped: list[tuple[str, str]]) -> Any | None:
    """`load()`: a test module imported, or what a case reads from it; None, with the reason added to
    `skipped`, when that cannot be done here (a missing extra, a module that skips itself, a failure)."""
    import pytest

    try:
        return load()
    except ImportError as exc:
        skipped.append((stem, f"missing extra: {one_line(exc)}"))
    except pytest.skip.Exception as exc:
        skipped.append((stem, f"skips itself: {exc.msg}"))
    except Exception as exc:
        skipped.append((stem, f"import failed: {one_line(exc)}"))
    return None


def quantize(case: Case) -> Any:
    """The quantized ExportedProgram the tester's Quantize and Export stages produce: strict export,
    prepare_pt2e with CortexMQuantizer, calibration on the example inputs, convert_pt2e with
    folded quantize, DuplicateDynamicQuantChainPass, strict export again."""
    import torch
    from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer
    from executorch.backends.transforms.duplicate_dynamic_quant_chain import DuplicateDynamicQuantChainPass
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    seed()
    inputs = case.example_inputs() if callable(case.example_inputs) else case.example_inputs
    model = case.model.eval()
    captured = torch.export.export(model, inputs, strict=True).module()
    prepared = prepare_pt2e(captured, CortexMQuantizer())
    prepared(*inputs)
    converted = convert_pt2e(prepared, fold_quantize=True)
    DuplicateDynamicQuantChainPass()(converted)
    return torch.export.export(converted, inputs, strict=True)


def build(cases: list[Case], folder: Path) -> dict[str, str]:
    """Quantize each case into `folder/<module>__<case>.pt2`; a case whose quantization or export
    raises is returned (stem -> one-line error), not fatal. Existing files are kept."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    failed: dict[str, str] = {}
    for case in cases:
        target = folder / f"{case.stem}.pt2"
        if target.exists():
            continue
        try:
            buffer = io.BytesIO()
            torch.export.save(quantize(case), buffer)
        except Exception as exc:
            failed[case.stem] = one_line(exc)
            continue
        with _temp_beside(target) as temp:
            temp.write_bytes(buffer.getvalue())
    return failed


@contextlib.contextmanager
def _temp_beside(target: Path) -> Iterator[Path]:
    """A file written in full, then renamed: a killed build leaves no half-written program."""
    handle, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(handle)
    temp = Path(name)
    try:
        yield temp
        temp.replace(target)
    finally:
        temp.unlink(missing_ok=True)


def _source_hash(functions: Sequence[Callable[..., Any]], *extra: str) -> str:
    digest = hashlib.sha256()
    for function in functions:
        digest.update(inspect.getsource(function).encode())
    for text in extra:
        digest.update(text.encode())
    return digest.hexdigest()[:16]


def cache_key() -> str:
    """The stack's versions and a hash of every source that decides which programs are built: the
    Cortex-M test folder (cases, tester) and the functions here that collect and quantize them."""
    root = cortex_m_test_folder()
    sources = [f"{p.relative_to(root)}\n{p.read_text()}" for p in sorted(root.rglob("*.py"))]
    functions: list[Callable[..., Any]] = [
        collect, _cases_in, _case_name, _downloads_weights, seed, quantize, build, one_line,
    ]
    versions = "-".join(f"{name}{importlib.metadata.version(name)}" for name in VERSIONED)
    return f"{versions}-{_source_hash(functions, str(SEED), *sources)}"


def cache_root() -> Path:
    return cache_home() / "qlint-test-corpus"


def corpus(root: Path | None = None) -> Corpus:
    """The built corpus: read from `root/<key>/manifest.json` when present, else collected,
    built and recorded there (the manifest last, so a killed build is resumed, not trusted)."""
    folder = (root or cache_root()) / cache_key()
    manifest = folder / "manifest.json"
    cold = not manifest.exists()
    if cold:
        collected = collect()
        failed = build(collected.cases, folder)
        record = {
            "built": sorted(c.stem for c in collected.cases if c.stem not in failed),
            "failed": failed,
            "skipped": collected.skipped,
        }
        with _temp_beside(manifest) as temp:
            temp.write_text(json.dumps(record, indent=1))
    record = json.loads(manifest.read_text())
    return Corpus(
        folder,
        {stem: folder / f"{stem}.pt2" for stem in record["built"]},
        dict(record["failed"]),
        [tuple(s) for s in record["skipped"]],
        cold,
    )


# --- the stock-flow reference -------------------------------------------------------------------


def op_label(node: Any) -> str:
    """`aten.add.Tensor`, `cortex_m.softmax.default`: namespace, name and overload of a node's op,
    with the edge dialect's wrapper taken off."""
    import torch

    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        target = getattr(target, "_op", target)  # an EdgeOpOverload wraps the aten one
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._opname}.{target._overloadname}"
    return getattr(target, "__name__", str(target))


def _base(label: str) -> str:
    parts = label.split(".")
    return parts[1] if len(parts) >= 3 else parts[-1]


def _tensors(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _floats(value: Any) -> bool:
    return any(t.is_floating_point() for t in _tensors(value))


def _is_quant(label: str) -> bool:
    namespace, base = label.split(".")[0], _base(label)
    return namespace in ("quantized_decomposed", "cortex_m") and (
        base.startswith("quantize_per_") or base.startswith("dequantize_per_")
    )


def _moves_data(node: Any, label: str) -> bool:
    """Shape and data-movement ops; a copy that changes the dtype converts, so it computes."""
    base = _base(label)
    if base in DATA_MOVEMENT:
        return True
    if base in LAYOUT_COPIES:
        out = _tensors(node.meta.get("val"))
        ins = [t for a in node.all_input_nodes for t in _tensors(a.meta.get("val"))]
        return bool(out and ins) and out[0].dtype == ins[0].dtype
    return False


def fp32_compute_ops(graph: Any) -> Counter[str]:
    """The call_function nodes that compute in floating point: no quantize/dequantize, no shape or
    data movement, and a floating-point output or input (read from `meta["val"]`)."""
    found: Counter[str] = Counter()
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        label = op_label(node)
        if _is_quant(label) or _base(label) in NOT_COMPUTE or _moves_data(node, label):
            continue
        values = [node.meta.get("val"), *(a.meta.get("val") for a in node.all_input_nodes)]
        if any(_floats(v) for v in values):
            found[label] += 1
    return found


def stock_lower(program: Any) -> Any:
    """The tester's CortexMToEdgeTransformAndLower: `to_edge` with the Cortex-M compile config, then
    CortexMPassManager's default pass list for a Cortex-M55."""
    from executorch.backends.cortex_m.edge_compile_config import cortex_m_edge_compile_config
    from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager
    from executorch.backends.cortex_m.target_config import CortexM, CortexMTargetConfig
    from executorch.exir import to_edge

    edge = to_edge(program, compile_config=cortex_m_edge_compile_config())
    manager = CortexMPassManager(edge.exported_program(), target_config=CortexMTargetConfig(cpu=CortexM.M55))
    return manager.transform()


def write_pte(lowered: Any, target: Path) -> str | None:
    """The stock flow's last step: `to_executorch` on the lowered program (which it rewrites in
    place), its buffer written to `target`; the one-line error when ExecuTorch cannot serialize it."""
    from executorch.backends.cortex_m.edge_compile_config import cortex_m_edge_compile_config
    from executorch.exir import EdgeProgramManager

    try:
        manager = EdgeProgramManager({"forward": lowered}, compile_config=cortex_m_edge_compile_config())
        buffer = manager.to_executorch().buffer
    except Exception as exc:
        return one_line(exc)
    with _temp_beside(target) as temp:
        temp.write_bytes(buffer)
    return None


def reference(path: Path, pte: Path) -> Reference:
    """The stock flow's reference for one `.pt2`, and its `.pte` written to `pte`."""
    import executorch.backends.cortex_m.quantizer.quantizer  # noqa: F401  (registers cortex_m ops)
    import torch
    import torchao.quantization.pt2e.quantize_pt2e  # noqa: F401  (registers quantized_decomposed ops)

    program = torch.export.load(str(path))
    try:
        lowered = stock_lower(program)
    except Exception as exc:
        return Reference({}, one_line(exc))
    fp32_ops = dict(fp32_compute_ops(lowered.graph_module.graph))  # before to_executorch rewrites it
    return Reference(fp32_ops, pte_error=write_pte(lowered, pte))


def pte_folder(folder: Path) -> Path:
    """Where the stock flow's `.pte` of each case is kept: beside the corpus's keyed `folder` (a
    `qlint check` of that folder does not walk into it)."""
    return folder.with_name(f"{folder.name}-pte")


def ptes(built: Corpus, refs: dict[str, Reference]) -> dict[str, Path]:
    """stem -> the `.pte` the stock flow wrote, for every case it lowered and serialized."""
    folder = pte_folder(built.folder)
    return {stem: folder / f"{stem}.pte" for stem, ref in sorted(refs.items())
            if ref.error is None and ref.pte_error is None}


def references(built: Corpus, progress: Callable[[str], None] | None = None) -> dict[str, Reference]:
    """The stock reference of every built case, and its `.pte`, cached beside the corpus under a
    hash of the functions that lower, count and serialize (a change to them recomputes both)."""
    functions: list[Callable[..., Any]] = [
        reference, write_pte, stock_lower, fp32_compute_ops, _moves_data, _is_quant, _floats, _tensors, op_label,
        one_line,
    ]
    labels = repr(sorted(DATA_MOVEMENT | LAYOUT_COPIES | NOT_COMPUTE))
    cached = built.folder / f"references-{_source_hash(functions, labels)}.json"
    if cached.exists():
        data = {stem: Reference(**ref) for stem, ref in json.loads(cached.read_text()).items()}
        if set(data) == set(built.built) and all(path.exists() for path in ptes(built, data).values()):
            return data
    folder = pte_folder(built.folder)
    folder.mkdir(parents=True, exist_ok=True)
    result = {}
    for stem, path in sorted(built.built.items()):
        if progress:
            progress(stem)
        result[stem] = reference(path, folder / f"{stem}.pte")
    with _temp_beside(cached) as temp:
        temp.write_text(json.dumps({s: dataclasses.asdict(r) for s, r in result.items()}, indent=1))
    for stale in built.folder.glob("references-*.json"):
        if stale != cached:
            stale.unlink(missing_ok=True)
    return result


@functools.cache
def float_folder(root: Path | None = None) -> Path:
    """Where `float_export` keeps its exports: beside the corpus's keyed folder, under a hash of the
    function (the key reads every test source: computed once a process, not once a case)."""
    return (root or cache_root()) / f"{cache_key()}-float-{_source_hash([float_export, seed])}"


def float_export(case: Case) -> Any:
    """`case`'s float model exported the tester's way (strict, seeded), or None if it does not export;
    kept beside the corpus under a hash of this function (a `.failed` marker for one that does not),
    since the 282 strict exports are most of what comparing conditions with ExecuTorch's checks costs."""
    import torch

    folder = float_folder()
    target, failed = folder / f"{case.stem}.pt2", folder / f"{case.stem}.failed"
    if target.exists():
        return torch.export.load(str(target))
    if failed.exists():
        return None
    folder.mkdir(parents=True, exist_ok=True)
    seed()
    inputs = case.example_inputs() if callable(case.example_inputs) else case.example_inputs
    try:
        exported = torch.export.export(case.model.eval(), inputs, strict=True)
        buffer = io.BytesIO()
        torch.export.save(exported, buffer)
    except Exception:
        failed.touch()
        return None
    with _temp_beside(target) as temp:
        temp.write_bytes(buffer.getvalue())
    return exported


def clear(root: Path | None = None) -> None:
    """Remove the cached corpus of the current key and its `.pte` files (to time a cold build)."""
    folder = (root or cache_root()) / cache_key()
    shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(pte_folder(folder), ignore_errors=True)
    shutil.rmtree(float_folder(root), ignore_errors=True)
