"""Crafted graphs and payloads: the static tier and the full check answer them alike, quickly and
in bounded memory, or refuse them in one line.

Each program is written here from the bundled example's archive (its inputs, its 4.0 buffer, its
metadata entries) with a graph built node by node: cycles, self-references, fan-out, long chains,
quant ranges wider than their dtype, payloads that disagree with their config. The static tier runs
in a child process under RLIMIT_CPU and an address-space limit, so a regression shows as a killed
child, not as a slow test on a shared machine.
"""

from __future__ import annotations

import copy
import json
import os
import resource
import struct
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import PROBE, ROOT, run_cli

EXAMPLE = ROOT / "examples" / "attention.pt2"
PREFIX = "attention"
FLOAT32, FLOAT16, INT8, INT16, FLOAT64 = 7, 6, 2, 3, 8
INT16_RANGE = (-32768, 32767)
CPU_SECONDS, MEMORY = 10, 256 << 20
# The interpreter and qlint's own modules before any input is read: the limit is what reading costs.
BASELINE = 64 << 20


def _template() -> tuple[dict[str, bytes], dict[str, Any]]:
    with zipfile.ZipFile(EXAMPLE) as archive:
        entries = {info.filename.split("/", 1)[1]: archive.read(info) for info in archive.infolist()}
    return entries, json.loads(entries["models/model.json"])


ENTRIES, PROGRAM = _template()


def tensor(sizes: tuple[int, ...], dtype: int = FLOAT32) -> dict[str, Any]:
    strides, step = [], 1
    for size in reversed(sizes):
        strides.insert(0, step)
        step *= max(size, 1)
    return {"dtype": dtype, "sizes": [{"as_int": s} for s in sizes], "requires_grad": False,
            "device": {"type": "cpu", "index": None}, "strides": [{"as_int": s} for s in strides],
            "storage_offset": {"as_int": 0}, "layout": 7}


def ref(name: str) -> dict[str, Any]:
    return {"as_tensor": {"name": name}}


class Program:
    """A graph over the example's inputs `q`, `k`, `v` ([1, 8, 16] float32) and its buffer
    `b__tensor_constant0` (4.0), written node by node."""

    def __init__(self) -> None:
        self.program = copy.deepcopy(PROGRAM)
        self.graph = self.program["graph_module"]["graph"]
        self.graph["nodes"] = []
        self.tensors = self.graph["tensor_values"]
        self.tensors.clear()
        for name in ("q", "k", "v"):
            self.tensors[name] = tensor((1, 8, 16))
        self.tensors["b__tensor_constant0"] = tensor((1, 1, 1))
        self.weights = json.loads(ENTRIES["data/weights/model_weights_config.json"])
        self.payloads = {"weight_0": ENTRIES["data/weights/weight_0"]}
        self.count = 0

    def node(self, target: str, inputs: dict[str, Any], name: str | None = None,
             sizes: tuple[int, ...] = (1, 8, 16), dtype: int = FLOAT32) -> str:
        self.count += 1
        name = name or f"n{self.count}"
        self.graph["nodes"].append({
            "name": name, "target": target,
            "inputs": [{"name": key, "arg": arg, "kind": 1} for key, arg in inputs.items()],
            "outputs": [ref(name)], "metadata": {},
        })
        self.tensors[name] = tensor(sizes, dtype)
        return name

    def quantize(self, source: str, scale: float, zero_point: int = 0, low: int = -128, high: int = 127,
                 dtype: int = INT8, dequantize: bool = False, **arg_kinds: Any) -> str:
        kind = "dequantize" if dequantize else "quantize"
        args = {"input": ref(source), "scale": {"as_float": scale}, "zero_point": {"as_int": zero_point},
                "quant_min": {"as_int": low}, "quant_max": {"as_int": high}, "dtype": {"as_scalar_type": dtype},
                **arg_kinds}
        return self.node(f"torch.ops.quantized_decomposed.{kind}_per_tensor.default", args,
                         dtype=FLOAT32 if dequantize else dtype)

    def pair(self, source: str, scale: float, **qp: Any) -> str:
        """quantize then dequantize: what PT2E leaves around every annotated tensor."""
        return self.quantize(self.quantize(source, scale, **qp), scale, dequantize=True, **qp)

    def div(self, source: str, divisor: str = "b__tensor_constant0") -> str:
        return self.node("torch.ops.aten.div.Tensor", {"self": ref(source), "other": ref(divisor)})

    def write(self, path: Path, output: str | None = None) -> Path:
        output = output or self.graph["nodes"][-1]["outputs"][0]["as_tensor"]["name"]
        self.graph["outputs"] = [ref(output)]
        self.program["graph_module"]["signature"]["output_specs"] = [{"user_output": {"arg": ref(output)}}]
        entries = dict(ENTRIES, **{"models/model.json": json.dumps(self.program).encode(),
                                   "data/weights/model_weights_config.json": json.dumps(self.weights).encode()})
        entries.update({f"data/weights/{name}": body for name, body in self.payloads.items()})
        with zipfile.ZipFile(path, "w") as archive:
            for name, body in entries.items():
                archive.writestr(f"{PREFIX}/{name}", body)
        return path

    def buffer_meta(self, **changes: Any) -> None:
        """Change the buffer's payload metadata (the config torch reads), the graph's left alone."""
        self.weights["config"]["_tensor_constant0"]["tensor_meta"].update(changes)


