"""Turn a path or a config target into a program qlint can analyse.

Loading must never execute code from an artifact. `torch.export.load` unpickles
tensor subclasses, script objects and opaque constants, and falls back to a full
unpickle of the sample inputs when the safe loader refuses them; qlint inspects
the archive first and refuses any pickled payload, then loads with torch forced
into weights-only mode so no fallback can run.
"""

from __future__ import annotations

import contextlib
import json
import os
import zipfile
from pathlib import Path
from typing import Any, Iterator

from qlint import backend


class ReadError(Exception):
    """An input that cannot be read: one line, exit code 2."""


@contextlib.contextmanager
def _weights_only() -> Iterator[None]:
    old = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"]
        else:
            os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = old


def inspect_pt2(path: Path) -> str:
    """Check the archive's layout and payload configs; return the model name."""
    if not path.exists():
        raise ReadError("no such file")
    if not zipfile.is_zipfile(path):
        raise ReadError("not a .pt2 archive (not a zip file)")
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            models = [n for n in names if "/models/" in n and n.endswith(".json")]
            if not models:
                raise ReadError("not a .pt2 archive from torch.export.save (no models/*.json)")
            if len(models) > 1:
                raise ReadError(f"holds {len(models)} programs; qlint reads archives with one")
            prefix, model = models[0].split("/models/")
            model = model.removesuffix(".json")
            legacy = [n for n in names if n.endswith(f"/data/weights/{model}.pt") or n.endswith(f"/data/constants/{model}.pt")]
            if legacy:
                raise ReadError("uses the legacy pickled weight format; re-save it with torch.export.save")
            for kind in ("weights", "constants"):
                config_name = f"{prefix}/data/{kind}/model_{kind}_config.json"
                if config_name not in names:
                    continue
                config = json.loads(archive.read(config_name))
                for fqn, payload in config.get("config", {}).items():
                    if payload.get("use_pickle") or not str(payload.get("path_name", "")).startswith(("weight_", "tensor_")):
                        raise ReadError(f"{kind[:-1]} {fqn!r} is a pickled object; qlint loads plain tensors only")
    except zipfile.BadZipFile as exc:
        raise ReadError(f"corrupt zip archive: {exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ReadError(f"corrupt payload config: {exc}") from None
    return model


def read_pt2(path: Path) -> Any:
    """A quantized ExportedProgram from a .pt2, loaded without unpickling objects."""
    inspect_pt2(path)
    backend.load()
    import torch

    try:
        with _weights_only():
            program = torch.export.load(str(path))
    except Exception as exc:  # torch raises many types for a bad archive
        from qlint.lowering import first_line

        raise ReadError(f"torch.export.load failed: {first_line(exc)}") from None
    if not is_quantized(program):
        raise ReadError("not a quantized program (no quantize/dequantize nodes); run convert_pt2e first")
    return program


def is_quantized(program: Any) -> bool:
    from qlint.graph_view import DEQUANTIZE_OPS, op_name, packet

    return any(packet(op_name(n)) in DEQUANTIZE_OPS for n in program.graph.nodes if n.op == "call_function")


def sample_inputs(program: Any) -> tuple[Any, ...] | None:
    """The example inputs saved with a program, when they are plain positional tensors."""
    example = getattr(program, "example_inputs", None)
    if not example:
        return None
    args, kwargs = example
    return tuple(args) if not kwargs else None
