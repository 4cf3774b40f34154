"""Regenerate the bundled example artifacts: `python examples/make_examples.py`.

The saved stack traces are made relative to the repository root, so findings on
the bundled files point at `examples/models.py` on any checkout.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from examples import models  # noqa: E402
from qlint.loading.quantize import quantize  # noqa: E402


def save(name: str, factory) -> None:  # type: ignore[no-untyped-def]
    import torch

    model, example, calibration = factory()
    program = quantize(model, example, calibration)
    prefix = f'File "{ROOT}/'
    for node in program.graph.nodes:
        trace = node.meta.get("stack_trace")
        if trace:
            node.meta["stack_trace"] = trace.replace(prefix, 'File "')
    torch.export.save(program, str(ROOT / "examples" / f"{name}.pt2"))


if __name__ == "__main__":
    save("attention", models.make_attention)
    save("layernorm", models.make_norm)
