"""The `layernorm-placement` remedy (Ethos-U targets): every `nn.LayerNorm` left in float on the
CPU instead of quantized onto the NPU, kept only when the whole inference is then cheaper.

`EthosUQuantizer` quantizes LayerNorm, and Arm's backend lowers it to a chain of TOSA operators (a
REDUCE_SUM for the mean, a subtraction, a second reduction for the variance, an rsqrt TABLE, the
rescales between them) that Vela prices operator by operator. Over many elements the NPU is far
cheaper than the core's float LayerNorm; over few (a pooled vector, one token), the chain's fixed
costs can outweigh the CPU's float LayerNorm and the partition split it makes. Which placement is
cheaper depends on the NPU, the core and the tensor, so both are built and measured: the
inference's cycles (Vela's for the partitions, qlint's Cortex-M model for the CPU's ops) and the
SQNR against the float model. A float LayerNorm is the float model's own, so the SQNR rarely
drops; the guard still applies.
"""

from __future__ import annotations

from typing import Any

from qlint.loading import stack

stack.load()

import torch  # noqa: E402

from qlint.remedies.remedy import Remedy, call_nodes, site_name  # noqa: E402
from qlint.settings.config import RemedyName  # noqa: E402

_LAYER_NORM = f"{torch.nn.LayerNorm.__module__}.{torch.nn.LayerNorm.__qualname__}"


class LayerNormPlacement(Remedy):
    """Leave `nn.LayerNorm`s unquantized: every one (`set_module_type(nn.LayerNorm, None)`), or those
    `at` names (`set_module_name(path, None)`); the CPU runs them in float between the NPU's partitions."""

    name = RemedyName.LAYERNORM_PLACEMENT
    for_npu = True
    user_change = ("quantizer.set_module_type(torch.nn.LayerNorm, None)  # before prepare_pt2e: "
                   "each LayerNorm runs in float on the CPU",)

    def __init__(self, at: frozenset[str] | None = None) -> None:
        self.at = at  # the LayerNorms (module paths) placed on the CPU; None: every one

    def not_applicable(self, graph: Any) -> str | None:
        if not layer_norm_modules(graph):
            return "the model has no nn.LayerNorm module (the quantizer places a LayerNorm by its module)"
        return None

    def sites(self, graph: Any) -> list[str]:
        return layer_norm_modules(graph)

    def placed(self, sites: frozenset[str]) -> LayerNormPlacement:
        """This remedy for the LayerNorms `sites` names alone (`sites(graph)` names them all)."""
        return LayerNormPlacement(sites)

    def on_quantizer(self, quantizer: Any) -> Any:
        if self.at is None:
            return quantizer.set_module_type(torch.nn.LayerNorm, None)
        for site in sorted(self.at):  # only None configs: no precedence between the quantizer's finders
            quantizer.set_module_name(site, None)
        return quantizer

    def user_lines(self) -> tuple[str, ...]:
        if self.at is None:
            return self.user_change
        return tuple(f"quantizer.set_module_name({site!r}, None)  # before prepare_pt2e: this LayerNorm runs in "
                     "float on the CPU" for site in sorted(self.at))


def layer_norm_modules(graph: Any) -> list[str]:
    """The paths of the `nn.LayerNorm` modules whose `layer_norm` calls the exported float `graph` holds."""
    found = []
    for node in call_nodes(graph, torch.ops.aten.layer_norm.default):
        stack_ = node.meta.get("nn_module_stack") or {}
        if stack_:
            _, kind = list(stack_.values())[-1]
            name = kind if isinstance(kind, str) else f"{kind.__module__}.{kind.__qualname__}"
            if name == _LAYER_NORM:  # the quantizer's module-type filter matches the type itself, not a subclass
                found.append(site_name(node))  # the path its module-name filter matches
    return list(dict.fromkeys(found))
