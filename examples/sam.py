"""SAM's mask-decoder TwoWayTransformer as a qlint target (needs `segment-anything==1.0`).

`segment_anything`'s package `__init__` imports torchvision, which is not
needed by the transformer and does not import beside torch 2.13; the modules it
asks for are stubbed during the import.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def _torchvision_stubbed() -> Iterator[None]:
    """Stub modules for the import only: left in `sys.modules`, a stub without `__spec__`
    breaks other libraries' `importlib.util.find_spec("torchvision")` (transformers' among them)."""
    names = {
        "torchvision": [],
        "torchvision.transforms": [],
        "torchvision.transforms.functional": ["resize", "to_pil_image"],
        "torchvision.ops": [],
        "torchvision.ops.boxes": ["batched_nms", "box_area"],
    }
    added = [name for name in names if name not in sys.modules]
    for name in added:
        module = types.ModuleType(name)
        for attribute in names[name]:
            setattr(module, attribute, None)
        sys.modules[name] = module
    try:
        yield
    finally:
        for name in added:
            del sys.modules[name]


def make_two_way_transformer(depth: int = 2) -> tuple:
    with _torchvision_stubbed():
        from segment_anything.modeling.transformer import TwoWayTransformer

    torch.manual_seed(0)
    model = TwoWayTransformer(depth=depth, embedding_dim=32, mlp_dim=64, num_heads=2).eval()
    generator = torch.Generator().manual_seed(0)

    def batch() -> tuple[torch.Tensor, ...]:
        return (
            torch.randn(1, 32, 4, 4, generator=generator),
            torch.randn(1, 32, 4, 4, generator=generator),
            torch.randn(1, 5, 32, generator=generator),
        )

    example = batch()
    return model, example, [example] + [batch() for _ in range(3)]
