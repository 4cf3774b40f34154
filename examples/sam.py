"""SAM's mask-decoder TwoWayTransformer as a qlint target (needs `segment-anything==1.0`).

`segment_anything`'s package `__init__` imports torchvision, which is not
needed by the transformer and does not import beside torch 2.13; the modules it
asks for are stubbed before the import.
"""

from __future__ import annotations

import sys
import types

import torch


def _stub_torchvision() -> None:
    names = {
        "torchvision": [],
        "torchvision.transforms": [],
        "torchvision.transforms.functional": ["resize", "to_pil_image"],
        "torchvision.ops": [],
        "torchvision.ops.boxes": ["batched_nms", "box_area"],
    }
    for name, attributes in names.items():
        module = sys.modules.get(name) or types.ModuleType(name)
        for attribute in attributes:
            setattr(module, attribute, getattr(module, attribute, None))
        sys.modules[name] = module


def make_two_way_transformer() -> tuple:
    if "torchvision" not in sys.modules:
        _stub_torchvision()
    from segment_anything.modeling.transformer import TwoWayTransformer

    torch.manual_seed(0)
    model = TwoWayTransformer(depth=2, embedding_dim=32, mlp_dim=64, num_heads=2).eval()
    generator = torch.Generator().manual_seed(0)

    def batch() -> tuple[torch.Tensor, ...]:
        return (
            torch.randn(1, 32, 4, 4, generator=generator),
            torch.randn(1, 32, 4, 4, generator=generator),
            torch.randn(1, 5, 32, generator=generator),
        )

    example = batch()
    return model, example, [example] + [batch() for _ in range(3)]