def attention_island(program: Program) -> str:
    """The example's island: dequantize, `/ 4.0`, quantize at a quarter of the scale."""
    return program.quantize(program.div(program.pair("q", 0.12, zero_point=-7)), 0.03, zero_point=-7)


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))


def static(path: Path) -> tuple[int, dict[str, Any], str]:
    """`qlint check --static` in a child limited to 10 CPU seconds: exit code, JSON report, stderr.
    Its peak memory over the interpreter's own is asserted under 256 MiB."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", PROBE, "check", "--static", "--no-cache", str(path), "--output-format", "json"],
        capture_output=True, text=True, cwd=path.parent, env=env, timeout=120, preexec_fn=_limits,
    )
    assert result.returncode in (0, 1, 2), (result.returncode, result.stderr[-2000:])
    lines = result.stderr.splitlines()
    [rss] = [int(line.split("=")[1]) * 1024 for line in lines if line.startswith("MAXRSS_KB=")]
    assert rss < BASELINE + MEMORY, rss
    err = "\n".join(line for line in lines if not line.startswith("MAXRSS_KB="))
    return result.returncode, json.loads(result.stdout), err


def full(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    """The full check on the same file, in this process."""
    code, out, _ = run_cli(["check", "--no-cache", str(path), "--output-format", "json"], capsys)
    return code, json.loads(out)


def both_refuse(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """The static tier (in a bounded child) and the full check refuse `path` with one same line."""
    code, report, err = static(path)
    assert code == 2 and report["findings"] == [], report
    [error] = report["errors"]
    assert err.splitlines()[-1] == f"qlint: error: {error['artifact']}: {error['message']}"
    assert "internal error" not in error["message"]
    full_code, full_report = full(path, capsys)
    assert (full_code, [e["message"] for e in full_report["errors"]]) == (2, [error["message"]])
    return str(error["message"])


# -- graphs torch would not deserialize: each name is defined once, before it is read -----------

def cast_cycle(program: Program) -> None:
    """dequantize -> float32 cast -> (cast again, reading the first) -> quantize: a two-node cycle."""
    source = program.pair("q", 0.1)
    program.node("torch.ops.aten._to_copy.default", {"self": ref("b")}, name="a")
    program.node("torch.ops.aten._to_copy.default", {"self": ref("a"), "other": ref(source)}, name="b")
    program.quantize("b", 0.1)


def shape_cycle(program: Program) -> None:
    program.node("torch.ops.aten.view.default", {"self": ref("y"), "size": {"as_ints": [1, 8, 16]}}, name="x")
    program.node("torch.ops.aten.permute.default", {"self": ref("x"), "dims": {"as_ints": [0, 1, 2]}}, name="y")


def self_view(program: Program) -> None:
    program.node("torch.ops.aten.view.default", {"self": ref("x"), "size": {"as_ints": [1, 8, 16]}}, name="x")


def twice_defined(program: Program) -> None:
    program.pair("q", 0.1)
    program.node("torch.ops.aten.neg.default", {"self": ref("q")}, name="n1")


GRAPHS: list[tuple[Callable[[Program], None], str]] = [
    (cast_cycle, "corrupt models/model.json: node 'a' reads 'b', which no earlier node defines"),
    (shape_cycle, "corrupt models/model.json: node 'x' reads 'y', which no earlier node defines"),
    (self_view, "corrupt models/model.json: node 'x' reads 'x', which no earlier node defines"),
    (twice_defined, "corrupt models/model.json: tensor 'n1' is defined twice"),
]


# -- qparams no kernel runs: never an identity verdict ------------------------------------------

def island_with(**quantize: Any) -> Callable[[Program], None]:
    """The attention island whose output quantize has `quantize`'s qparams (and arguments)."""
    def build(program: Program) -> None:
        source = program.div(program.pair("q", 0.12, zero_point=-7))
        qp = {"scale": 0.03, "zero_point": -7, **quantize}
        program.quantize(source, **qp)
    return build


