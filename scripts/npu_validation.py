"""The NPU rows of docs/cost-model.md: Vela's estimate, as qlint lowers a model, beside published
cycle counts of the same architecture on an Ethos-U.

MobileNetV2 1.0 at 224x224 is `transformers`' `MobileNetV2ForImageClassification` (1001 classes, as
the TFLite model Arm's ML Embedded Evaluation Kit runs; padding inside each convolution, as TFLite's
`SAME` convolutions pad, not `tf_padding`'s separate pad ops, which the NPU would run as passes of
their own) with random weights
(nothing is downloaded), quantized with `EthosUQuantizer` and lowered for an Ethos-U55-128 in each
memory mode the published figures used. Vela's cycles depend on the weights only through their
compression, so random weights are an approximation the rows say.

    python scripts/npu_validation.py
"""

from __future__ import annotations

import time

import torch

from qlint.loading import ethos_u
from qlint.loading.quantize import export_float, quantize_graph
from qlint.settings.npus import Npu, npu

# Published NPU cycles of MobileNetV2 1.0 224 int8 on an Ethos-U55-128 (Corstone-300 FVP, whose NPU
# model is cycle-approximate), by Vela memory mode.
PUBLISHED = {
    "Shared_Sram": (7_345_741, "Arm ML Embedded Evaluation Kit, img_class use case, 'NPU ACTIVE cycles: 7345741' "
                               "(github.com/alifsemi/alif_ml-embedded-evaluation-kit @e7a0393, "
                               "docs/use_cases/img_class.md)"),
    "Sram_Only": (5_500_000, "ExecuTorch test_model.py --target=ethos-u55-128 --model=mv2, '5.5M NPU cycles on mv2 "
                             "when using Sram_Only' (github.com/pytorch/executorch/pull/9830, rounded)"),
}


def mobilenet_v2() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    torch.manual_seed(0)
    config = MobileNetV2Config(image_size=224, num_labels=1001, tf_padding=False)
    model = MobileNetV2ForImageClassification(config).eval()

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            return self.model(pixel_values=pixel_values).logits

    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randn(1, 3, 224, 224, generator=generator),) for _ in range(3)]
    return Logits().eval(), batches[0], batches[1:]


def main() -> None:
    module, example, calibration = mobilenet_v2()
    accelerator = npu("ethos-u55-128")
    started = time.perf_counter()
    program = quantize_graph(export_float(module, example), example, calibration, ethos_u.quantizer(accelerator))
    print(f"quantized in {time.perf_counter() - started:.0f} s")
    for mode, (published, source) in PUBLISHED.items():
        target = Npu(accelerator.accelerator, accelerator.system_config, mode)
        started = time.perf_counter()
        delegation = ethos_u.lower(program, target).delegation
        cycles = delegation.npu_cycles
        assert cycles is not None
        print(f"{mode}: {len(delegation.blobs)} partition(s), Vela {cycles:,} cycles "
              f"({sum(c.estimate.compute_cycles for c in delegation.compiled.values()):,} without memory), "
              f"published {published:,}: {cycles / published:.2f}x; lowered in {time.perf_counter() - started:.0f} s"
              f"\n  {source}")


if __name__ == "__main__":
    main()
