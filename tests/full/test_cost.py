"""The cost model on real lowered programs: work read from operand shapes, priced per core."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


@pytest.mark.model("make_two_way_transformer")
def test_sams_estimate_prices_its_islands_by_the_cores_fpu(linted: Callable[..., Any]) -> None:
    from qlint.graph.cost import core_for, estimate

    view = linted("make_two_way_transformer").analysis.view
    with_fpu, soft = estimate(view, core_for("cortex-m33")), estimate(view, core_for("cortex-m33", fpu=False))
    assert (with_fpu.core.backend, soft.core.fpu, core_for("cortex-m0plus").backend) == ("dsp", False, "scalar")
    # the int8 kernels cost the same on both; the float work (9 LayerNorms, 7 divs, their conversions)
    # is soft float without an FPU: a division is 475 cycles a call against VDIV's 14
    assert soft.cycles - soft.fp32_cycles == with_fpu.cycles - with_fpu.fp32_cycles
    assert soft.fp32_cycles > 20 * with_fpu.fp32_cycles
    divs = [o for o in soft.ops if o.op == "aten.div.Tensor"]
    assert len(divs) == 7 and all(o.fp32 and o.unit == "element" for o in divs)
    first = divs[0]
    assert first.cycles == pytest.approx(first.work * (7 + 475) + 200)  # loop + __aeabi_fdiv, + dispatch
    # a linear's MACs are its output elements times its input features, from the operand shapes
    linear = next(o for o in with_fpu.ops if o.op == "cortex_m.quantized_linear.default")
    node = next(n for n in view.nodes if n.name == linear.node)
    out, weight = node.meta["val"], node.args[1].meta["val"]
    assert linear.unit == "MAC" and linear.work == out.numel() * weight.shape[-1]
    assert linear.cycles == pytest.approx(linear.work * 3.3 + 200)  # the DSP fit, + dispatch
    # an island's cycles are its ops': with an FPU each div element is the loop and one VDIV.F32
    assert with_fpu.of(o.node for o in divs) == round(sum(o.work * (7 + 14) + 200 for o in divs))


def test_a_clock_turns_cycles_into_milliseconds() -> None:
    from qlint.graph.cost import OpCost, ProgramCost
    from qlint.settings.cycles import Core

    cost = ProgramCost(Core("cortex-m4", "dsp", True, 120_000_000), [OpCost("a", "x", 1, "element", 1_200_000, True)])
    assert (cost.cycles, cost.fp32_cycles, cost.latency_ms()) == (1_200_000, 1_200_000, pytest.approx(10.0))
    assert ProgramCost(Core("cortex-m4", "dsp", True)).latency_ms() is None
