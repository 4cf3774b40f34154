"""The cost model on real lowered programs: work read from operand shapes, priced per core."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, run_cli, run_json


@pytest.mark.model("make_two_way_transformer")
def test_sams_estimate_prices_its_islands_by_the_cores_fpu(linted: Callable[..., Any]) -> None:
    from qlint.device.cost import core_for, estimate
    from qlint.settings.cycles import cost_table

    view, table = linted("make_two_way_transformer").analysis.view, cost_table()
    # the figures cycles.yaml gives: the fp32 loop, a soft-float division call and VDIV.F32 on an
    # M33, the DSP linear kernel a MAC, the dispatch an op
    loop, fdiv, vdiv = table.fp32_loop, table.soft["div"], table.fpu["cortex-m33"]["div"]
    dsp_mac, dispatch = table.int8["dsp"]["linear"].per_mac, table.dispatch
    assert fdiv > 20 * vdiv
    with_fpu, soft = estimate(view, core_for("cortex-m33")), estimate(view, core_for("cortex-m33", fpu=False))
    assert (with_fpu.core.backend, soft.core.fpu, core_for("cortex-m0plus").backend) == ("dsp", False, "scalar")
    # the int8 kernels cost the same on both; the float work (9 LayerNorms, 7 divs, their conversions)
    # is soft float without an FPU: a division is a library call, many times VDIV's cycles
    assert soft.cycles - soft.fp32_cycles == with_fpu.cycles - with_fpu.fp32_cycles
    assert soft.fp32_cycles > 20 * with_fpu.fp32_cycles
    divs = [o for o in soft.ops if o.op == "aten.div.Tensor"]
    assert len(divs) == 7 and all(o.fp32 and o.unit == "element" for o in divs)
    first = divs[0]
    assert first.cycles == pytest.approx(first.work * (loop + fdiv) + dispatch)  # loop + __aeabi_fdiv, + dispatch
    # a linear's MACs are its output elements times its input features, from the operand shapes
    linear = next(o for o in with_fpu.ops if o.op == "cortex_m.quantized_linear.default")
    node = next(n for n in view.nodes if n.name == linear.node)
    out, weight = node.meta["val"], node.args[1].meta["val"]
    assert linear.unit == "MAC" and linear.work == out.numel() * weight.shape[-1]
    assert linear.cycles == pytest.approx(linear.work * dsp_mac + dispatch)  # the DSP fit, + dispatch
    # an island's cycles are its ops': with an FPU each div element is the loop and one VDIV.F32
    assert with_fpu.of(o.node for o in divs) == sum(round(o.work * (loop + vdiv) + dispatch) for o in divs)
    # a board's flash read cost: a linear layer's weights stream once an inference while its MACs
    # run, the slower of the two counts (a flash this slow outlasts the DSP fit a MAC); nothing else moves
    slow_flash = estimate(view, core_for("cortex-m33", flash_read=1000.0))
    streamed = next(o for o in slow_flash.ops if o.node == linear.node)
    assert streamed.cycles == pytest.approx(weight.numel() * 1000.0 + dispatch)
    assert [o.cycles for o in slow_flash.ops if "linear" not in o.op] == [
        o.cycles for o in with_fpu.ops if "linear" not in o.op]
    # a flash that keeps up with the DSP fit a MAC (and DSP cores' usually do) changes nothing
    assert estimate(view, core_for("cortex-m33", flash_read=1.0)).ops == with_fpu.ops


def test_a_boards_flash_read_cost_reaches_the_estimate(tmp_path: Path) -> None:
    from qlint.device.cost import core_of
    from qlint.settings.config import load_config

    config = tmp_path / ".qlint.yaml"
    config.write_text("board: mine\nboards:\n  mine: {cpu: cortex-m85, clock: 480MHz, sram: 1MiB, flash: 2MiB, "
                      "flash_read: 1.25}\n")
    core = core_of(load_config(config))
    assert (core.cpu, core.backend, core.clock_hz, core.flash_read) == ("cortex-m85", "mve", 480_000_000, 1.25)
    assert core.describe() == "cortex-m85 (MVE kernels, FPU, flash reads 1.25 cycles/byte) at 480 MHz"
    config.write_text("board: ek-ra8d1\n")
    assert core_of(load_config(config)).flash_read == 0.625
    config.write_text("target_cpu: cortex-m85\n")  # no board: weights priced as if in fast memory
    assert core_of(load_config(config)).flash_read == 0.0


def test_explicit_layout_kernels_cost_what_their_twins_do_and_a_transposed_convolution_its_macs() -> None:
    """ExecuTorch's experimental explicit-layout lowering runs the same CMSIS-NN functions as
    `..._nhwc` kernels over NHWC-shaped tensors: each is priced as the kernel it calls, at the same
    shapes; a transposed convolution by its input pixels times its weights."""
    import inspect

    import torch
    from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager
    from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer
    from executorch.exir.program._program import _transform, lift_constant_tensor_pass

    from qlint.device.cost import core_for, estimate
    from qlint.loading.lowering import run_passes, target_config, to_edge
    from qlint.loading.quantize import export_float, quantize_graph
    from qlint.loading.view import GraphView
    from qlint.settings.cycles import cost_table

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 16, 1),
                                torch.nn.Conv2d(16, 16, 3, padding=1, groups=16),
                                torch.nn.ConvTranspose2d(16, 8, 3)).eval()
    nchw = (torch.randn(1, 8, 8, 8),)
    priced = {}
    for explicit in (False, True):
        example = nchw if explicit else (nchw[0].to(memory_format=torch.channels_last),)
        quantized = quantize_graph(export_float(model, example), example, [example],
                                   CortexMQuantizer(use_explicit_layout=explicit))
        program = to_edge(quantized).exported_program()
        if explicit:
            for pass_cls in CortexMPassManager.explicit_layout_pass_list:
                wants = inspect.signature(pass_cls).parameters
                kwargs = {**({"exported_program": program} if "exported_program" in wants else {}),
                          **({"target_config": target_config("cortex-m55")} if "target_config" in wants else {})}
                program = _transform(program, pass_cls(**kwargs))
            program = lift_constant_tensor_pass(program)
        else:
            program = run_passes(program, "cortex-m55")
        cost = estimate(GraphView(program, quantized=quantized), core_for("cortex-m55"))
        priced[explicit] = [(o.op.split(".")[1], o.work, o.cycles) for o in cost.ops if "conv" in o.op]
    kernels = ["quantized_conv2d", "quantized_conv2d", "quantized_depthwise_conv2d", "quantized_transpose_conv2d"]
    assert [k for k, _, _ in priced[False]] == kernels
    assert [k for k, _, _ in priced[True]] == [f"{k}_nhwc" for k in kernels]
    assert [(w, c) for _, w, c in priced[True]] == [(w, c) for _, w, c in priced[False]]
    # the transposed convolution: 8x8 input pixels times its 8x3x3x16 weights; the MVE matrix product
    # and a requantization for each of its 8x10x10 outputs, no im2col
    _, macs, cycles = priced[True][-1]
    mve = cost_table().int8["mve"]["transpose"]
    assert macs == 64 * 8 * 3 * 3 * 16 and cycles == pytest.approx(
        mve.per_mac * macs + mve.per_output * 800 + cost_table().dispatch)


def test_a_clock_turns_cycles_into_milliseconds() -> None:
    from qlint.device.cost import OpCost, ProgramCost
    from qlint.settings.cycles import Core

    cost = ProgramCost(Core("cortex-m4", "dsp", True, 120_000_000), [OpCost("a", "x", 1, "element", 1_200_000, True)])
    assert (cost.cycles, cost.fp32_cycles, cost.latency_ms()) == (1_200_000, 1_200_000, pytest.approx(10.0))
    assert ProgramCost(Core("cortex-m4", "dsp", True)).latency_ms() is None


def test_no_board_gives_an_fpu_to_a_core_whose_architecture_has_none() -> None:
    """Whatever a board says, a core without an FPU is priced as soft float (the cost table has no
    FPU timings for it); the config and the command line refuse the claim before a run gets here."""
    from qlint.device.cost import core_for
    from qlint.settings.cycles import cost_table

    table = cost_table()
    for cpu in sorted(table.no_fpu):
        core = core_for(cpu, fpu=True, clock_hz=48_000_000)
        assert (core.fpu, table.arithmetic(core, "div")) == (False, table.soft["div"])
    assert (core_for("cortex-m4", fpu=True).fpu, core_for("cortex-m4", fpu=False).fpu) == (True, False)


@pytest.fixture
def attention(tmp_path: Path) -> Path:
    """The bundled attention example in a folder of its own (no config above it)."""
    target = tmp_path / "attention.pt2"
    shutil.copy(ROOT / "examples" / "attention.pt2", target)
    return target


@pytest.mark.model("make_attention")
def test_a_board_gives_cycles_and_milliseconds_for_the_artifact_and_each_finding(
        attention: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, report = run_json(["check", "--no-cache", "--board", "nucleo-l4r5zi", str(attention)], capsys)
    [stats] = report["artifacts"]
    assert code == 1 and stats["core"] == "cortex-m4 (DSP kernels, FPU) at 120 MHz"
    assert 0 < stats["fp32_cycles"] < stats["cycles"]
    assert stats["latency_ms"] == pytest.approx(stats["cycles"] / 120e3)
    costliest = stats["costliest"]
    assert [c["amount"] for c in costliest] == sorted((c["amount"] for c in costliest), reverse=True)
    assert costliest[0]["what"] == "quantized_batch_matmul, 1,024 MACs"
    assert costliest[0]["location"]["code"] == "scores = torch.bmm(q, k.transpose(1, 2))"
    scale = next(f for f in report["findings"] if f["code"] == "QL001")
    assert scale["details"]["cycles"] > 0 and scale["details"]["time_share"] == pytest.approx(
        scale["details"]["cycles"] / stats["cycles"], abs=1e-4)
    assert scale["details"]["latency_ms"] == pytest.approx(scale["details"]["cycles"] / 120e3, abs=1e-6)
    # the message says it too, so an annotation or a SARIF result carries the island's time
    details = scale["details"]
    assert scale["message"].endswith(f"; est. {details['cycles']:,} cycles ({details['latency_ms']:.3g} ms), "
                                     f"{details['time_share']:.1%} of the artifact's time")
    # without a board: the config's CPU (cortex-m55 by default), no clock, so no milliseconds
    _, plain = run_json(["check", "--no-cache", str(attention)], capsys)
    [unclocked] = plain["artifacts"]
    assert unclocked["core"] == "cortex-m55 (MVE kernels, FPU)" and unclocked["latency_ms"] is None
    code, _, err = run_cli(["check", "--board", "no-such-board", str(attention)], capsys)
    assert code == 2 and err.startswith("qlint: --board: unknown board 'no-such-board' (known: alif-e7-dk-he-u55, "
                                        "alif-e7-dk-hp-u55, alif-e8-dk-he,")


@pytest.mark.model("make_attention")
def test_a_latency_budget_names_the_costliest_ops_and_needs_a_clock(
        attention: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = attention.parent / ".qlint.yaml"
    config.write_text("board: nucleo-l4r5zi\nbudgets: {latency: 10us}\n")
    code, report = run_json(["check", "--no-cache", "--config", str(config), str(attention)], capsys)
    [over] = [f for f in report["findings"] if f["code"] == "QL009"]
    assert code == 1 and over["details"]["budget"] == "latency" and over["details"]["limit"] == 0.01
    assert over["message"].startswith("estimated latency ") and "over its budget 0.01 ms" in over["message"]
    assert "costliest ops (cycles): cortex_m_quantized_batch_matmul_default (quantized_batch_matmul, 1,024 MACs) " \
           "at examples/models.py:28: " in over["message"]
    assert over["location"]["code"] == "scores = torch.bmm(q, k.transpose(1, 2))"
    assert len(over["details"]["contributors"]) == 5
    config.write_text("target_cpu: cortex-m33\nbudgets: {latency: 10us}\n")  # no board: no clock
    _, report = run_json(["check", "--no-cache", "--config", str(config), str(attention)], capsys)
    [unchecked] = [f for f in report["findings"] if f["code"] == "QL009"]
    assert unchecked["message"].startswith("estimated latency budget 0.01 ms (budgets in ")
    assert unchecked["message"].endswith(") cannot be checked: no board with a clock is set (`board:` or --board)")


@pytest.mark.model("make_attention")
def test_no_fpu_makes_the_same_island_several_times_costlier(attention: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    target, config = attention, attention.parent / ".qlint.yaml"
    config.write_text("boards:\n  m33-fpu: {cpu: cortex-m33, clock: 128MHz, fpu: true, sram: 512KiB, flash: 1MiB}\n"
                      "  m33-soft: {cpu: cortex-m33, clock: 128MHz, fpu: false, sram: 512KiB, flash: 1MiB}\n")
    shares = {}
    for board in ("m33-fpu", "m33-soft"):
        _, report = run_json(["check", "--no-cache", "--config", str(config), "--board", board, str(target)], capsys)
        shares[board] = next(f["details"]["cycles"] for f in report["findings"] if f["code"] == "QL001")
    assert shares["m33-soft"] > 5 * shares["m33-fpu"]


def test_growth_on_fp32_cycles_fails_a_change_that_adds_an_island(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "scaled.py"
    source = ('import torch\n\n\nclass Model(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n'
              '        self.fc = torch.nn.Linear(16, 16)\n\n    def forward(self, x):\n        y = self.fc(x){scale}\n'
              '        return self.fc(y)\n\n\ndef make():\n    torch.manual_seed(0)\n'
              '    return Model().eval(), (torch.randn(1, 16),)\n')
    model.write_text(source.format(scale=""))
    config = tmp_path / ".qlint.yaml"
    config.write_text("board: nrf5340-dk\ntargets:\n  - {name: scaled, factory: scaled:make}\n"
                      "budgets: {growth: {fp32_cycles: 0}}\n")
    base = tmp_path / "base.json"
    code, _, err = run_cli(["check", "--no-cache", "--config", str(config), "--targets-only", "--write",
                            f"metrics:{base}"], capsys)
    assert code == 0, err
    before = json.loads(base.read_text())["artifacts"]["target:scaled"]
    assert before["fp32_cycles"] > 0 and before["fp32_islands"] == 0  # the input quantize, the output dequantize
    # a LayerNorm: an island --fix cannot fold, so the program it would write has it too
    model.write_text(source.format(scale="\n        y = torch.nn.functional.layer_norm(y, (16,))"))
    code, report = run_json(["check", "--no-cache", "--config", str(config), "--targets-only", "--compare", str(base)],
                            capsys)
    grew = [f for f in report["findings"] if f["code"] == "QL009"]
    assert code == 1 and [f["details"]["budget"] for f in grew] == ["fp32_cycles"]
    assert grew[0]["details"]["before"] < grew[0]["details"]["measured"]
    assert grew[0]["message"].startswith("estimated fp32 cycles grew ")
    assert "largest fp32 islands: QL002 island at " in grew[0]["message"]


@pytest.mark.model("make_attention")
def test_the_time_plot_draws_the_costliest_ops(attention: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "time.svg"
    code, _, err = run_cli(["check", "--no-cache", "--board", "ek-ra8d1", "--write", f"time-plot:{plot}",
                            str(attention)], capsys)
    svg = plot.read_text()
    assert code == 1 and "quantized_batch_matmul examples/models.py:28" in svg and "estimated milliseconds" in svg
    assert "cortex-m85 (MVE kernels, FPU, flash reads 0.625 cycles/byte) at 480 MHz" in svg
