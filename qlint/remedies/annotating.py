"""A quantizer that annotates as the flow's own does, then changes some of the annotations: how the
remedies that act at `prepare_pt2e` (`DerivedScaleQuantizer`, `NormRangesQuantizer`) wrap
CortexMQuantizer, so a user's export script wraps theirs the same way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from qlint.loading import stack

stack.load()

import torch  # noqa: E402
from torch.fx import GraphModule  # noqa: E402
from torchao.quantization.pt2e.quantizer import (  # noqa: E402
    DerivedQuantizationSpec,
    QuantizationSpec,
    Quantizer,
)


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


def derived_spec(spec: QuantizationSpec, derived_from: list[Any],
                 derive: Callable[[list[Any]], tuple[torch.Tensor, torch.Tensor]]) -> DerivedQuantizationSpec:
    """`spec`'s dtype, range and scheme, its qparams computed by `derive` from the observers of the
    edges `derived_from`. A range `spec` leaves open is the dtype's: a derived spec must name one."""
    bounds = torch.iinfo(spec.dtype)
    return DerivedQuantizationSpec(
        derived_from=derived_from, derive_qparams_fn=derive, dtype=spec.dtype,
        quant_min=spec.quant_min if spec.quant_min is not None else bounds.min,
        quant_max=spec.quant_max if spec.quant_max is not None else bounds.max,
        qscheme=spec.qscheme,
    )
