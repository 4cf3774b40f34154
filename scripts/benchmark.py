"""Time `qlint check` against the bare ExecuTorch flow on the same .pt2, in one run.

The bare flow is what any Cortex-M build already pays: `torch.export.load`,
`to_edge` with the Cortex-M compile config and `CortexMPassManager` with the
same pass list qlint uses, no rules. Both run as fresh processes (imports
included), alternating, and the medians are compared.

    python scripts/benchmark.py [--pt2 FILE] [--repeat 3]

Without --pt2 the SAM TwoWayTransformer (segment-anything==1.0) is quantized
and saved to a temporary folder first.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BARE_FLOW = """
import sys, logging
import torch
import torchao.quantization.pt2e.quantize_pt2e  # registers quantized_decomposed ops for load
import executorch.backends.cortex_m.quantizer.quantizer
from executorch.backends.cortex_m.edge_compile_config import cortex_m_edge_compile_config
from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager
from executorch.exir import to_edge
from qlint.lowering import pass_list, target_config

ep = torch.export.load(sys.argv[1])
edge = to_edge(ep, compile_config=cortex_m_edge_compile_config())
CortexMPassManager(edge.exported_program(), passes=pass_list(), target_config=target_config("cortex-m55")).transform()
"""


def make_sam_pt2(folder: Path) -> Path:
    sys.path.insert(0, str(ROOT))
    import torch

    from examples.sam import make_two_way_transformer
    from qlint.quantize import quantize

    model, example, calibration = make_two_way_transformer()
    path = folder / "sam_two_way_transformer.pt2"
    torch.export.save(quantize(model, example, calibration), str(path))
    return path


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pt2", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        pt2 = args.pt2 or make_sam_pt2(Path(tmp))
        bare_cmd = [sys.executable, "-c", BARE_FLOW, str(pt2)]
        qlint_cmd = [sys.executable, "-m", "qlint", "check", "--quiet", str(pt2)]
        bare, lint = [], []
        for _ in range(args.repeat):
            bare.append(timed(bare_cmd))
            lint.append(timed(qlint_cmd))
    b, q = statistics.median(bare), statistics.median(lint)
    print(f"artifact:   {pt2.name}")
    print(f"bare flow:  {b:6.2f} s  (median of {args.repeat}: {', '.join(f'{t:.2f}' for t in bare)})")
    print(f"qlint check:{q:6.2f} s  (median of {args.repeat}: {', '.join(f'{t:.2f}' for t in lint)})")
    print(f"ratio:      {q / b:6.3f}x  (target <= 1.15x)")


if __name__ == "__main__":
    main()
