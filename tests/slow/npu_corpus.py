"""ExecuTorch's own Arm Ethos-U tests as a differential corpus for qlint's NPU lowering.

The wheel ships `backends/arm/test/{models,ops}/test_*.py`: the models and example inputs Arm's
maintainers run through their Ethos-U pipelines. Each case here is one of them, read from its module
as its Ethos-U test reads it (`MODELS`, `OPS`: which class, which data, nothing copied), quantized
with qlint's NPU quantizer for each NPU, lowered with `ethos_u.lower` (Vela compiles each
partition) and serialized by `to_executorch`. The `.pte` is the reference: its plan's DelegateCall
instructions and the CPU kernel calls around them are what the device runs.

Building runs Vela for every case and NPU, so the `.pt2` and `.pte` files and the manifest of what
was built, failed or skipped are kept under a folder keyed by the stack's versions (Vela's among
them) and a hash of every source that decides them: the Arm test modules read, this file, and
qlint's quantizer and lowering. An unchanged stack never rebuilds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.metadata
import importlib.util
import io
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import executorch_corpus as corpus_lib
from conftest import ROOT, code_of

PACKAGE = "executorch.backends.arm.test"
NPUS = ("ethos-u55-128", "ethos-u85-256")
VERSIONED = ("torch", "executorch", "torchao", "ethos-u-vela")
# qlint's sources that decide the built programs and their `.pte`: the quantizer and the lowering.
QLINT_SOURCES = ("qlint/loading/quantize.py", "qlint/loading/ethos_u.py", "qlint/loading/stack.py",
                 "qlint/loading/speedups.py", "qlint/settings/npus.py")

Recipe = Callable[[Any], tuple[Any, tuple[Any, ...]]]  # the imported test module -> (model, example inputs)


def _swap(pair: tuple[Any, Any]) -> tuple[Any, tuple[Any, ...]]:
    """`(inputs, model)`, as `test_layer_norm`'s suite gives them, as `(model, inputs)`."""
    return pair[1], pair[0]


def _called(module: Any) -> tuple[Any, tuple[Any, ...]]:
    """A test module instance that makes its own inputs (`get_inputs`), as Arm's tests pass it."""
    return module, module.get_inputs()


# The six model tests of `test/models`, each as its Ethos-U test builds it; None: the test builds the
# model from pretrained weights it downloads (the reason is recorded when the module is skipped).
MODELS: dict[str, Recipe | None] = {
    "test_ds_cnn": lambda m: (m.model, m.model_inputs),
    "test_resnet8": lambda m: (m.model, m.model_inputs),
    "test_deit_tiny_arm": None,  # a fixture: timm's deit_tiny_patch16_224(pretrained=True)
    "test_lstm_arm": lambda m: (m.TestLSTM.lstm, m.TestLSTM.model_example_inputs),
    "test_conformer": lambda m: (m.TestConformer.conformer, m.TestConformer.model_example_inputs),
    # the U55 test's variant: the default waveform one has a stride U55 does not take
    "test_w2l_arm": lambda m: (m.TestW2L.create_model("power_spectrum"), m.TestW2L.model_example_inputs),
}

