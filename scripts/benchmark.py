"""Time `qlint check` and `qlint check --fix` against the bare ExecuTorch flow, and the cache, in one run.

The bare flow is what any Cortex-M build already pays: `torch.export.load`,
`to_edge` with the Cortex-M compile config and `CortexMPassManager` with the
same pass list qlint uses, no rules; for `--fix` also `to_executorch` and
writing the .pte, no folds. All run as fresh processes (imports included),
interleaved. On a shared machine one command's wall time varies by 20 % from run
to run, so three ratios are printed: of the median wall times, of the fastest
runs (the least disturbed, timeit's rule) and of the median CPU seconds.

    python scripts/benchmark.py [--pt2 FILE] [--repeat 3] [--target]
    python scripts/benchmark.py --npu ethos-u55-128 [--repeat 3]

`qlint check --static` (the torch-free tier) is timed against the full check,
whole processes both, with `qlint --version` as the floor of any qlint process.

With --target, `qlint check --fix` on SAM as a config target (plainly, and with
--unsafe-fixes: every remedy tried, measured and the kept ones built together)
is timed against the target's plain flow: factory, export and quantization,
lowering, to_executorch; and the `qlint-targets` hook's check, cold and after a
commit that touched only an unrelated `.py` file (answered from the cache).
Without --pt2 the SAM TwoWayTransformer (segment-anything==1.0) is quantized
and saved to a temporary folder first.

With --npu, the attention of examples/npu.py with its `/ sqrt(d)` left float (2
partitions) is quantized for that Ethos-U as Arm's flow does, and `qlint check
--target` and `--fix` are timed against Arm's own flow on the same `.pt2`:
`to_edge_transform_and_lower` with `EthosUPartitioner` (Vela compiling each
partition), the cortex_m quantize/dequantize pass, and for `--fix` `to_executorch`.
"""

from __future__ import annotations

import argparse
import functools
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The installed console script, as pre-commit and CI run it. Not `python -m qlint`: on CPython
# 3.11 the frame data stack grows in 16 KiB chunks that are mapped and unmapped as a hot loop's
# depth crosses a chunk boundary, and runpy's extra frames put SAM's lowering on one (measured
# here: 320,000 munmap calls, +2 s of system time); the console script's depth does not.
_SCRIPT = Path(sys.executable).with_name("qlint")
QLINT = [str(_SCRIPT)] if _SCRIPT.is_file() else [sys.executable, "-m", "qlint"]

BARE_FLOW = """
import sys, logging
import torch
import torchao.quantization.pt2e.quantize_pt2e  # registers quantized_decomposed ops for load
import executorch.backends.cortex_m.quantizer.quantizer
from executorch.backends.cortex_m.edge_compile_config import cortex_m_edge_compile_config
from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager
from executorch.exir import to_edge
from qlint.loading.lowering import pass_list, target_config

ep = torch.export.load(sys.argv[1])
edge = to_edge(ep, compile_config=cortex_m_edge_compile_config())
manager = CortexMPassManager(edge.exported_program(), passes=pass_list(), target_config=target_config("cortex-m55"))
lowered = manager.transform()
if len(sys.argv) > 2:
    from executorch.exir import EdgeProgramManager

    manager = EdgeProgramManager({"forward": lowered}, compile_config=cortex_m_edge_compile_config())
    open(sys.argv[2], "wb").write(manager.to_executorch().buffer)
"""

# Arm's flow on a `.pt2` quantized for an Ethos-U: partitioned and lowered (Vela compiles each
# partition), then the cortex_m quantize/dequantize kernels for what stays on the CPU.
NPU_FLOW = """
import sys
import torch
import torchao.quantization.pt2e.quantize_pt2e  # registers quantized_decomposed ops for load
from executorch.backends.arm.ethosu import EthosUCompileSpec, EthosUPartitioner
from executorch.backends.cortex_m.passes.replace_quant_nodes_pass import ReplaceQuantNodesPass
from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

ep = torch.export.load(sys.argv[1])
spec = EthosUCompileSpec(sys.argv[2])
edge = to_edge_transform_and_lower(ep, partitioner=[EthosUPartitioner(spec)],
                                   compile_config=EdgeCompileConfig(_check_ir_validity=False))
edge = edge.transform([ReplaceQuantNodesPass()])
if len(sys.argv) > 3:
    open(sys.argv[3], "wb").write(edge.to_executorch().buffer)
"""

