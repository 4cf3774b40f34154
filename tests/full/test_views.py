"""Where engineers look: findings as Model Explorer node data, and the memory plan as a figure."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, run_cli, run_json


def adapter_nodes(pt2: Path) -> tuple[str, dict[str, Any]]:
    """The graph id and nodes Model Explorer's own PyTorch adapter makes of a `.pt2`."""
    from model_explorer.builtin_pytorch_exportedprogram_adapter import BuiltinPytorchExportedProgramAdapter

    [graph] = BuiltinPytorchExportedProgramAdapter().convert(str(pt2), {"const_element_count_limit": 16})["graphs"]
    return graph.id, {node.id: node for node in graph.nodes}


def load_node_data(path: Path, *, numbers: bool) -> Any:
    """A node-data file read into Model Explorer's own classes; no key they do not define.
    Its dataclass annotates values as numbers; the web app also takes strings (labels)."""
    import dacite
    from model_explorer.node_data_builder import ModelNodeData

    config = dacite.Config(strict=True, check_types=numbers)
    return dacite.from_dict(ModelNodeData, {"graphsData": json.loads(path.read_text())}, config=config)


def output_shape(node: Any) -> tuple[str, int]:
    """dtype and element count of a node's output, as the adapter describes it (`torch.int8[1, 8, 8]`)."""
    [shape] = [a.value for item in node.outputsMetadata for a in item.attrs if a.key == "tensor_shape"]
    dtype, dims = re.fullmatch(r"torch\.(\w+)(\[.*\])", shape).groups()  # type: ignore[union-attr]
    return dtype, math.prod(json.loads(dims))


def check_overlay(pt2: Path, folder: Path, findings: list[dict[str, Any]]) -> dict[str, int]:
    """The overlay of `pt2` against the adapter's graph and the findings; returns the fp32 values."""
    from qlint.report.model_explorer import FINDINGS_SUFFIX, FP32_SUFFIX, file_stem

    graph_id, nodes = adapter_nodes(pt2)
    artifact = findings[0]["artifact"]
    fp32 = load_node_data(folder / f"{file_stem(artifact)}{FP32_SUFFIX}", numbers=True)
    labels = load_node_data(folder / f"{file_stem(artifact)}{FINDINGS_SUFFIX}", numbers=False)
    assert list(fp32.graphsData) == list(labels.graphsData) == [graph_id]
    values = {node: result.value for node, result in fp32.graphsData[graph_id].results.items()}
    texts = {node: result.value for node, result in labels.graphsData[graph_id].results.items()}
    assert set(values) == set(texts) and set(values) <= set(nodes)  # every id is one the adapter gives
    for finding in findings:
        marked = finding["details"].get("graph_nodes", {})
        if finding["code"] in ("QL001", "QL002"):
            assert sum(marked.values()) == finding["details"]["fp32_elements"]
        for node, count in marked.items():
            assert values[node] == count and finding["code"] in texts[node]
            dtype, elements = output_shape(nodes[node])
            # A node's value is the fp32 tensors its lowered form materializes: its output, once per
            # lowered node (layer_norm -> native_layer_norm + getitem: twice); quantize outputs are int.
            if count:
                assert dtype == "float32" and count % elements == 0 and count // elements <= 2
            else:
                assert dtype in ("int8", "int16")
    return values


