"""Public architectures from `transformers`, at tiny configs with seeded random weights (no
downloads): their attention scales hide behind in-graph constants and masks, and stay fp32 for
reasons decided at export and quantization time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from qlint.api import fix
from qlint.config import Config
from qlint.graph_view import op_name
from qlint.program import lint_program

pytestmark = pytest.mark.slow


class LastHiddenState(torch.nn.Module):
    """The model called with one tensor keyword (`inputs_embeds`, `pixel_values`), no mask."""

    def __init__(self, model: torch.nn.Module, key: str) -> None:
        super().__init__()
        self.model, self.key = model.eval(), key

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(**{self.key: x}).last_hidden_state


def bert() -> tuple[torch.nn.Module, tuple[int, ...]]:
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=16, attn_implementation="eager")
    return LastHiddenState(BertModel(config), "inputs_embeds"), (1, 8, 32)


def distilbert() -> tuple[torch.nn.Module, tuple[int, ...]]:
    from transformers import DistilBertConfig, DistilBertModel

    config = DistilBertConfig(vocab_size=64, dim=32, n_layers=1, n_heads=2, hidden_dim=64,
                              max_position_embeddings=16, attn_implementation="eager")
    return LastHiddenState(DistilBertModel(config), "inputs_embeds"), (1, 8, 32)


def vit() -> tuple[torch.nn.Module, tuple[int, ...]]:
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(image_size=16, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=1,
                       num_attention_heads=2, intermediate_size=64, attn_implementation="eager")
    return LastHiddenState(ViTModel(config, add_pooling_layer=False), "pixel_values"), (1, 3, 16, 16)


ZOO: dict[str, Callable[[], tuple[torch.nn.Module, tuple[int, ...]]]] = {
    "bert": bert, "distilbert": distilbert, "vit": vit,
}


@pytest.fixture(scope="module")
def zoo() -> dict[str, tuple[Any, tuple[torch.Tensor, ...]]]:
    """name -> (quantized program, example inputs)."""
    from qlint.quantize import quantize

    built = {}
    for name, make in ZOO.items():
        torch.manual_seed(0)
        model, shape = make()
        generator = torch.Generator().manual_seed(1)
        example = (torch.randn(shape, generator=generator),)
        calibration = [example, (torch.randn(shape, generator=generator),)]
        built[name] = (quantize(model, example, calibration), example)
    return built


def scales(findings: list[Any]) -> list[Any]:
    return [f for f in findings if f.code == "QL001"]


@pytest.mark.parametrize("name", list(ZOO))
def test_every_eager_attention_scale_is_ql001_and_folds_bit_exact(
    zoo: dict[str, tuple[Any, tuple[torch.Tensor, ...]]], name: str
) -> None:
    program, example = zoo[name]
    layers = {"bert": 2, "distilbert": 1, "vit": 1}[name]
    found = scales(lint_program(program, name, Config()).findings)
    assert len(found) == layers
    assert all(f.fixable for f in found)
    # Located in the library's own attention code, where the scale is written.
    assert all(f.location.path.startswith(f"transformers/models/{name}/modeling_") for f in found), [
        str(f.location) for f in found
    ]
    result = fix(program, [example])
    assert [f.code for f in result.summary.folds].count("QL001") == layers
    assert scales(result.findings) == []
    assert not any(op_name(n).startswith(("aten.div", "aten.mul")) for n in result.program.graph.nodes
                   if n.op == "call_function")
    assert result.summary.verified_inputs == 9  # the example and 8 seeded batches, bit for bit


def test_bert_scale_carries_the_mask_built_in_the_graph(zoo: dict[str, tuple[Any, tuple[torch.Tensor, ...]]]) -> None:
    """No attention_mask passed: BERT still adds (1 - ones) * finfo.min, built with aten.full."""
    [first, _] = scales(lint_program(zoo["bert"][0], "bert", Config()).findings)
    assert [(c["op"], c["kind"]) for c in first.details["constants"]] == [("div", "buffer"), ("add", "computed")]
    assert first.details["constants"][1]["value"] == 0.0 and first.details["identity"]


def test_distilbert_masked_fill_with_an_empty_mask_folds_away(zoo: dict[str, tuple[Any, tuple[torch.Tensor, ...]]]) -> None:
    program, example = zoo["distilbert"]
    [where] = [f for f in lint_program(program, "distilbert", Config()).findings if "aten.where.self" in f.details.get("ops", [])]
    assert where.code == "QL002" and where.fixable
    assert where.details["reason"] == "aten.where.self: no CortexMQuantizer pattern covers it"
    assert ("QL002", "identity") in [(f.code, f.kind) for f in fix(program, [example]).summary.folds]


def test_vit_patch_embedding_names_channels_last(zoo: dict[str, tuple[Any, tuple[torch.Tensor, ...]]]) -> None:
    findings = lint_program(zoo["vit"][0], "vit", Config()).findings
    [conv] = [f for f in findings if f.details.get("ops") == ["aten.convolution.default"]]
    assert "CortexMConv2DCheck" in conv.details["reason"]
    assert "model.to(memory_format=torch.channels_last)" in conv.details["reason"]


def test_convnext_stem_island_keeps_the_convolution_cause() -> None:
    """The NCHW stem conv and the LayerNorm after it are one island: both causes are named."""
    from transformers import ConvNextConfig, ConvNextModel

    from qlint.quantize import quantize

    torch.manual_seed(0)
    config = ConvNextConfig(num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, image_size=16)
    example = (torch.randn((1, 3, 16, 16), generator=torch.Generator().manual_seed(1)),)
    program = quantize(LastHiddenState(ConvNextModel(config), "pixel_values"), example, [example])
    [stem] = [f for f in lint_program(program, "convnext", Config()).findings
              if "aten.convolution.default" in f.details.get("ops", [])]
    assert stem.details["reason"].startswith("data-dependent normalization (aten.native_layer_norm.default); "
                                             "aten.convolution.default: CortexMQuantizer's conv2d pattern refused it")
