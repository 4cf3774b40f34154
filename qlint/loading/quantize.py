"""Export and quantize a model the way the Cortex-M flow does (PT2E + CortexMQuantizer)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from qlint.io.reads import first_line
from qlint.loading import stack
from qlint.settings.config import Target
from qlint.settings.npus import Npu


class BuildError(Exception):
    """A config target's factory cannot be imported, called or built into a program: one line for
    that target, exit code 2 (the file-level counterpart of `qlint.io.reads.ReadError`)."""


def quantize(
    model: Any,
    example_inputs: tuple[Any, ...],
    calibration: Sequence[tuple[Any, ...]] | None = None,
    per_tensor_config: Any = None,
    npu: Npu | None = None,
) -> Any:
    """A quantized ExportedProgram: export, prepare_pt2e, calibrate, convert_pt2e, export again; with
    `npu`, quantized for its Ethos-U as Arm's flow does (`ethos_u.quantizer`)."""
    from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer

    graph = export_float(model, example_inputs)
    if npu is not None:
        from qlint.loading import ethos_u

        return quantize_graph(graph, example_inputs, calibration, ethos_u.quantizer(npu))
    return quantize_graph(graph, example_inputs, calibration, CortexMQuantizer(per_tensor_config))


def export_float(model: Any, example_inputs: tuple[Any, ...]) -> Any:
    """The float model as the graph module `prepare_pt2e` takes (eval mode, no fused fast paths).

    `check_guards=False` keeps torch 2.13 from inserting a `_guards_fn`
    call_module, which the quantizer's annotation passes reject.
    """
    stack.load()
    import torch

    model = model.eval()
    with torch.no_grad(), without_fast_paths():
        return torch.export.export(model, example_inputs, strict=True).module(check_guards=False)


def quantize_graph(
    graph: Any, example_inputs: tuple[Any, ...], calibration: Sequence[tuple[Any, ...]] | None, quantizer: Any
) -> Any:
    """prepare_pt2e with `quantizer`, calibrate, convert_pt2e, export again."""
    import torch
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    with torch.no_grad(), without_fast_paths():
        prepared = prepare_pt2e(graph, quantizer)
        for batch in calibration or [example_inputs]:
            prepared(*batch)
        converted = convert_pt2e(prepared)
        return torch.export.export(converted, example_inputs, strict=True)


@contextlib.contextmanager
def without_fast_paths() -> Iterator[None]:
    """Export what the model's code says, not PyTorch's fused inference kernels.

    Under `no_grad`, `nn.TransformerEncoderLayer` and `nn.MultiheadAttention` take
    a fast path that exports as one opaque `aten._transformer_encoder_layer_fwd`
    (or `_native_multi_head_attention`), which no quantizer pattern covers.
    """
    import torch

    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(enabled)


def call_factory(target: Target, base: Path, root: Path) -> tuple[Any, tuple[Any, ...], list[tuple[Any, ...]] | None]:
    """Import `package.module:function` (relative to the config's folder) and call it.

    Runs in a child process of its own (see `qlint.run.isolation`), so the module is
    imported once, fresh, as Python does it. Only modules that are files of the
    repository are imported: a config naming `os:fork` gets an error, not a call.
    """
    module_name, func_name = target.factory.split(":")
    if str(base) in sys.path:
        sys.path.remove(str(base))
    sys.path.insert(0, str(base))  # this config's folder wins over any earlier one
    importlib.invalidate_caches()
    what = f"factory {target.factory}"
    try:
        origin = module_file(module_name)
        if origin is None or not _inside(origin, root):
            raise BuildError(f"{module_name} is not a module file of this repository ({origin or 'built in'}); "
                             "factories are imported from the repository only")
        module = importlib.import_module(module_name)
    except BuildError:
        raise
    except SystemExit as exc:
        raise BuildError(f"importing {module_name} called sys.exit({exc.code!r})") from None
    except Exception as exc:
        raise BuildError(f"cannot import {module_name}: {type(exc).__name__}: {first_line(exc)}") from None
    factory = getattr(module, func_name, None)
    if not callable(factory):
        raise BuildError(f"{module_name} has no function {func_name}")
    try:
        result = factory()
    except SystemExit as exc:
        raise BuildError(f"{what} called sys.exit({exc.code!r}) instead of returning") from None
    except Exception as exc:
        raise BuildError(f"{what} raised {type(exc).__name__}: {first_line(exc)}") from None
    if not isinstance(result, tuple) or len(result) not in (2, 3):
        raise BuildError(f"{what} must return (module, example_inputs[, calibration_inputs])")
    try:
        model, example = result[0], tuple(result[1])
        calibration = [tuple(batch) for batch in result[2]] if len(result) == 3 and result[2] else None
    except TypeError as exc:
        raise BuildError(f"{what} must return (module, example_inputs[, calibration_inputs]): {exc}") from None
    return model, example, calibration


def module_file(name: str) -> str | None:
    """Where `name` would be imported from, found without running it (its parent packages do run)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        raise ModuleNotFoundError(f"No module named {name!r}")
    return spec.origin if spec.has_location else None


def _inside(path: str, root: Path) -> bool:
    """Lexically inside `root`: a symlink the repository itself holds counts as the repository's."""
    return Path(os.path.abspath(path)).is_relative_to(Path(os.path.abspath(root)))
