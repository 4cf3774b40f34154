"""The static tier against the full check: the same QL001/QL004 findings on every `.pt2` of the
test suite, the same identity verdicts bit for bit, and no torch."""

from __future__ import annotations

import functools
import json
import math
import operator
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

from examples.zoo import ZOO
from qlint.rules import builders
from qlint.settings.config import Config, FoldGuards
from qlint.static.float32 import every_output
from qlint.static.rules import lint_static

HAND_MADE = [
    "make_attention", "make_attention_mul", "make_multi_head", "make_pool", "make_constant_first",
    "make_runtime_divisor", "make_norm", "make_scale", "make_scale_into_concat", "make_half_into_concat",
    "make_scale_through_reshape", "make_scale_through_transpose", "make_split_island",
    "make_half_precision_island", "make_per_channel_scale", "make_uniform_vector_scale", "make_scale_chain",
    "make_masked_attention", "make_causal_attention", "make_conv_hardswish", "make_conv_hardswish_channels_last",
    "make_clamp", "make_transformer_encoder", "make_mask_input_attention", "make_levit_attention",
    "make_levit_attention_trained",
]
# The hand-made cases, then the zoo (SAM's TwoWayTransformer among them), each once.
CORPUS = list(dict.fromkeys([*HAND_MADE, *(f"make_{name}" for name in ZOO)]))
# Those with no constant scale island or requantize pair the full check evaluates: nothing to emulate.
WITHOUT_REGIONS = {
    "make_constant_first", "make_runtime_divisor", "make_norm", "make_scale_through_transpose", "make_split_island",
    "make_half_precision_island", "make_per_channel_scale", "make_uniform_vector_scale", "make_conv_hardswish",
    "make_conv_hardswish_channels_last", "make_clamp", "make_transformer_encoder", "make_convnext", "make_resnet",
    "make_resnet_channels_last", "make_mobilenet", "make_mobilenet_channels_last",
}


def by_value(finding: Any) -> bool:
    """A QL002 island whose one reason is a constant's value (zero, not finite): the static tier,
    which computes the value, decides it too (`rules.steps.BY_VALUE`)."""
    return re.fullmatch(r"constant \S+ is (zero or )?not finite", finding.details["reason"]) is not None


def island(finding: Any) -> tuple[Any, ...]:
    """Which island or pair a finding is, as both tiers name it: code, the nodes (as the .pt2 names
    them), the fp32 elements and the source line."""
    details = finding.details
    where = (finding.location.path, finding.location.line) if finding.location else None
    return finding.code, tuple(sorted(details["graph_nodes"])), details.get("fp32_elements"), where


def key(finding: Any) -> tuple[Any, ...]:
    """What the two tiers must agree on: the island, the constants, both qparams, the identity verdict
    and the message, to the letter (both say it through `rules.builders`); the full check's message then
    ends with the island's time, which the static tier does not estimate."""
    details = finding.details
    constants = tuple((c["op"], c["value"]) for c in details.get("constants", ()))
    message = finding.message
    if "cycles" in details:
        priced = "; " + builders.time_clause_of(details)
        assert message.endswith(priced), message
        message = message.removesuffix(priced)
    if finding.code == "QL002":  # an island a constant's value keeps in fp32: its reason
        return (*island(finding), details["reason"], message)
    return (*island(finding), constants, json.dumps(details["input_qparams"], sort_keys=True),
            json.dumps(details["output_qparams"], sort_keys=True), details["identity"], message)


@pytest.mark.parametrize("name", CORPUS)
def test_static_findings_equal_the_full_checks(name: str, linted: Callable[..., Any],
                                               pt2_dir: Callable[[str], Path]) -> None:
    """Decided findings equal to the letter; an undecided one (a constant the static tier cannot
    compute) agrees with the full check's finding on the same island of the same code, whatever its
    identity verdict."""
    checked = lint_static(pt2_dir(name).read_bytes(), name, Config())
    static, [stats] = checked.findings, checked.stats
    undecided = sorted(island(f) for f in static if "undecided" in f.details)
    full = [f for f in linted(name).findings
            if f.code in ("QL001", "QL004") or f.code == "QL002" and (island(f) in undecided or by_value(f))]
    assert sorted(key(f) for f in static if "undecided" not in f.details) == sorted(
        key(f) for f in full if island(f) not in undecided)
    assert undecided == sorted(island(f) for f in full if island(f) in undecided)
    assert stats.static and stats.fp32_islands == sum(1 for f in full if f.code != "QL004")