def test_overlay_of_the_bundled_example_matches_model_explorers_ids(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    example = ROOT / "examples" / "attention.pt2"
    code, data = run_json(["check", str(example), "--no-cache", "--write", f"model-explorer:{tmp_path / 'me'}"],
                          capsys)
    assert code == 1
    values = check_overlay(example, tmp_path / "me", data["findings"])
    # The island: the bmm output dequantized, `/ sqrt(d)`, quantized; then the softmax requantize.
    assert values == {"dequantize_per_tensor_4": 64, "div": 64, "quantize_per_tensor_5": 0,
                      "dequantize_per_tensor_6": 64, "quantize_per_tensor_7": 0}
    # The estimate on the adapter's ids: each node's ops' cycles, the island's nodes summing to its finding's
    from qlint.report.model_explorer import TIME_SUFFIX, file_stem

    graph_id, nodes = adapter_nodes(example)
    artifact = data["findings"][0]["artifact"]
    overlay = load_node_data(tmp_path / "me" / f"{file_stem(artifact)}{TIME_SUFFIX}", numbers=True)
    [graph] = overlay.graphsData.values()
    cycles = {node: result.value for node, result in graph.results.items()}
    assert set(cycles) <= set(nodes) and max(cycles, key=cycles.__getitem__) in ("bmm", "bmm_1")
    [scale] = [f for f in data["findings"] if f["code"] == "QL001"]
    assert sum(cycles[n] for n in scale["details"]["graph_nodes"]) == scale["details"]["cycles"]
    assert sum(cycles.values()) <= data["artifacts"][0]["cycles"]  # ops lowering made have no id there


def test_overlay_of_sam_marks_every_island_node(sam_pt2: Path, sam_checked: tuple[int, dict[str, Any], Path]) -> None:
    _, data, folder = sam_checked
    values = check_overlay(sam_pt2, folder, data["findings"])
    islands = [f for f in data["findings"] if f["code"] in ("QL001", "QL002")]
    assert len(islands) == 16
    for island in islands:  # each: a dequantized input and its float op(s), then an integer quantize
        counts = list(island["details"]["graph_nodes"].values())
        assert sum(1 for c in counts if c) >= 2 and 0 in counts
    assert len(values) == len({node for f in data["findings"] for node in f["details"].get("graph_nodes", {})})


# Model Explorer's .pte adapter (from executorch-extension-model-explorer) needs a newer flatbuffers
# than tosa-tools pins, so it runs in a venv of its own layered over this one.
PTE_ADAPTER = "pte-adapter-model-explorer==0.2.0"
PTE_GRAPHS = """
import json, sys
from pte_adapter_model_explorer.main import PTEAdapter
[collection] = PTEAdapter().convert(sys.argv[1], {})["graphCollections"]
print(json.dumps({g.id: {n.id: n.label for n in g.nodes} for g in collection.graphs}))
"""


def test_overlay_of_a_pte_matches_the_pte_adapters_ids(
    attention_plan: tuple[Path, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import subprocess
    import venv

    from qlint.report.model_explorer import FINDINGS_SUFFIX, FP32_SUFFIX, file_stem

    pte = attention_plan[0]
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=True, with_pip=True)
    python = str(env_dir / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "--quiet", PTE_ADAPTER], check=True, capture_output=True)
    graphs = json.loads(subprocess.run([python, "-c", PTE_GRAPHS, str(pte)], check=True, capture_output=True,
                                       text=True).stdout)
    _, data = run_json(["check", str(pte), "--no-cache", "--write", f"model-explorer:{tmp_path / 'me'}"], capsys)
    fp32 = load_node_data(tmp_path / "me" / f"{file_stem(str(pte))}{FP32_SUFFIX}", numbers=True).graphsData
    labels = load_node_data(tmp_path / "me" / f"{file_stem(str(pte))}{FINDINGS_SUFFIX}", numbers=False).graphsData
    assert list(graphs) == list(fp32) == list(labels) == ["forward"]
    ids = graphs["forward"]
    values = {node: result.value for node, result in fp32["forward"].results.items()}
    assert set(values) <= set(ids) and set(values) == set(labels["forward"].results)
    # The attention scale island: its dequantize, the division and its quantize, as the adapter labels them.
    [scale] = [f for f in data["findings"] if f["code"] == "QL001"]
    marked = scale["details"]["graph_nodes"]
    assert sorted(ids[node] for node in marked) == [
        "aten::div", "cortex_m::dequantize_per_tensor", "cortex_m::quantize_per_tensor"
    ]
    assert {ids[node]: count for node, count in marked.items()}["aten::div"] == 64
    assert sum(marked.values()) == scale["details"]["fp32_elements"] == 128


def test_writes_that_cannot_happen_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    example = str(ROOT / "examples" / "attention.pt2")
    code, _, err = run_cli(["check", example, "--write", f"memory-plot:{tmp_path / 'm.svg'}"], capsys)
    assert code == 2 and err.strip().endswith("--write memory-plot: needs --fix on a program that lowers, or a .pte")
    code, _, err = run_cli(["check", example, "--write", f"model-explorer:{tmp_path / 'no' / 'dir'}"], capsys)
    assert code == 2 and f"its parent {tmp_path / 'no'} is not a directory" in err
    assert not (tmp_path / "m.svg").exists() and not (tmp_path / "no").exists()
