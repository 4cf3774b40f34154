"""A quantizer that annotates as the flow's own does, then changes some of the annotations: how the
remedies that act at `prepare_pt2e` (`DerivedScaleQuantizer`, `NormRangesQuantizer`) wrap
CortexMQuantizer, so a user's export script wraps theirs the same way."""

from __future__ import annotations

from typing import Any

from qlint.loading import stack

stack.load()

from torch.fx import GraphModule  # noqa: E402
from torchao.quantization.pt2e.quantizer import Quantizer  # noqa: E402


class AnnotatingQuantizer(Quantizer):
    """`inner`'s transform, annotations and validation, with `reannotate` run on its annotations."""

    def __init__(self, inner: Quantizer) -> None:
        super().__init__()
        self.inner = inner

    def transform_for_annotation(self, model: Any) -> Any:
        return self.inner.transform_for_annotation(model)

    def annotate(self, model: Any) -> Any:
        return self.reannotate(self.inner.annotate(model))

    def reannotate(self, model: GraphModule) -> GraphModule:
        """`model` as `inner` annotated it, with this quantizer's changes."""
        raise NotImplementedError

    def validate(self, model: Any) -> None:
        self.inner.validate(model)