# An island of each op kind QL001 accepts, alone and together, between two quantized linears.
ISLAND_KINDS: dict[str, Callable[[Any], Any]] = {
    "add": lambda h: h + 0.5, "sub": lambda h: h - 0.25, "mul": lambda h: h * 0.5, "div": lambda h: h / 4.0,
    "add_then_div": lambda h: (h + 0.5) / 2.0, "mul_then_sub": lambda h: h * 2.0 - 1.0,
}


@pytest.mark.parametrize("kind", list(ISLAND_KINDS))
def test_both_tiers_decide_an_island_of_each_op_kind(kind: str, tmp_path: Path) -> None:
    """`fc(fc(x) + 0.5)` and its kin: the full check's QL001, found by the static tier too, to the letter
    (an island of offsets alone once passed the static tier unseen)."""
    import torch

    from qlint.full.lint import lint_program
    from qlint.loading.quantize import quantize

    class Between(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

        def forward(self, x: Any) -> Any:
            return self.fc2(ISLAND_KINDS[kind](self.fc1(x)))

    torch.manual_seed(0)
    example = (torch.randn(1, 16),)
    program = quantize(Between().eval(), example, [(torch.randn(1, 16),) for _ in range(4)])
    torch.export.save(program, str(tmp_path / "m.pt2"))
    static = lint_static((tmp_path / "m.pt2").read_bytes(), "m", Config()).findings
    full = [f for f in lint_program(program, "m", Config()).findings if f.code in ("QL001", "QL004")]
    assert [f.code for f in full].count("QL001") == 1, [f.message for f in full]
    assert sorted(key(f) for f in static) == sorted(key(f) for f in full)


@functools.cache
def scaled_by_a_buffer(op: str) -> Any:
    """`x op c`, c a one-element buffer of 2 (no calibration runs through a NaN), quantized once."""
    import torch

    from qlint.loading.quantize import quantize

    class ByBuffer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("c", torch.full((1,), 2.0))

        def forward(self, x: Any) -> Any:
            return getattr(operator, {"div": "truediv"}.get(op, op))(x, self.c)

    torch.manual_seed(0)
    return quantize(ByBuffer().eval(), (torch.randn(1, 8, 16),), [(torch.randn(1, 8, 16),) for _ in range(4)])


@pytest.mark.parametrize("value", [0.0, math.nan, math.inf, -math.inf], ids=["zero", "nan", "inf", "-inf"])
@pytest.mark.parametrize("op", ["mul", "div", "add", "sub"])
def test_both_tiers_decide_an_island_whose_constant_is_zero_nan_or_infinite(op: str, value: float,
                                                                           tmp_path: Path) -> None:
    """The full check's QL002 of a scale by zero, NaN or an infinity (an offset by NaN or an infinity),
    said by the static tier to the letter; an offset of zero is an identity (QL001) in both."""
    import torch

    from qlint.full.lint import lint_program

    program = scaled_by_a_buffer(op)
    [name] = [n for n, t in program.state_dict.items() if t.numel() == 1]
    program.state_dict[name] = torch.full((1,), value)
    torch.export.save(program, str(tmp_path / "m.pt2"))
    static = lint_static((tmp_path / "m.pt2").read_bytes(), "m", Config()).findings
    full = [f for f in lint_program(torch.export.load(str(tmp_path / "m.pt2")), "m", Config()).findings
            if f.code in ("QL001", "QL002", "QL004")]
    expected = "QL001" if op in ("add", "sub") and value == 0.0 else "QL002"
    assert [f.code for f in static] == [expected] and sorted(key(f) for f in static) == sorted(key(f) for f in full)
    if expected == "QL002":
        unfit = "not finite" if op in ("add", "sub") else "zero or not finite"
        assert static[0].details["reason"] == f"constant {name} is {unfit}"


@pytest.mark.parametrize("name", CORPUS)
def test_emulated_float32_equals_torch_on_every_input_integer(name: str, linted: Callable[..., Any]) -> None:
    """Every constant scale island and requantize pair the full check evaluates with torch, every
    integer of its input dtype: `qlint.static.float32` gives the same output integer."""
    compared = 0
    for region in linted(name).analysis.regions:
        exhaustive = region.exhaustive()
        if region.code not in ("QL001", "QL004") or exhaustive is None:
            continue
        qp_in = region.qp_in
        steps = [(s.op, s.value) for s in region.scale.steps] if region.scale else []
        for out, by_torch in exhaustive.outputs.items():
            emulated, nan = every_output(qp_in, steps, region.view.qparams(out))
            assert not nan.any() and emulated.tolist() == by_torch.tolist(), (name, region.anchor.name)
        compared += 1
    # Each program it covers had a region to compare; one listed as without has none.
    assert (compared > 0) == (name not in WITHOUT_REGIONS), compared


def example_program() -> tuple[dict[str, bytes], str, dict[str, Any]]:
    """The attention example's archive entries, the name of its program entry and that program, to craft from."""
    import zipfile

    with zipfile.ZipFile(ROOT / "examples" / "attention.pt2") as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    [model] = [name for name in entries if name.endswith("models/model.json")]
    return entries, model, json.loads(entries[model])


def archive_with(entries: dict[str, bytes], model: str, program: dict[str, Any]) -> bytes:
    """The archive of `entries` with `program` in place of its own; a crafted node's output
    without tensor metadata is declared like the example's input `q`."""
    from qlint.io.archive import write_zip

    graph = program["graph_module"]["graph"]
    tensors = graph["tensor_values"]
    for node in graph["nodes"]:
        outputs = node.get("outputs") if isinstance(node, dict) else None
        for output in outputs if isinstance(outputs, list) else []:
            tensor = output.get("as_tensor") if isinstance(output, dict) else None
            name = tensor.get("name") if isinstance(tensor, dict) else None
            if isinstance(name, str):
                tensors.setdefault(name, dict(tensors["q"]))
    return write_zip({**entries, model: json.dumps(program).encode()})


def unary(op: str, name: str, source: str) -> dict[str, Any]:
    """A serialized node `name = op(source)`, `op` as `aten.neg.default`."""
    return {"target": f"torch.ops.{op}", "name": name, "metadata": {},
            "inputs": [{"name": "self", "arg": {"as_tensor": {"name": source}}, "kind": 1}],
            "outputs": [{"as_tensor": {"name": name}}]}


UNIMPORTABLE = ("torch", "executorch", "torchao")


def test_static_tier_runs_with_torch_unimportable(tmp_path: Path) -> None:
    """torch, ExecuTorch and torchao shadowed by packages that refuse to import (numpy, which
    ExecuTorch requires, computes the exhaustive verdicts in float32)."""
    for name in UNIMPORTABLE:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('{name} is not importable here')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "qlint", *args], capture_output=True, text=True, timeout=120,
                              cwd=ROOT, env=env)

    assert "torch is not importable here" in run("check", str(ROOT / "examples" / "attention.pt2")).stderr
    example = ROOT / "examples" / "attention.pt2"
    result = run("check", "--static", str(example), "--no-cache", "--output-format", "json")
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    [scale, pair] = data["findings"]
    assert (scale["code"], scale["node"], scale["details"]["identity"]) == ("QL001", "div", True)
    assert scale["location"]["path"] == "examples/models.py" and scale["location"]["line"] == 30
    assert scale["details"]["constants"] == [{"name": "_tensor_constant0", "kind": "buffer", "value": 4.0, "op": "div"}]
    assert (pair["code"], pair["details"]["identity"]) == ("QL004", False)
    assert "static tier: QL001 and QL004" in result.stderr
    # What needs lowering is refused with its reason, not silently skipped.
    refused = run("check", "--static", "--fix", str(example))
    assert refused.returncode == 2 and "need the full check" in refused.stderr


