"""Findings on the graph in Google's Model Explorer: custom node data for each checked `.pt2` and `.pte`.

Model Explorer's PyTorch adapter shows an ExportedProgram as one graph (`graph`)
whose node ids are the fx node names; its `.pte` adapter (ExecuTorch's
`executorch-extension-model-explorer`) shows the execution plan (`forward`) with
one node per instruction, `forward_<chain>_<index>`. The findings record their
nodes by those ids (`graph_nodes`: a lowered node mapped back through `from_node`,
a `.pte` node by its instruction) and the graph's id (`ArtifactStats.graph`).
Two node-data files per program: the fp32 elements each node materializes per
inference (a colour gradient; a node that lowering split, `layer_norm` into
`native_layer_norm` and `getitem`, carries what all its parts count), and the
rule code and cause (a label); a third for a lowered program, the estimated cycles of each
node's ops on the run's core (`qlint.device.cost`), so the time overlays the official view too; for a
program lowered for an Ethos-U, where each node runs: `npu partition N` for the nodes a delegate call
runs (a `.pt2`'s nodes of the partition, a `.pte`'s delegate call instruction) and `cpu fallback`
for the nodes QL010 reports. They are built with Model Explorer's own node-data classes, so they
are what it loads.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from pathlib import Path
from typing import Any

from qlint.records.results import ArtifactStats, Finding, Report
from qlint.rules.catalog import load_catalog
from qlint.rules.table import Code

FP32_SUFFIX = ".fp32.json"
FINDINGS_SUFFIX = ".findings.json"
TIME_SUFFIX = ".cycles.json"
PLACEMENT_SUFFIX = ".placement.json"
NPU_COLOUR, FALLBACK_COLOUR = "#b7e4c7", "#f4a261"
_LABEL_CHARS = 100
# Room for the longest suffix (`.findings.json`) in a 255-byte file name.
_STEM_BYTES = 255 - len(FINDINGS_SUFFIX)


class OverlayUnavailable(Exception):
    """Model Explorer is not installed (`pip install 'qlint[model-explorer]'`)."""


def overlay_files(report: Report) -> dict[str, str]:
    """File name -> node-data JSON, two for each `.pt2` and `.pte` the report checked (none for
    targets, which leave no file to open, or artifacts that could not be read)."""
    try:
        from model_explorer.node_data_builder import (
            GradientItem,
            GraphNodeData,
            ModelNodeData,
            NodeDataResult,
        )
    except ImportError:
        raise OverlayUnavailable("Model Explorer is not installed: pip install 'qlint[model-explorer]'") from None

    files: dict[str, str] = {}
    shown = [stats for stats in report.stats if stats.artifact.endswith((".pt2", ".pte"))]
    stems = file_stems([stats.artifact for stats in shown])
    for stats in shown:
        elements, labels = node_values([f for f in report.findings if f.artifact == stats.artifact])
        fp32 = GraphNodeData(
            name="qlint: fp32 elements per inference",
            results={node: NodeDataResult(value=value) for node, value in elements.items()},
            gradient=[GradientItem(stop=0, bgColor="#ffe8a3"), GradientItem(stop=1, bgColor="#d7263d")],
        )
        rules = GraphNodeData(
            name="qlint: findings",
            results={node: NodeDataResult(value=label) for node, label in labels.items()},
            showExpandedSummaryOnGroupNode=True,
        )
        stem = stems[stats.artifact]
        files[stem + FP32_SUFFIX] = ModelNodeData(graphsData={stats.graph: fp32}).to_json_string(indent=2)
        files[stem + FINDINGS_SUFFIX] = ModelNodeData(graphsData={stats.graph: rules}).to_json_string(indent=2)
        if stats.node_cycles:
            time = GraphNodeData(
                name=f"qlint: {'measured' if stats.measured_runs else 'estimated'} cycles ({stats.core})",
                results={node: NodeDataResult(value=value) for node, value in stats.node_cycles.items()},
                gradient=[GradientItem(stop=0, bgColor="#e3f0fb"), GradientItem(stop=1, bgColor="#1b3a6b")],
            )
            files[stem + TIME_SUFFIX] = ModelNodeData(graphsData={stats.graph: time}).to_json_string(indent=2)
        if stats.partitions is not None:
            placed = GraphNodeData(
                name=f"qlint: where each node runs ({stats.target})",
                results={node: NodeDataResult(value=label, bgColor=NPU_COLOUR if label.startswith("npu")
                                              else FALLBACK_COLOUR)
                         for node, label in placement(stats, report.findings).items()},
            )
            files[stem + PLACEMENT_SUFFIX] = ModelNodeData(graphsData={stats.graph: placed}).to_json_string(indent=2)
    return files


def placement(stats: ArtifactStats, findings: list[Finding]) -> dict[str, str]:
    """Per node id of a program lowered for an NPU: `npu partition N` for the nodes a partition runs,
    `cpu fallback` for the nodes of its QL010 findings (the ops the NPU leaves to the CPU in float,
    or that split a partition)."""
    placed = {node: f"npu partition {number}" for node, number in stats.npu_nodes.items()}
    for finding in findings:
        if finding.artifact == stats.artifact and finding.code == Code.NPU_FALLBACK:
            placed.update(dict.fromkeys(finding.details.get("graph_nodes") or {}, "cpu fallback"))
    return placed


def node_values(findings: list[Finding]) -> tuple[dict[str, int], dict[str, str]]:
    """Per node id: the fp32 elements it materializes, and `CODE cause` of every finding it is in."""
    elements: dict[str, int] = {}
    labels: dict[str, list[str]] = {}
    for finding in findings:
        nodes: Any = finding.details.get("graph_nodes") or {}
        label = f"{finding.code} {cause(finding)}"
        for node, count in nodes.items():
            elements[node] = max(elements.get(node, 0), int(count))
            if label not in labels.setdefault(node, []):
                labels[node].append(label)
    return elements, {node: "; ".join(found) for node, found in labels.items()}


def cause(finding: Finding) -> str:
    """A few words for a node label: the rule's name, or the cause the finding names."""
    reason = finding.details.get("reason")
    text = str(reason) if reason else load_catalog()[finding.code].name
    if finding.code == Code.CONSTANT_SCALE_ISLAND and finding.details.get("identity"):
        text += " (exact identity)"
    return text if len(text) <= _LABEL_CHARS else text[: _LABEL_CHARS - 1] + "…"