# A target's whole plain flow: the factory, export + quantize, to_edge + the passes, to_executorch.
TARGET_FLOW = """
import sys
sys.path.insert(0, sys.argv[1])
from examples.sam import make_two_way_transformer
from qlint.loading.quantize import quantize
from qlint.loading.lowering import run_passes, to_edge
from executorch.backends.cortex_m.edge_compile_config import cortex_m_edge_compile_config
from executorch.exir import EdgeProgramManager

model, example, calibration = make_two_way_transformer()
lowered = run_passes(to_edge(quantize(model, example, calibration)).exported_program())
manager = EdgeProgramManager({"forward": lowered}, compile_config=cortex_m_edge_compile_config())
open(sys.argv[2], "wb").write(manager.to_executorch().buffer)
"""

# The factory module beside the config, importing a copy of examples/sam.py there (a module
# that changes sys.path would never be answered from the cache).
TARGET_MODULE = "from examples.sam import make_two_way_transformer as make\n"


def make_sam_pt2(folder: Path) -> Path:
    sys.path.insert(0, str(ROOT))
    import torch

    from examples.sam import make_two_way_transformer
    from qlint.loading.quantize import quantize

    model, example, calibration = make_two_way_transformer()
    path = folder / "sam_two_way_transformer.pt2"
    torch.export.save(quantize(model, example, calibration), str(path))
    return path


def make_npu_pt2(folder: Path, accelerator: str) -> Path:
    """The attention with its scale left float, quantized for `accelerator` as Arm's flow does."""
    sys.path.insert(0, str(ROOT))
    import torch

    from examples.npu import FLOAT_OPS, make_attention
    from qlint.loading import ethos_u
    from qlint.loading.quantize import export_float, quantize_graph
    from qlint.settings.npus import npu

    model, example, calibration = make_attention()
    quantizer = ethos_u.quantizer(npu(accelerator))
    for name in FLOAT_OPS["make_attention"]:
        quantizer.set_node_target(functools.reduce(getattr, name.split("."), torch.ops), None)
    path = folder / "attention_npu.pt2"
    torch.export.save(quantize_graph(export_float(model, example), example, calibration, quantizer), str(path))
    return path