# Ten op cases of `test/ops`, each a case of the module's Ethos-U INT test (`test_<op>_u55_INT` and
# the like), built the way that test builds it: small inputs, and ops that split, fall back or not.
OPS: dict[tuple[str, str], Recipe] = {
    ("test_add", "Add2.4d_randn_1"): lambda m: (m.Add2(), m.Add2.test_data["4d_randn_1"]()),
    ("test_conv2d", "two_conv2d"): lambda m: _called(m.test_data_INT["two_conv2d,per_channel_quant=True"]()[0]),
    ("test_conv2d", "reject_suite.large_stride"): lambda m: _called(m.reject_suite["large_stride"]()),
    ("test_softmax", "Softmax.rand"): lambda m: (lambda d: (m.Softmax(d[1]), d[0]))(m.Softmax.test_data["rand"]()),
    ("test_layer_norm", "randn_last_dim"): lambda m: _swap(m.test_data_suite["randn_last_dim"]()),
    ("test_hardswish", "rand"): lambda m: (m.Hardswish(), (m.test_data_suite["rand"](),)),
    ("test_gelu", "Gelu.rand_none"): lambda m: (lambda d: (m.Gelu(d[0]), (d[1],)))(m.Gelu.test_data["rand_none"]()),
    ("test_linear", "model_linear_rank2_zeros"): lambda m: (
        lambda d: (m.Linear(d[0].shape[-1], d[1], d[2]), (d[0],)))(
        m.test_data_rank2_INT["model_linear_rank2_zeros,per_channel_quant=True"]()),
    ("test_max_pool", "zeros"): lambda m: (lambda d: (m.MaxPool2d(*d[1]), (d[0],)))(m.test_data_suite["zeros"]()),
    ("test_where", "two_dim_tensor_cond"): lambda m: _called(m.test_modules_INT["two_dim_tensor_cond"]()),
}


class Case(NamedTuple):
    stem: str              # the file name of its programs: `test_ds_cnn`, `test_add__Add2.4d_randn_1`
    model: Any
    example_inputs: tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class Corpus:
    folder: Path
    built: dict[str, dict[str, Path]]     # npu -> stem -> quantized `.pt2`
    ptes: dict[str, dict[str, Path]]      # npu -> stem -> the `.pte` of its Ethos-U lowering
    failed: dict[str, dict[str, str]]     # npu -> stem -> one-line error of quantizing, lowering or serializing
    skipped: list[tuple[str, str]]        # (module, why it is not in the corpus)
    cold: bool


def test_folder() -> Path:
    spec = importlib.util.find_spec("executorch")
    assert spec is not None and spec.submodule_search_locations, "executorch is not installed"
    return Path(next(iter(spec.submodule_search_locations))) / "backends" / "arm" / "test"


def _module_path(stem: str) -> Path:
    sub = "models" if stem in MODELS else "ops"
    return test_folder() / sub / f"{stem}.py"


def _stem(module: str, name: str) -> str:
    return f"{module}__{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}"


def _recipes() -> list[tuple[str, str, Recipe | None]]:
    """(module, case stem, recipe) of every case, models first."""
    return [*((m, m, r) for m, r in MODELS.items()), *((m, _stem(m, n), r) for (m, n), r in OPS.items())]


def collect() -> tuple[list[Case], list[tuple[str, str]]]:
    """Import each Arm test module named (seeded as Arm's conftest seeds, with 0) and read its case;
    a module that cannot be imported here, or whose model is downloaded, is skipped with the reason."""
    cases: list[Case] = []
    skipped: list[tuple[str, str]] = []
    for module, stem, recipe in _recipes():
        if recipe is None:
            missing = [n for n in ("timm", "torchvision") if importlib.util.find_spec(n) is None]
            prefix = f"{' and '.join(missing)} not installed; " if missing else ""
            skipped.append((module, f"{prefix}its model is built from pretrained weights, a download"))
            continue
        corpus_lib.seed()
        name = f"{PACKAGE}.{'models' if module in MODELS else 'ops'}.{module}"
        read = corpus_lib.importing(module, lambda r=recipe, n=name: r(importlib.import_module(n)), skipped)
        if read is not None:
            model, inputs = read
            cases.append(Case(stem, model, tuple(inputs)))
    return cases, skipped