QPARAMS: list[tuple[Callable[[Program], None], str]] = [
    (island_with(low=127, high=-128), "node 'n4' has the range [127, -128], not inside int8's [-128, 127] "
                                      "with quant_min <= quant_max"),
    (island_with(low=-(1 << 23), high=(1 << 23) - 1, dtype=INT16, zero_point=0),
     "node 'n4' has the range [-8388608, 8388607], not inside int16's [-32768, 32767] with quant_min <= quant_max"),
    (island_with(low=-(1 << 26), high=(1 << 26), dtype=INT16, zero_point=0),
     "node 'n4' has the range [-67108864, 67108864], not inside int16's [-32768, 32767] with quant_min <= quant_max"),
    (island_with(scale=float("nan")), "node 'n4' has the scale nan; a quantize needs a finite positive scale"),
    (island_with(scale=-0.03), "node 'n4' has the scale -0.03; a quantize needs a finite positive scale"),
    (island_with(zero_point=200), "node 'n4' has the zero point 200, outside its range [-128, 127]"),
    (island_with(dtype=FLOAT32), "node 'n4' quantizes to float32, not an integer dtype"),
    (island_with(dtype=99), "corrupt models/model.json: tensor 'n4' has dtype code 99, which torch does not define"),
    (island_with(zero_point=1 << 70),
     "corrupt models/model.json: holds an integer outside int64 (22 digits)"),
]


# -- payloads torch reads otherwise than their graph says ---------------------------------------

def buffer(payload: bytes | None = None, graph: dict[str, Any] | None = None, **meta: Any) -> Callable[[Program], None]:
    """The attention island over a buffer whose payload, config metadata or graph metadata are changed."""
    def build(program: Program) -> None:
        attention_island(program)
        if payload is not None:
            program.payloads["weight_0"] = payload
        program.buffer_meta(**meta)
        program.tensors["b__tensor_constant0"].update(graph or {})
    return build


FOUR = struct.pack("<f", 4.0)


