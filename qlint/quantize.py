"""Export and quantize a model the way the Cortex-M flow does (PT2E + CortexMQuantizer)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any, Sequence

from qlint import backend
from qlint.config import Target
from qlint.readers import ReadError


def quantize(
    model: Any,
    example_inputs: tuple[Any, ...],
    calibration: Sequence[tuple[Any, ...]] | None = None,
    per_tensor_config: Any = None,
) -> Any:
    """A quantized ExportedProgram: export, prepare_pt2e, calibrate, convert_pt2e, export again.

    `check_guards=False` keeps torch 2.13 from inserting a `_guards_fn`
    call_module, which the quantizer's annotation passes reject.
    """
    backend.load()
    import torch
    from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    model = model.eval()
    with torch.no_grad():
        graph = torch.export.export(model, example_inputs, strict=True).module(check_guards=False)
        prepared = prepare_pt2e(graph, CortexMQuantizer(per_tensor_config))
        for batch in calibration or [example_inputs]:
            prepared(*batch)
        converted = convert_pt2e(prepared)
        return torch.export.export(converted, example_inputs, strict=True)


def call_factory(target: Target, root: Path) -> tuple[Any, tuple[Any, ...], list[tuple[Any, ...]] | None]:
    """Import `package.module:function` (relative to the config's folder) and call it."""
    module_name, func_name = target.factory.split(":")
    if str(root) in sys.path:
        sys.path.remove(str(root))
    sys.path.insert(0, str(root))  # this config's folder wins over any earlier one
    # Always the model code as it is now: a module imported for an earlier
    # config (or before an edit) must not answer for this one.
    sys.modules.pop(module_name, None)
    importlib.invalidate_caches()
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ReadError(f"cannot import {module_name}: {type(exc).__name__}: {exc}") from None
    factory = getattr(module, func_name, None)
    if not callable(factory):
        raise ReadError(f"{module_name} has no function {func_name}")
    try:
        result = factory()
    except Exception as exc:
        raise ReadError(f"factory {target.factory} raised {type(exc).__name__}: {exc}") from None
    if not isinstance(result, tuple) or len(result) not in (2, 3):
        raise ReadError(
            f"factory {target.factory} must return (module, example_inputs[, calibration_inputs])"
        )
    model, example = result[0], tuple(result[1])
    calibration = [tuple(batch) for batch in result[2]] if len(result) == 3 and result[2] else None
    return model, example, calibration


def quantize_target(target: Target, root: Path) -> tuple[Any, tuple[Any, ...], list[tuple[Any, ...]] | None]:
    """The quantized program, its example inputs and its calibration batches."""
    model, example, calibration = call_factory(target, root)
    try:
        return quantize(model, example, calibration), example, calibration
    except Exception as exc:
        from qlint.lowering import first_line

        raise ReadError(f"export/quantization failed: {type(exc).__name__}: {first_line(exc)}") from None