def _build_one(case: Case, accelerator: str, folder: Path) -> str | None:
    """Quantize `case` for `accelerator` into `folder/<stem>.pt2`, lower it as Arm's flow does and
    write its `.pte` beside; the one-line error when a step raises (the `.pt2` kept if it was made)."""
    import contextlib

    import torch

    from qlint.loading import ethos_u
    from qlint.loading.quantize import quantize
    from qlint.settings.npus import npu

    target = npu(accelerator)
    corpus_lib.seed()
    try:
        program = quantize(case.model, case.example_inputs, npu=target)
        buffer = io.BytesIO()
        torch.export.save(program, buffer)
    except Exception as exc:
        return f"quantize: {corpus_lib.one_line(exc)}"
    with corpus_lib._temp_beside(folder / f"{case.stem}.pt2") as temp:
        temp.write_bytes(buffer.getvalue())
    try:
        lowering = ethos_u.lower(program, target)
        with contextlib.redirect_stdout(io.StringIO()):
            data = bytes(lowering.edge.to_executorch().buffer)
    except Exception as exc:
        return f"lower: {corpus_lib.one_line(exc)}"
    with corpus_lib._temp_beside(folder / f"{case.stem}.pte") as temp:
        temp.write_bytes(data)
    return None


def cache_key() -> str:
    """The stack's versions and a hash of the sources that decide what is built: the Arm test modules
    read, this file (the recipes), qlint's quantizer and lowering; qlint's by their code alone
    (`code_of`: a docstring or comment changes nothing built)."""
    digest = hashlib.sha256(Path(__file__).read_text().encode())
    for path in (_module_path(module) for module, _, _ in _recipes()):
        digest.update(path.name.encode() + (path.read_bytes() if path.exists() else b""))
    for path in (ROOT / s for s in QLINT_SOURCES):
        digest.update(path.name.encode() + code_of(path))
    versions = "-".join(f"{name}{importlib.metadata.version(name)}" for name in VERSIONED)
    return f"{versions}-{digest.hexdigest()[:16]}"


def cache_root() -> Path:
    return corpus_lib.cache_root().with_name("qlint-test-npu-corpus")


def corpus(root: Path | None = None, progress: Callable[[str], None] | None = None) -> Corpus:
    """The built corpus: read from `root/<key>/manifest.json` when present, else collected, built
    for every NPU and recorded there (the manifest last, so a killed build is resumed, not trusted)."""
    folder = (root or cache_root()) / cache_key()
    manifest = folder / "manifest.json"
    cold = not manifest.exists()
    if cold:
        cases, skipped = collect()
        failed: dict[str, dict[str, str]] = {}
        for accelerator in NPUS:
            (folder / accelerator).mkdir(parents=True, exist_ok=True)
            for case in cases:
                if progress:
                    progress(f"{accelerator} {case.stem}")
                error = _build_one(case, accelerator, folder / accelerator)
                if error is not None:
                    failed.setdefault(accelerator, {})[case.stem] = error
        record = {"cases": [c.stem for c in cases], "failed": failed, "skipped": skipped}
        with corpus_lib._temp_beside(manifest) as temp:
            temp.write_text(json.dumps(record, indent=1))
    record = json.loads(manifest.read_text())
    built = {a: {s: folder / a / f"{s}.pt2" for s in record["cases"] if (folder / a / f"{s}.pt2").exists()}
             for a in NPUS}
    ptes = {a: {s: folder / a / f"{s}.pte" for s in record["cases"] if (folder / a / f"{s}.pte").exists()}
            for a in NPUS}
    return Corpus(folder, built, ptes, {a: dict(record["failed"].get(a, {})) for a in NPUS},
                  [(m, why) for m, why in record["skipped"]], cold)


# --- the reference: what the `.pte` runs ----------------------------------------------------------

NPU = "NPU"  # a DelegateCall in a run sequence


class Step(NamedTuple):
    """One instruction of a plan that runs something: its label and the values it reads and writes."""

    label: str                 # NPU, or `namespace.name` of a KernelCall
    reads: frozenset[int]
    writes: frozenset[int]


def _plain(namespace: str, name: str) -> str:
    """`aten.add`, `cortex_m.quantize_per_tensor`: an op's namespace and base name, as both sides spell it."""
    return f"{namespace}.{name}"


