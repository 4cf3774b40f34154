"""SAM's TwoWayTransformer: 7 attention-scale islands, 9 LayerNorm islands."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, main_json

ATTN_LINE = "attn = attn / math.sqrt(c_per_head)"
SOURCE = "segment_anything/modeling/transformer.py"


@pytest.fixture(scope="session")
def sam_from_pt2(sam_checked: tuple[int, dict[str, Any], Path]) -> tuple[int, dict[str, Any]]:
    return sam_checked[0], sam_checked[1]


@pytest.fixture(scope="session")
def sam_from_target(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any]]:
    root = ROOT
    folder = tmp_path_factory.mktemp("sam_target")
    config = folder / ".qlint.yaml"
    config.write_text(textwrap.dedent("""\
        targets:
          - name: sam
            factory: examples.sam:make_two_way_transformer
        """))
    # The factory module lives in the repo: make it importable from the config's folder.
    (folder / "examples").symlink_to(root / "examples")
    return main_json(["check", "--config", str(config), "--targets-only"])


def assert_sam(result: tuple[int, dict[str, Any]], artifact: str) -> None:
    code, data = result
    assert code == 1  # QL001 is an error by default
    assert data["errors"] == []
    ql001 = [f for f in data["findings"] if f["code"] == "QL001"]
    assert len(ql001) == 7
    for finding in ql001:
        assert finding["artifact"] == artifact
        assert finding["location"]["path"] == SOURCE
        assert finding["location"]["code"] == ATTN_LINE
        assert finding["details"]["ops"] == ["aten.div.Tensor"]
        value = finding["details"]["constants"][0]["value"]
        assert value == pytest.approx(4.0) or value == pytest.approx(8 ** 0.5)  # sqrt(16), sqrt(8)
    assert len({f["location"]["line"] for f in ql001}) == 1
    norms = [f for f in data["findings"] if f["code"] == "QL002"]
    assert len(norms) == 9
    assert all(f["details"]["reason"].startswith("data-dependent normalization") for f in norms)
    assert all("norm" in f["location"]["code"] for f in norms)
    [coverage] = [f for f in data["findings"] if f["code"] == "QL005"]
    assert coverage["message"].startswith("int8 coverage 81.8% < 90%: 16 of 88 compute ops run in fp32")
    [stats] = data["artifacts"]
    assert stats["lowered"] is True and stats["fp32_islands"] == 16
    assert stats["int_kernels"] == 32 + 19 + 14 + 7  # linear, add, bmm, softmax


def test_sam_pt2(sam_from_pt2: tuple[int, dict[str, Any]], sam_pt2: Path) -> None:
    from qlint.run.engine import display

    assert_sam(sam_from_pt2, display(sam_pt2))


def test_sam_config_target(sam_from_target: tuple[int, dict[str, Any]]) -> None:
    assert_sam(sam_from_target, "target:sam")


def test_sam_pt2_and_target_agree(sam_from_pt2: tuple[int, dict[str, Any]],
                                  sam_from_target: tuple[int, dict[str, Any]]) -> None:
    def key(data: dict[str, Any]) -> list[tuple[str, int]]:
        return sorted((f["code"], f["location"]["line"] if f["location"] else 0) for f in data["findings"])

    assert key(sam_from_pt2[1]) == key(sam_from_target[1])
