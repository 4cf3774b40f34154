"""Measure what ExecuTorch's own runtime takes from the method allocator to load a `.pte`.

Builds `scripts/method_allocator.cpp` against the wheel's `libexecutorch.so` and headers (g++), then
loads each program's `forward` with stub kernels registered under its operators' names (loading
resolves kernels, never runs them) and prints the allocator's used bytes next to qlint's figure
(`qlint.device.memory.method_allocator_bytes`). The host is 64-bit, as qlint's figure is.

    python scripts/method_allocator.py model.pte [...]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def build(folder: Path) -> Path:
    """The harness binary, compiled into `folder`."""
    import executorch.exir
    import torch

    root = Path(executorch.exir.__file__).parent.parent
    binary = folder / "method_allocator"
    subprocess.run(
        ["g++", "-std=c++17", "-O1", f"-I{root / 'include'}",
         f"-I{root / 'include/executorch/runtime/core/portable_type/c10'}",
         f"-I{Path(torch.__file__).parent / 'include'}",
         str(HERE / "method_allocator.cpp"), f"-L{root / 'lib'}", "-lexecutorch", f"-Wl,-rpath,{root / 'lib'}",
         "-o", str(binary)],
        check=True, capture_output=True, text=True)
    return binary


def measure(binary: Path, pte: Path) -> int:
    """The method allocator's used bytes after ExecuTorch loads `pte`'s forward."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    plan = deserialize_pte_binary(pte.read_bytes()).program.execution_plan[0]
    names = sorted({op.name + (f".{op.overload}" if op.overload else "") for op in plan.operators})
    result = subprocess.run([str(binary), str(pte), *names], capture_output=True, text=True, check=False)
    line = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    if result.returncode != 0 or not line.startswith("method_allocator_bytes="):
        raise RuntimeError(f"{pte}: {line or result.stderr.strip()[-300:]}")
    return int(line.split("=")[1])


def main() -> None:
    from executorch.exir._serialize._program import deserialize_pte_binary

    from qlint.device.memory import method_allocator_bytes

    with tempfile.TemporaryDirectory() as tmp:
        binary = build(Path(tmp))
        for name in sys.argv[1:]:
            pte = Path(name)
            ours = method_allocator_bytes(deserialize_pte_binary(pte.read_bytes()).program.execution_plan[0])
            print(f"{pte}: runtime {measure(binary, pte)} B, qlint {ours} B")


if __name__ == "__main__":
    main()