PAYLOADS: list[tuple[Callable[[Program], None], str]] = [
    (buffer(struct.pack("<e", 4.0) * 2, dtype=FLOAT16),
     "'_tensor_constant0' is declared float32 [1, 1, 1] in the graph and stored as float16 [1, 1, 1]"),
    (buffer(b""),
     "weight '_tensor_constant0': its view [1, 1, 1] reaches element 0 of a payload of 0 float32 elements"),
    (buffer(FOUR[:3]), "weight '_tensor_constant0': its payload of 3 bytes is not whole float32 elements"),
    (buffer(graph={"dtype": INT8}), "'_tensor_constant0' is declared int8 [1, 1, 1] in the graph and stored as "
                                    "float32 [1, 1, 1]"),
    (buffer(graph={"dtype": FLOAT64}), "'_tensor_constant0' is declared float64 [1, 1, 1] in the graph and stored "
                                       "as float32 [1, 1, 1]"),
    (buffer(storage_offset={"as_int": -1}),
     "weight '_tensor_constant0' has the storage offset -1; torch needs a non-negative integer"),
    (buffer(graph={"sizes": [{"as_int": 1}, {"as_int": 1}, {"as_int": 2}]}),
     "'_tensor_constant0' is declared float32 [1, 1, 2] in the graph and stored as float32 [1, 1, 1]"),
    (buffer(sizes=[{"as_int": 1000}, {"as_int": 1000}, {"as_int": 1}],
            strides=[{"as_int": 1000}, {"as_int": 1}, {"as_int": 1}],
            graph={"sizes": [{"as_int": 1000}, {"as_int": 1000}, {"as_int": 1}]}),
     "weight '_tensor_constant0': its view [1000, 1000, 1] reaches element 999999 of a payload of 1 float32 "
     "elements"),
    (buffer(dtype=99), "corrupt models/model.json: weight '_tensor_constant0' has dtype code 99, which torch does "
                       "not define"),
]