def npu_main(accelerator: str, repeat: int) -> None:
    """`qlint check --target` and `--fix` against Arm's flow on the same `.pt2`, as the CPU flow's are."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        pt2 = make_npu_pt2(out, accelerator)
        commands = {
            "Arm flow": [sys.executable, "-c", NPU_FLOW, str(pt2), accelerator],
            "qlint check": [*QLINT, "check", "--no-cache", "--quiet", "--target", accelerator, str(pt2)],
            "Arm flow + .pte": [sys.executable, "-c", NPU_FLOW, str(pt2), accelerator, str(out / "arm.pte")],
            "qlint --fix": [*QLINT, "check", "--fix", "--quiet", "--target", accelerator, "--output-dir", str(out),
                            str(pt2)],
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        cpu: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(repeat):
            for name, command in commands.items():
                times[name].append(timed(command, cpu[name]))
    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"artifact: {pt2.name} for {accelerator}, median of {repeat} runs each")
    for name, values in times.items():
        print(f"  {name:16s} {median[name]:6.2f} s   ({', '.join(f'{t:.2f}' for t in values)}), "
              f"{statistics.median(cpu[name]):.2f} s CPU")
    for ours, theirs in (("qlint check", "Arm flow"), ("qlint --fix", "Arm flow + .pte")):
        print(f"{ours} ratio: {median[ours] / median[theirs]:.3f}x wall (median), "
              f"{min(times[ours]) / min(times[theirs]):.3f}x wall (fastest runs), "
              f"{statistics.median(cpu[ours]) / statistics.median(cpu[theirs]):.3f}x CPU")


def timed(command: list[str], cpu: list[float] | None = None) -> float:
    """Wall seconds of one fresh process; its CPU seconds (user + system) go to `cpu`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr}")
    if cpu is not None:
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pt2", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--target", action="store_true",
                        help="also time `qlint fix` (plain and --unsafe-fixes) on SAM as a config target")
    parser.add_argument("--npu", metavar="ACCELERATOR",
                        help="time the NPU check and fix against Arm's Ethos-U flow instead (ethos-u55-128)")
    args = parser.parse_args()
    if args.npu:
        npu_main(args.npu, args.repeat)
        return
    with tempfile.TemporaryDirectory() as tmp:
        pt2 = args.pt2 or make_sam_pt2(Path(tmp))
        out = Path(tmp)
        commands = {
            "bare flow": [sys.executable, "-c", BARE_FLOW, str(pt2)],
            "qlint check": [*QLINT, "check", "--no-cache", "--quiet", str(pt2)],
            "qlint check --static": [*QLINT, "check", "--static", "--no-cache", "--quiet", str(pt2)],
            "qlint --version": [*QLINT, "--version"],
            "bare flow + .pte": [sys.executable, "-c", BARE_FLOW, str(pt2), str(out / "bare.pte")],
            "qlint --fix": [
                *QLINT, "check", "--fix", "--quiet", "--output-dir", str(out), str(pt2)
            ],
            # budgets and metrics measure the program --fix would write: serialized, not lowered again
            "check, measured": [*QLINT, "check", "--no-cache", "--quiet", "--write", f"metrics:{out / 'm.json'}",
                                str(pt2)],
        }
        if args.target:
            (out / "sam_target.py").write_text(TARGET_MODULE)
            (out / "examples").mkdir()
            shutil.copy(ROOT / "examples" / "sam.py", out / "examples" / "sam.py")
            config = out / ".qlint.yaml"
            config.write_text("targets:\n  - name: sam\n    factory: sam_target:make\n")
            fix_target = [*QLINT, "check", "--fix", "--quiet", "--targets-only", "--config", str(config),
                          "--output-dir", str(out)]
            commands |= {
                "target flow + .pte": [sys.executable, "-c", TARGET_FLOW, str(ROOT), str(out / "target.pte")],
                "qlint fix target": fix_target,
                "  --unsafe-fixes": [*fix_target, "--unsafe-fixes"],
            }
        times: dict[str, list[float]] = {name: [] for name in commands}
        cpu: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.repeat):
            for name, command in commands.items():
                times[name].append(timed(command, cpu[name]))
        # The result cache: a cold check (empty cache) then a warm one of the same file.
        cached = [*QLINT, "check", "--quiet", "--cache-dir", str(out / "cache"), str(pt2)]
        times["check, cold cache"], times["check, warm cache"] = [], []
        for _ in range(args.repeat):
            timed(["rm", "-rf", str(out / "cache")])
            times["check, cold cache"].append(timed(cached))
            times["check, warm cache"].append(timed(cached))
        if args.target:
            # The qlint-targets hook: cold, then after a commit that touched an unrelated .py file.
            hook = [*QLINT, "check", "--quiet", "--targets-only", "--config", str(config),
                    "--cache-dir", str(out / "target-cache")]
            times["target check, cold"], times["  unrelated .py"] = [], []
            for run in range(args.repeat):
                timed(["rm", "-rf", str(out / "target-cache")])
                times["target check, cold"].append(timed(hook))
                (out / "unrelated.py").write_text(f"EPOCHS = {run}\n")
                times["  unrelated .py"].append(timed(hook))
    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"artifact: {pt2.name}, median of {args.repeat} runs each")
    for name, values in times.items():
        print(f"  {name:18s} {median[name]:6.2f} s   ({', '.join(f'{t:.2f}' for t in values)})")
    for name, values in cpu.items():
        if "target" not in name and "unsafe" not in name:
            print(f"  {name:18s} {statistics.median(values):6.2f} s CPU (user + system, median)")

    def ratios(ours: str, bare: str, with_cpu: bool = True) -> str:
        wall = median[ours] / median[bare]
        fastest = min(times[ours]) / min(times[bare])
        text = f"{wall:.3f}x wall (median), {fastest:.3f}x wall (fastest runs)"
        if with_cpu:
            text += f", {statistics.median(cpu[ours]) / statistics.median(cpu[bare]):.3f}x CPU"
        return text

    print(f"check ratio: {ratios('qlint check', 'bare flow')}  (target <= 1.15x)")
    print(f"fix ratio:   {ratios('qlint --fix', 'bare flow + .pte')}  (target <= 1.20x)")
    print(f"measured check ratio (budgets, --write metrics:): {ratios('check, measured', 'bare flow + .pte')}")
    if args.target:
        # a target runs in a forkserver's child, whose CPU time this process cannot collect
        print(f"target fix ratio: {ratios('qlint fix target', 'target flow + .pte', False)}")
        print(f"target fix with every remedy: {ratios('  --unsafe-fixes', 'target flow + .pte', False)}"
              "  (the plain build, each applicable remedy alone, the kept ones together)")
    print(f"cache speed-up: {median['check, cold cache'] / median['check, warm cache']:.1f}x  (target >= 20x)")
    static = median["qlint check --static"]
    print(f"static tier: {static:.3f} s, {median['qlint check'] / static:.0f}x faster than the full check "
          f"(target >= 50x; `qlint --version` takes {median['qlint --version']:.3f} s)")
    if args.target:
        print(f"target hook, unrelated .py touched: {median['  unrelated .py']:.2f} s, "
              f"{median['target check, cold'] / median['  unrelated .py']:.1f}x faster than cold  (target < 1 s)")

if __name__ == "__main__":
    main()