def test_a_deep_graph_is_read_without_recursion_and_a_cycle_is_refused() -> None:
    """A crafted program: 10,000 chained `neg` nodes (ten times Python's recursion limit) read as
    a program; two nodes that name each other refused, as torch's deserializer refuses a name
    read before it is defined."""
    from qlint.io.reads import ReadError

    entries, model, program = example_program()
    nodes = program["graph_module"]["graph"]["nodes"]
    chain = [unary("aten.neg.default", f"n{i}", f"n{i - 1}" if i else "b__tensor_constant0") for i in range(10_000)]
    nodes[:0] = chain
    checked = lint_static(archive_with(entries, model, program), "crafted.pt2", Config())
    findings, [stats] = checked.findings, checked.stats
    assert [f.code for f in findings] == ["QL001", "QL004"] and stats.nodes == len(nodes)
    nodes[:0] = [unary("aten.neg.default", "loop_a", "loop_b"), unary("aten.neg.default", "loop_b", "loop_a")]
    with pytest.raises(ReadError, match="^corrupt models/model.json: node 'loop_a' reads 'loop_b', which no "
                                        "earlier node defines$"):
        lint_static(archive_with(entries, model, program), "crafted.pt2", Config())


def test_a_mangled_graph_is_a_read_error_never_a_crash() -> None:
    """Seeded mutations of the example's program JSON: every field of every node replaced by a
    value of another type. The static tier answers or says the file is corrupt."""
    import random

    from qlint.io.reads import ReadError

    entries, model, original = example_program()
    rng = random.Random(0)
    odd = [None, 7, -1.5, "x", [], {}, [None], {"as_tensor": 3}, {"as_tensor": {"name": "nowhere"}}, True]
    outcomes = {"answered": 0, "refused": 0}
    for _ in range(300):
        program = json.loads(json.dumps(original))
        for _ in range(3):
            node = rng.choice(program["graph_module"]["graph"]["nodes"])
            field = rng.choice(["inputs", "outputs", "metadata", "name"])
            inputs = node.get("inputs")
            if field == "inputs" and isinstance(inputs, list) and inputs and rng.random() < 0.7:
                item = inputs[rng.randrange(len(inputs))]
                if isinstance(item, dict):
                    item["arg"] = rng.choice(odd)
            else:
                node[field] = rng.choice(odd)
        try:
            lint_static(archive_with(entries, model, program), "mangled.pt2", Config())
            outcomes["answered"] += 1
        except ReadError:
            outcomes["refused"] += 1
    assert outcomes["answered"] and outcomes["refused"]