def file_stem(artifact: str) -> str:
    """One flat, safe file name per artifact path: `models/attention.pt2` -> `models_attention.pt2`."""
    return re.sub(r"[^\w.-]+", "_", artifact).strip("._") or "artifact"


def file_stems(artifacts: list[str]) -> dict[str, str]:
    """Artifact -> its overlay file stem, one per artifact: `file_stem`, unless two artifacts flatten
    to one name (`a/b.pt2`, `a_b.pt2`; `A.pt2`, `a.pt2` on a case-insensitive disk) or the name is
    too long for a file system. Those get a short hash of their path, so each keeps its own files
    and the names do not depend on the order of the inputs."""
    flat = {artifact: file_stem(artifact) for artifact in artifacts}
    taken = Counter(stem.casefold() for stem in flat.values())
    return {
        artifact: stem if taken[stem.casefold()] == 1 and len(stem.encode()) <= _STEM_BYTES else _hashed(artifact, stem)
        for artifact, stem in flat.items()
    }


def _hashed(artifact: str, stem: str) -> str:
    """`stem-<8 hex of the path's sha256>`, the stem cut from the left to fit (its end names the file)."""
    digest = hashlib.sha256(artifact.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    tail = stem.encode()[-(_STEM_BYTES - 9):].decode("utf-8", "ignore")
    return f"{tail}-{digest}"


def write_overlays(report: Report, folder: Path) -> list[Path]:
    """Write each overlay atomically into `folder` (created when missing); the paths written.
    A file that cannot be written raises an OSError naming it."""
    from qlint.io.writes import write_atomic

    written = []
    for name, text in overlay_files(report).items():
        try:
            write_atomic(folder / name, (text + "\n").encode())
        except OSError as exc:
            raise OSError(f"{name}: {exc.strerror or exc}") from None
        written.append(folder / name)
    return written