def test_an_enormous_full_is_refused_before_anything_is_built(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    program = Program()
    source = program.pair("q", 0.12, zero_point=-7)
    scale = program.node("torch.ops.aten.full.default", {"size": {"as_ints": [1 << 20, 1 << 20]},
                                                         "fill_value": {"as_float": 4.0}}, sizes=(1, 1, 1))
    program.quantize(program.div(source, scale), 0.03, zero_point=-7)
    assert both_refuse(program.write(tmp_path / "crafted.pt2"), capsys) == (
        "node 'n3' builds a tensor of over 268435456 bytes (limits in .qlint.yaml)")


def test_a_payload_longer_than_its_view_is_read_as_torch_reads_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """8 bytes for one float32 element: torch views the first; both tiers find the island `/ 4`."""
    program = Program()
    buffer(FOUR + struct.pack("<f", 3.0))(program)
    path = program.write(tmp_path / "crafted.pt2")
    code, report, _ = static(path)
    full_code, full_report = full(path, capsys)
    for exit_code, found in ((code, report), (full_code, full_report)):
        scale = next(f for f in found["findings"] if f["code"] == "QL001")
        assert exit_code == 1 and scale["details"]["constants"][0]["value"] == 4.0
        assert scale["details"]["identity"] is True


# -- shapes that cost time: fan-out, long chains, many distinct verdicts -------------------------

def test_ten_thousand_users_of_one_dequantize_are_walked_once(tmp_path: Path) -> None:
    program = Program()
    dq = program.pair("q", 0.1)
    for i in range(10_000):
        program.quantize(dq, 0.1 * (1 + (i % 7) * 0.25))
    code, report, _ = static(program.write(tmp_path / "fan.pt2"))
    pairs = [f for f in report["findings"] if f["code"] == "QL004"]
    assert code == 0 and len(pairs) == 10_000
    assert sum(f["details"]["identity"] for f in pairs) == 10_000 // 7 + 1  # the pairs of scale 0.1


def test_a_chain_of_two_thousand_distinct_int16_islands_is_decided(tmp_path: Path) -> None:
    """131 million integers, each island's own qparams: decided exhaustively in the bounds."""
    program = Program()
    x = program.quantize("q", 0.01, low=INT16_RANGE[0], high=INT16_RANGE[1], dtype=INT16)
    for i in range(2000):
        scale = 0.01 * (1 + i * 1e-4)
        qp = {"low": INT16_RANGE[0], "high": INT16_RANGE[1], "dtype": INT16}
        x = program.quantize(program.div(program.quantize(x, scale, dequantize=True, **qp)), scale / 4, **qp)
    code, report, _ = static(program.write(tmp_path / "chain.pt2"))
    islands = [f for f in report["findings"] if f["code"] == "QL001"]
    assert code == 1 and len(islands) == 2000 and all(f["details"]["identity"] for f in islands)


def test_a_long_chain_of_scale_ops_is_walked_once(tmp_path: Path) -> None:
    """5,000 divisions in a row ending in a softmax: no island, and no walk per division."""
    program = Program()
    x = program.pair("q", 0.1)
    for _ in range(5000):
        x = program.div(x)
    program.node("torch.ops.aten.softmax.int", {"self": ref(x), "dim": {"as_int": -1}})
    code, report, _ = static(program.write(tmp_path / "divisions.pt2"))
    assert (code, [f["code"] for f in report["findings"]]) == (0, [])


@pytest.mark.parametrize(("users", "limit"), [
    (20_000, "JSON objects and lists, over the 400000 limit (graph_objects, about 9,000 nodes; limits in .qlint.yaml)"),
    (60_000, "-byte entry limit (limits in .qlint.yaml)"),
])
def test_a_graph_past_the_limits_is_refused_before_it_is_parsed(
    users: int, limit: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    program = Program()
    dq = program.pair("q", 0.1)
    for i in range(users):
        program.quantize(dq, 0.1 + i * 1e-6)
    assert both_refuse(program.write(tmp_path / "fan.pt2"), capsys).endswith(limit)


@pytest.mark.parametrize(("build", "message"), [*GRAPHS, *QPARAMS, *PAYLOADS])
def test_a_program_torch_would_refuse_is_refused_by_both_tiers_in_one_line(
    build: Callable[[Program], None], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    program = Program()
    build(program)
    assert both_refuse(program.write(tmp_path / "crafted.pt2"), capsys) == message


def test_an_expanded_view_of_one_element_is_read_as_that_element(tmp_path: Path) -> None:
    """A float64 buffer of 8 bytes viewed with stride 0 as 2^25 - 4096 elements (just under
    `tensor_mb`): the static tier compares one element, not a 256 MiB copy of the view. A constant
    of that many elements is no per-tensor scale, so the island is the full check's (no finding)."""
    sizes = [{"as_int": (1 << 25) - 4096}, {"as_int": 1}, {"as_int": 1}]
    program = Program()
    buffer(struct.pack("<d", 4.0), graph={"dtype": FLOAT64, "sizes": sizes}, dtype=FLOAT64, sizes=sizes,
           strides=[{"as_int": 0}, {"as_int": 0}, {"as_int": 0}])(program)
    code, report, _ = static(program.write(tmp_path / "expanded.pt2"))
    assert (code, report["errors"], report["findings"]) == (0, [], [])


def test_a_full_inside_the_tensor_limit_by_its_own_dtype_is_read(tmp_path: Path) -> None:
    """40,000,000 float32 elements are 160 MB: inside `tensor_mb` (at 8 bytes each they would not be)."""
    program = Program()
    source = program.pair("q", 0.12, zero_point=-7)
    scale = program.node("torch.ops.aten.full.default", {"size": {"as_ints": [40_000_000]},
                                                         "fill_value": {"as_float": 4.0}}, sizes=(1, 1, 1))
    program.quantize(program.div(source, scale), 0.03, zero_point=-7)
    code, report, _ = static(program.write(tmp_path / "full.pt2"))
    assert (code, [f["code"] for f in report["findings"]], report["errors"]) == (1, ["QL001"], [])
