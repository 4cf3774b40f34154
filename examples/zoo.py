"""Public architectures at tiny configs with seeded random weights (no downloads).

Built from `transformers`' model classes (which need neither torchvision nor timm),
`torch.nn.TransformerEncoder` and SAM's `TwoWayTransformer`. Each factory returns
`(model, example_inputs, calibration_batches)` like the ones in `examples/models.py`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from examples.models import as_channels_last, make_transformer_encoder
from examples.sam import make_two_way_transformer

Factory = Callable[[], tuple]


class LastHiddenState(torch.nn.Module):
    """The model called with one tensor keyword (`inputs_embeds`, `pixel_values`, …), no mask."""

    def __init__(self, model: torch.nn.Module, key: str) -> None:
        super().__init__()
        self.model, self.key = model.eval(), key

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(**{self.key: x}).last_hidden_state


def _built(model: torch.nn.Module, key: str, shape: tuple[int, ...]) -> tuple:
    generator = torch.Generator().manual_seed(1)
    example = (torch.randn(shape, generator=generator),)
    return LastHiddenState(model, key), example, [example, (torch.randn(shape, generator=generator),)]


def make_bert(layers: int = 2) -> tuple:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=16, attn_implementation="eager")
    return _built(BertModel(config), "inputs_embeds", (1, 8, 32))


def make_distilbert() -> tuple:
    from transformers import DistilBertConfig, DistilBertModel

    torch.manual_seed(0)
    config = DistilBertConfig(vocab_size=64, dim=32, n_layers=1, n_heads=2, hidden_dim=64,
                              max_position_embeddings=16, attn_implementation="eager")
    return _built(DistilBertModel(config), "inputs_embeds", (1, 8, 32))


class Masked(torch.nn.Module):
    """The model called with `inputs_embeds` and a padding `attention_mask`, as a tokenizer gives it."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model.eval()

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(inputs_embeds=inputs_embeds, attention_mask=attention_mask).last_hidden_state


def make_roberta_masked() -> tuple:
    from transformers import RobertaConfig, RobertaModel

    torch.manual_seed(0)
    config = RobertaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=24, attn_implementation="eager")
    generator = torch.Generator().manual_seed(1)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0]])
    batches = [(torch.randn((1, 8, 32), generator=generator), mask) for _ in range(2)]
    return Masked(RobertaModel(config, add_pooling_layer=False)), batches[0], batches


class TokenIds(torch.nn.Module):
    """The model called with token ids, as a tokenizer gives them: its word embedding looks them up."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model.eval()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids).last_hidden_state


def make_distilbert_tokens() -> tuple:
    """DistilBERT from token ids (not in ZOO: its embedding is what an NPU target's gather fold is for)."""
    from transformers import DistilBertConfig, DistilBertModel

    torch.manual_seed(0)
    config = DistilBertConfig(vocab_size=64, dim=32, n_layers=1, n_heads=2, hidden_dim=64,
                              max_position_embeddings=16, attn_implementation="eager")
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randint(0, 64, (1, 8), generator=generator),) for _ in range(2)]
    return TokenIds(DistilBertModel(config)), batches[0], batches


def make_vit() -> tuple:
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(0)
    config = ViTConfig(image_size=16, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=1,
                       num_attention_heads=2, intermediate_size=64, attn_implementation="eager")
    return _built(ViTModel(config, add_pooling_layer=False), "pixel_values", (1, 3, 16, 16))


def make_whisper_encoder() -> tuple:
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    torch.manual_seed(0)
    config = WhisperConfig(num_mel_bins=8, d_model=32, encoder_layers=1, encoder_attention_heads=2,
                           encoder_ffn_dim=64, max_source_positions=8, attn_implementation="eager")
    return _built(WhisperEncoder(config), "input_features", (1, 8, 16))


def make_mobilevit() -> tuple:
    from transformers import MobileViTConfig, MobileViTModel

    torch.manual_seed(0)
    config = MobileViTConfig(image_size=32, patch_size=2, hidden_sizes=[16, 16, 16],
                             neck_hidden_sizes=[8, 8, 16, 16, 16, 16, 32], num_attention_heads=2,
                             attn_implementation="eager")
    return _built(MobileViTModel(config, expand_output=False), "pixel_values", (1, 3, 32, 32))


def make_convnext() -> tuple:
    from transformers import ConvNextConfig, ConvNextModel

    torch.manual_seed(0)
    config = ConvNextConfig(num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, image_size=16)
    return _built(ConvNextModel(config), "pixel_values", (1, 3, 16, 16))


def make_resnet() -> tuple:
    from transformers import ResNetConfig, ResNetModel

    torch.manual_seed(0)
    config = ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic")
    return _built(ResNetModel(config), "pixel_values", (1, 3, 16, 16))


def make_resnet_channels_last() -> tuple:
    return as_channels_last(*make_resnet())


def make_mobilenet() -> tuple:
    from transformers import MobileNetV2Config, MobileNetV2Model

    torch.manual_seed(0)
    config = MobileNetV2Config(num_channels=3, image_size=32, depth_multiplier=0.25)
    return _built(MobileNetV2Model(config, add_pooling_layer=False), "pixel_values", (1, 3, 32, 32))


def make_mobilenet_channels_last() -> tuple:
    return as_channels_last(*make_mobilenet())


ZOO: dict[str, Factory] = {
    "bert": make_bert,
    "distilbert": make_distilbert,
    "vit": make_vit,
    "whisper_encoder": make_whisper_encoder,
    "mobilevit": make_mobilevit,
    "convnext": make_convnext,
    "resnet": make_resnet,
    "resnet_channels_last": make_resnet_channels_last,
    "mobilenet": make_mobilenet,
    "mobilenet_channels_last": make_mobilenet_channels_last,
    "transformer_encoder": make_transformer_encoder,
    "two_way_transformer": make_two_way_transformer,
}