def _expanded(plan: Any, indices: list[int]) -> set[int]:
    """The values `indices` name, a TensorList's items with it."""
    found = set(indices)
    for index in indices:
        items = getattr(plan.values[index].val, "items", None)
        if items is not None:
            found.update(items)
    return found


def _out_positions(name: str, overload: str, count: int) -> set[int]:
    """The arguments a KernelCall writes: its schema's out arguments (the emitter passes every schema
    argument in order); the last when the operator is not registered with torch here."""
    import torch

    try:
        schema = getattr(getattr(getattr(torch.ops, name.split("::")[0]), name.split("::")[1]),
                         overload or "default")._schema
    except (AttributeError, RuntimeError):
        return {count - 1}
    if len(schema.arguments) != count:
        return {count - 1}
    return {i for i, a in enumerate(schema.arguments)
            if a.is_out or (a.alias_info is not None and a.alias_info.is_write)}


def plan_steps(data: bytes) -> list[Step]:
    """The instructions of a `.pte`'s plan that run something, in order, read by ExecuTorch's
    deserializer: NPU for each DelegateCall, `namespace.name` for each KernelCall (moves, frees and
    jumps left out), each with the values it reads and writes. A DelegateCall's arguments are its
    inputs then its outputs: an argument a plan input, a constant or written by an earlier instruction
    is read, the others written."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    plan = deserialize_pte_binary(data).program.execution_plan[0]
    written = set(plan.inputs)
    steps = []
    for instruction in plan.chains[0].instructions:
        call, kind = instruction.instr_args, type(instruction.instr_args).__name__
        if kind == "DelegateCall":
            given = {i for i in call.args if i in written or getattr(plan.values[i].val, "data_buffer_idx", 0) > 0}
            reads = _expanded(plan, [i for i in call.args if i in given])
            writes = _expanded(plan, [i for i in call.args if i not in given])
            label = NPU
        elif kind == "KernelCall":
            operator = plan.operators[call.op_index]
            outs = _out_positions(operator.name, operator.overload, len(call.args))
            reads = _expanded(plan, [a for i, a in enumerate(call.args) if i not in outs])
            writes = _expanded(plan, [a for i, a in enumerate(call.args) if i in outs])
            namespace, _, name = operator.name.partition("::")
            label = _plain(namespace, name)
        else:
            continue
        written |= writes
        steps.append(Step(label, frozenset(reads), frozenset(writes)))
    return steps


def _between(steps: list[Step]) -> list[bool]:
    """For each step, whether it reads what a DelegateCall wrote (directly or through other steps) and
    writes what a later DelegateCall reads (likewise): the data flow of the plan, in both directions."""
    def reached(order: list[Step], source: Callable[[Step], frozenset[int]],
                sink: Callable[[Step], frozenset[int]]) -> list[bool]:
        tainted: set[int] = set()
        found = []
        for step in order:
            found.append(bool(source(step) & tainted))
            if step.label == NPU or found[-1]:
                tainted |= sink(step)
        return found

    after = reached(steps, lambda s: s.reads, lambda s: s.writes)
    before = reached(steps[::-1], lambda s: s.writes, lambda s: s.reads)[::-1]
    return [a and b for a, b in zip(after, before, strict=True)]


def cpu_compute(steps: list[Step]) -> list[str]:
    """A plan's delegate calls, the CPU kernels that compute (not quantize, dequantize or data movement:
    the Cortex-M corpus's lists) and the data movement between two delegate calls in data flow, which
    splits the NPU's work as compute does."""
    def moves(op: str) -> bool:
        return op.split(".", 1)[-1] in corpus_lib.DATA_MOVEMENT

    def ignored(op: str) -> bool:
        base = op.split(".", 1)[-1]
        return base in corpus_lib.NOT_COMPUTE or base.startswith(("quantize_per_", "dequantize_per_"))

    return [step.label for step, between in zip(steps, _between(steps), strict=True)
            if step.label == NPU or not (ignored(step.label) or (moves(step.label) and not between))]