def test_a_full_check_baseline_serves_the_static_tier_and_static_results_are_cached(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from conftest import run_cli

    example = str(ROOT / "examples" / "attention.pt2")
    baseline = tmp_path / "baseline.json"
    assert run_cli(["check", example, "--write-baseline", str(baseline)], capsys)[0] == 0
    code, out, err = run_cli(["check", "--static", example, "--baseline", str(baseline), "--output-format", "json"],
                             capsys)
    assert (code, json.loads(out)["findings"]) == (0, [])  # QL001 and QL004 are in the baseline
    cached = ["check", "--static", example, "--cache-dir", str(tmp_path / "cache"), "--output-format", "json"]
    first = run_cli(cached, capsys)
    assert len(list((tmp_path / "cache").rglob("*.json"))) == 1
    assert run_cli(cached, capsys)[:2] == first[:2]
    [row] = json.loads(first[1])["artifacts"]
    assert row["static"] is True and row["lowered"] is False


def test_too_many_distinct_int16_verdicts_are_refused_not_ground_through() -> None:
    """A crafted program of 4,200 int16 requantize pairs, each with its own scale: 275 million
    integers. The static tier says so in one line instead of running for minutes."""
    from qlint.io.reads import ReadError

    entries, model, program = example_program()

    def qdq(target: str, name: str, source: str, scale: float) -> dict[str, Any]:
        literal = [("scale", {"as_float": scale}), ("zero_point", {"as_int": 0}), ("quant_min", {"as_int": -32768}),
                   ("quant_max", {"as_int": 32767}), ("dtype", {"as_scalar_type": 3})]
        inputs = [{"name": "input", "arg": {"as_tensor": {"name": source}}, "kind": 1},
                  *({"name": key, "arg": arg, "kind": 1} for key, arg in literal)]
        return {"target": f"torch.ops.quantized_decomposed.{target}.default", "name": name, "metadata": {},
                "inputs": inputs, "outputs": [{"as_tensor": {"name": name}}]}

    for i in range(4200):
        program["graph_module"]["graph"]["nodes"] += [qdq("dequantize_per_tensor", f"d{i}", "q", 0.001 * (i + 1)),
                                                      qdq("quantize_per_tensor", f"r{i}", f"d{i}", 0.0015 * (i + 1))]
    with pytest.raises(ReadError, match="more distinct islands than the static tier evaluates"):
        lint_static(archive_with(entries, model, program), "crafted.pt2", Config())


def test_a_constant_the_static_tier_cannot_compute_leaves_the_island_undecided() -> None:
    """The example's divisor replaced by its `sqrt`, an op the static tier does not evaluate. One
    element: the island is QL001 whatever the value, its identity undecided. Eight elements within
    `max_elements`: only whether they are equal decides QL001 or QL002, so the tier reports the fp32
    island (QL002), undecided. Past `max_elements` it is QL002 whatever the values: left to the full check."""
    entries, model, program = example_program()
    graph = program["graph_module"]["graph"]
    [div] = [n for n in graph["nodes"] if n["target"] == "torch.ops.aten.div.Tensor"]
    div["inputs"][1]["arg"] = {"as_tensor": {"name": "root"}}
    graph["nodes"].insert(graph["nodes"].index(div), unary("aten.sqrt.default", "root", "b__tensor_constant0"))
    graph["tensor_values"]["root"] = dict(graph["tensor_values"]["b__tensor_constant0"])
    [scale, pair] = lint_static(archive_with(entries, model, program), "crafted.pt2", Config()).findings
    assert (scale.code, scale.details["identity"], scale.details["factor"], pair.details["identity"]) == (
        "QL001", None, None, False)
    assert scale.details["undecided"] == ("root (computed) is computed in the graph with aten.sqrt.default from "
                                          "buffer _tensor_constant0, an op the static tier does not evaluate")
    assert scale.message.endswith("identity undecided: " + scale.details["undecided"]
                                  + ": run `qlint check` without --static for the verdict")
    assert scale.details["constants"] == [{"name": "root", "kind": "computed", "value": None, "op": "div"}]

    graph["tensor_values"]["root"]["sizes"] = [{"as_int": 1}, {"as_int": 1}, {"as_int": 8}]
    crafted = archive_with(entries, model, program)
    checked = lint_static(crafted, "crafted.pt2", Config(fold=FoldGuards(max_elements=8)))
    [island, _], [stats] = checked.findings, checked.stats
    assert (island.code, island.details["identity"], stats.fp32_islands) == ("QL002", None, 1)
    assert island.details["reason"].startswith("undecided: root (computed, 8 elements) is computed in the graph")
    assert "QL001 if it holds one value" in island.message
    assert [f.code for f in lint_static(crafted, "crafted.pt2", Config()).findings] == ["QL004"]


def test_levit_attention_biases_are_computed_as_initialized_and_undecided_once_trained(
    pt2_dir: Callable[[str], Path]
) -> None:
    """timm's LeViT gathers a bias per head and offset with `aten.index`. As timm initializes them
    (all zero) a gather of one value is that value: decided. Trained, they differ by offset, and the
    island is reported undecided with the op and the tensors it gathers from."""
    def island_of(name: str) -> Any:
        [found] = [f for f in lint_static(pt2_dir(name).read_bytes(), name, Config()).findings if f.code != "QL004"]
        return found

    untrained, trained = island_of("make_levit_attention"), island_of("make_levit_attention_trained")
    assert (untrained.code, untrained.details["identity"]) == ("QL001", True)
    assert [(c["op"], c["value"]) for c in untrained.details["constants"]] == [("mul", 0.3535533845424652),
                                                                              ("add", 0.0)]
    assert (trained.code, trained.details["identity"]) == ("QL002", None)
    assert "with aten.index.Tensor from parameter" in trained.details["undecided"]
    assert "self.attention_biases[:, self.attention_bias_idxs]" in trained.location.code
