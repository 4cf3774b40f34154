"""Remedies (unsafe fixes) on real models: each tried alone, kept when it helps within the SQNR guard."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import run_cli

from qlint.records.results import RemedyStatus
from qlint.remedies.remedy import Build
from qlint.remedies.search import Remediated, remediate, sqnr_db
from qlint.remedies.unfused_attention import unfuse_attention
from qlint.report.formats import remedy_lines
from qlint.settings.config import Config, RemedyName


def one_block_sam() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
    """SAM's `TwoWayTransformer` as examples/sam.py builds it, with one two-way block: 4 attentions."""
    from examples.sam import make_two_way_transformer

    return make_two_way_transformer(depth=1)


# What each model's tests read: every remedy, or the ones they assert on where a model's builds
# are long (each applicable remedy is one more export, quantization, lowering and verified fix).
ASSERTED = {"one_block_sam": [RemedyName.DERIVED_SCALE_QPARAMS, RemedyName.INT8_IO],
            "transformer_encoder": [RemedyName.UNFUSED_ATTENTION, RemedyName.CHANNELS_LAST,
                                    RemedyName.INT8_LAYERNORM]}


@pytest.fixture(scope="session")
def remediated() -> Callable[..., Remediated]:
    """`remediated("resnet")` -> the remedies tried on a zoo model (or SAM's one block) with the default
    guard, once per session."""
    from examples.zoo import ZOO

    models = {**ZOO, "one_block_sam": one_block_sam}
    cache: dict[str, Remediated] = {}

    def get(name: str) -> Remediated:
        if name not in cache:
            model, example, calibration = models[name]()
            names = ASSERTED.get(name, list(RemedyName))
            cache[name] = remediate(Build(model, example, tuple(calibration)), names, Config(), name)
        return cache[name]

    return get


def outcome(done: Remediated, name: RemedyName) -> Any:
    return next(o for o in done.report.outcomes if o.remedy == name)


def test_sqnr_is_signal_over_noise_in_decibels() -> None:
    ones = torch.ones(2)
    assert sqnr_db([ones], [ones]) == math.inf
    assert sqnr_db([ones], [torch.tensor([1.1, 0.9])]) == pytest.approx(20.0)  # 2 / 0.02 = 100
    assert sqnr_db([torch.zeros(2)], [ones]) == -math.inf


@pytest.mark.model("resnet")
def test_channels_last_takes_an_nchw_resnet_to_full_int8(remediated: Callable[..., Remediated]) -> None:
    done = remediated("resnet")
    base = done.report.baseline
    assert base.coverage < 0.5 and base.fp32_elements > 0
    kept = outcome(done, RemedyName.CHANNELS_LAST)
    assert kept.status == RemedyStatus.KEPT, kept.reason
    assert kept.measured.coverage == 1.0 and kept.measured.fp32_elements == 0
    assert kept.measured.arena_bytes < base.arena_bytes
    assert base.sqnr_db - kept.measured.sqnr_db <= 1.0
    assert any("memory_format=torch.channels_last" in line for line in kept.user_change)
    skipped = outcome(done, RemedyName.UNFUSED_ATTENTION)
    assert skipped.status == RemedyStatus.SKIPPED and "no scaled_dot_product_attention" in skipped.reason
    assert done.report.final == kept.measured and done.error is None
    assert done.build.example[0].is_contiguous(memory_format=torch.channels_last)  # --fix verifies in this layout
    text = "\n".join(remedy_lines(done.report))
    assert "kept channels-last: int8 coverage 33% -> 100%" in text
    assert "model = model.to(memory_format=torch.channels_last)" in text


@pytest.mark.model("transformer_encoder")
def test_unfused_attention_turns_the_transformer_encoder_attention_into_int8_kernels(
    remediated: Callable[..., Remediated],
) -> None:
    done = remediated("transformer_encoder")
    base = done.report.baseline
    kept = outcome(done, RemedyName.UNFUSED_ATTENTION)
    assert kept.status == RemedyStatus.KEPT, kept.reason
    # the attention core: both matmuls and the softmax are now Cortex-M kernels
    assert "cortex_m.softmax" not in base.kernels and kept.measured.kernels["cortex_m.softmax"] == 1
    matmuls = "cortex_m.quantized_batch_matmul"
    assert kept.measured.kernels[matmuls] - base.kernels.get(matmuls, 0) == 2
    assert kept.measured.fp32_elements < base.fp32_elements and kept.measured.coverage > base.coverage
    assert math.isfinite(kept.measured.sqnr_db) and kept.measured.sqnr_db > 20
    skipped = outcome(done, RemedyName.CHANNELS_LAST)
    assert skipped.status == RemedyStatus.SKIPPED and "no 2-D convolution" in skipped.reason
    text = "\n".join(remedy_lines(done.report))
    gained = next(line for line in text.splitlines() if "Cortex-M kernels gained:" in line)
    assert "cortex_m.quantized_batch_matmul x2" in gained and "cortex_m.softmax x1" in gained
    assert "unfuse_attention(" in text


@pytest.mark.model("transformer_encoder")
def test_remedies_over_the_guard_together_are_built_without_one_and_the_report_says_which(
    remediated: Callable[..., Remediated],
) -> None:
    """The encoder's unfused-attention and int8-layernorm are each within the guard alone and over it
    together: built without int8-layernorm, the program leaves the fewest fp32 elements within the
    guard, so that build is the one written, and int8-layernorm is refused with both figures."""
    done = remediated("transformer_encoder")
    left, kept = outcome(done, RemedyName.INT8_LAYERNORM), outcome(done, RemedyName.UNFUSED_ATTENTION)
    base, guard = done.report.baseline, Config().remedy_max_sqnr_drop_db
    assert done.error is None and kept.status == RemedyStatus.KEPT and left.status == RemedyStatus.REFUSED
    assert 0 < base.sqnr_db - left.measured.sqnr_db <= guard < float(
        left.reason.split("together the SQNR drops ")[1].split(" dB")[0])
    assert left.measured.fp32_elements < base.fp32_elements  # it helped alone
    assert done.report.final == kept.measured
    assert left.reason.endswith("left out, the build without it leaves the fewest fp32 elements "
                                f"({kept.measured.fp32_elements})")


@pytest.mark.model("transformer_encoder")
def test_a_remedy_over_the_sqnr_guard_is_refused_with_its_numbers(remediated: Callable[..., Remediated]) -> None:
    from examples.zoo import ZOO

    loose = outcome(remediated("transformer_encoder"), RemedyName.UNFUSED_ATTENTION).measured
    drop = remediated("transformer_encoder").report.baseline.sqnr_db - loose.sqnr_db
    assert drop > 0  # int8 attention costs some accuracy against fp32 attention
    model, example, calibration = ZOO["transformer_encoder"]()
    strict = Config(remedy_max_sqnr_drop_db=drop / 2)
    done = remediate(Build(model, example, tuple(calibration)), [RemedyName.UNFUSED_ATTENTION], strict, "te")
    refused = outcome(done, RemedyName.UNFUSED_ATTENTION)
    assert refused.status == RemedyStatus.REFUSED
    assert f"drops {drop:.2f} dB, over the {drop / 2:g} dB guard" in refused.reason
    assert done.report.final == done.report.baseline and done.error is None


def two_layer_encoder() -> tuple[torch.nn.Module, tuple[torch.Tensor], list[tuple[torch.Tensor]]]:
    """`nn.TransformerEncoder`, 2 layers of d_model 32: 4 LayerNorms, seeded weights and batches."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randn(1, 8, 32, generator=generator),) for _ in range(8)]
    return model, batches[0], batches


@pytest.mark.model("two_layer_encoder")
def test_int8_layernorm_takes_a_two_layer_transformer_encoder_to_int8_kernels_only() -> None:
    model, example, calibration = two_layer_encoder()
    names = [RemedyName.UNFUSED_ATTENTION, RemedyName.INT8_LAYERNORM]
    done = remediate(Build(model, example, tuple(calibration)), names, Config(), "encoder")
    base, final = done.report.baseline, done.report.final
    kept = outcome(done, RemedyName.INT8_LAYERNORM)
    assert kept.status == RemedyStatus.KEPT and done.error is None, kept.reason
    # each of the 4 LayerNorms: two quantized_linear (mean; variance + eps), an rsqrt table, and adds and muls
    activation = "cortex_m.quantized_activation"
    assert kept.measured.kernels[activation] - base.kernels.get(activation, 0) == 4
    assert final.fp32_elements <= 0.02 * base.fp32_elements and final.coverage == 1.0 and final.fp32_ops == 0
    assert base.sqnr_db - final.sqnr_db <= Config().remedy_max_sqnr_drop_db
    assert final.arena_bytes < base.arena_bytes
    text = "\n".join(remedy_lines(done.report))
    assert "rebuild_layer_norms(" in text and "after: int8 coverage 100%, 0 fp32 ops, 0 fp32 elements" in text


def one_layer_bert() -> tuple[torch.nn.Module, tuple[torch.Tensor], list[tuple[torch.Tensor]]]:
    """`transformers`' BertModel as the zoo builds it, with one encoder layer: 3 LayerNorms."""
    from examples.zoo import make_bert

    return make_bert(layers=1)


@pytest.mark.model("one_layer_bert")
def test_int8_layernorm_ranges_berts_statistics_and_rebuilds_every_layer_norm_within_the_guard() -> None:
    """Built plainly, BERT's three rebuilt LayerNorms drop the SQNR past the guard: calibration's 16
    rows leave per-row statistics of unseen rows clipped. Built with NormRangesQuantizer, every
    LayerNorm runs on int8 kernels within the guard, and the report says which build it kept and why."""
    model, example, calibration = one_layer_bert()
    done = remediate(Build(model, example, tuple(calibration)), [RemedyName.INT8_LAYERNORM], Config(), "bert")
    kept = outcome(done, RemedyName.INT8_LAYERNORM)
    base = done.report.baseline
    assert kept.status == RemedyStatus.KEPT and done.error is None, kept.reason
    assert "with the statistics ranged for rows calibration did not see (NormRangesQuantizer) (built plainly, " \
        "the SQNR drops " in kept.reason
    plain = float(kept.reason.split("built plainly, the SQNR drops ")[1].split(" dB")[0])
    ranged = base.sqnr_db - kept.measured.sqnr_db
    assert plain > Config().remedy_max_sqnr_drop_db > 0.5 > ranged, (plain, ranged)
    assert (base.fp32_elements, kept.measured.fp32_elements, kept.measured.coverage) == (2304, 0, 1.0)
    assert kept.sites == ()  # no site was left out
    assert kept.user_change[0].endswith("import rebuild_layer_norms, NormRangesQuantizer")
    assert kept.user_change[2] == \
        "quantizer = NormRangesQuantizer(quantizer)  # the flow's (CortexMQuantizer()), before prepare_pt2e"


@pytest.mark.model("transformer_encoder")
def test_a_layer_norm_over_a_tight_guard_is_measured_alone_and_left_in_float() -> None:
    """With a guard tighter than both builds of the encoder's two rebuilt LayerNorms, each is measured
    alone (on the better build) and the costlier one is left in float; the report names it."""
    from examples.models import make_transformer_encoder

    model, example, calibration = make_transformer_encoder()
    config = Config(remedy_max_sqnr_drop_db=0.3)
    done = remediate(Build(model, example, tuple(calibration)), [RemedyName.INT8_LAYERNORM], config, "encoder")
    kept = outcome(done, RemedyName.INT8_LAYERNORM)
    base = done.report.baseline
    assert kept.status == RemedyStatus.KEPT and done.error is None, kept.reason
    worst, other = kept.sites
    assert {worst.site, other.site} == {"layers.0.norm1", "layers.0.norm2"}
    assert base.sqnr_db - worst.sqnr_db > base.sqnr_db - other.sqnr_db
    assert f"at 1 of 2 sites: {worst.site} left in float (the costliest alone; at all 2 the SQNR drops" \
        in kept.reason
    all_two = float(kept.reason.split("the SQNR drops ")[-1].split(" dB")[0])
    assert all_two > 0.3 >= base.sqnr_db - kept.measured.sqnr_db
    assert base.fp32_elements > kept.measured.fp32_elements > 0
    text = "\n".join(remedy_lines(done.report))
    assert f"each site alone, worst first:\n      {worst.site}: SQNR" in text
    assert f".module(), skip={{'{worst.site}'}})" in text


@pytest.mark.model("one_block_sam")
def test_derived_scale_qparams_leaves_sam_no_table_and_every_scale_an_identity(
    remediated: Callable[..., Remediated],
) -> None:
    done = remediated("one_block_sam")
    base = done.report.baseline
    kept = outcome(done, RemedyName.DERIVED_SCALE_QPARAMS)
    assert kept.status == RemedyStatus.KEPT, kept.reason
    assert base.table_folds == 4 and kept.measured.table_folds == 0  # the 4 softmax requantizes
    assert "cortex_m.quantized_activation" not in kept.measured.kernels
    scales = [f for f in done.fixed.summary.folds if f.code == "QL001"]
    assert len(scales) == 4 and all(f.kind == "identity" for f in scales)
    assert not [f for f in done.fixed.summary.folds if f.code == "QL004"]
    assert kept.measured.sqnr_db >= base.sqnr_db - 1.0
    assert "256-entry table folds 4 -> 0" in kept.reason


@pytest.mark.model("one_block_sam")
def test_int8_io_shrinks_sams_arena_and_reports_what_the_application_feeds(
    remediated: Callable[..., Remediated],
) -> None:
    done = remediated("one_block_sam")
    base = done.report.baseline
    assert (base.arena_bytes, base.live_peak_bytes) == (5568, 5248)  # the most exact folds reach
    kept = outcome(done, RemedyName.INT8_IO)
    assert kept.status == RemedyStatus.KEPT, kept.reason
    assert kept.measured.arena_bytes < 5568 and kept.measured.live_peak_bytes < 5248
    assert [q.name for q in kept.io.inputs] == ["image_embedding", "image_pe", "point_embedding"]
    assert [q.index for q in kept.io.outputs] == [0, 1] and {q.qparams.dtype for q in kept.io.outputs} == {"int8"}
    assert kept.measured.sqnr_db == pytest.approx(base.sqnr_db, abs=0.01)  # the same quantize, done outside
    final = done.report.final  # with derived-scale-qparams too: no fold table
    assert final.table_folds == 0 and final.arena_bytes <= kept.measured.arena_bytes
    placeholders = [n for n in done.fixed.program.graph.nodes if n.op == "placeholder"
                    and n.name in done.fixed.program.graph_signature.user_inputs]
    assert [n.meta["val"].dtype for n in placeholders] == [torch.int8] * 3
    assert all(t.dtype == torch.int8 for t in done.build.example)  # what --fix verified the .pte with
    text = "\n".join(remedy_lines(done.report))
    assert "input 0 (image_embedding) is int8: q = clamp(round(x / " in text and "output 1 is int8: x = (q " in text


def test_the_table_holds_every_remedy_each_in_the_module_named_for_it() -> None:
    from qlint.remedies.all_remedies import REMEDIES

    assert list(REMEDIES) == list(RemedyName)
    for name, remedy in REMEDIES.items():
        assert type(remedy).__module__ == f"qlint.remedies.{name.replace('-', '_')}", name
        for line in remedy.user_change:
            if line.startswith("from qlint."):
                exec(line, {})  # the line a user copies into an export script imports


def test_derived_qparams_change_only_the_scale_and_its_one_consumer() -> None:
    from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer
    from torchao.quantization.pt2e.quantizer import DerivedQuantizationSpec

    from examples.models import make_attention
    from qlint.loading.quantize import export_float
    from qlint.remedies.derived_scale_qparams import derive_scale_qparams

    model, example, _ = make_attention()
    quantizer = CortexMQuantizer()
    graph = quantizer.transform_for_annotation(export_float(model, example))
    quantizer.annotate(graph)
    before = {n: (dict(a.input_qspec_map), a.output_qspec) for n in graph.graph.nodes
              if (a := n.meta.get("quantization_annotation")) is not None}
    [scale] = derive_scale_qparams(graph)
    assert scale.op == "div" and scale.constant == pytest.approx(16 ** 0.5)
    (consumer,) = scale.node.users
    changed = {n for n, (inputs, output) in before.items()
               if (a := n.meta["quantization_annotation"]).output_qspec is not output or a.input_qspec_map != inputs}
    assert changed == {consumer}  # the quantizer left the div unannotated: the quantize after it is the softmax's
    derived = consumer.meta["quantization_annotation"].input_qspec_map[scale.node]
    assert isinstance(derived, DerivedQuantizationSpec) and derived.derived_from == [scale.input]
    assert derive_scale_qparams(graph) == []  # its input is now what another qspec derives from: left alone


class ConvThenView(torch.nn.Module):
    """Flattens with `view`, which a channels_last tensor does not allow."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = torch.nn.Conv2d(3, 4, 3), torch.nn.Linear(4 * 6 * 6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        return self.fc(y.view(y.shape[0], -1))


def test_a_remedy_that_breaks_export_fails_with_its_cause_and_the_target_is_built_without_it() -> None:
    torch.manual_seed(0)
    example = (torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(0)),)
    done = remediate(Build(ConvThenView().eval(), example, (example,)), [RemedyName.CHANNELS_LAST], Config(), "v")
    [failed] = done.report.outcomes
    assert failed.status == RemedyStatus.FAILED and failed.measured is None
    assert failed.reason.startswith("export/quantization failed: TorchRuntimeError:")
    assert "Cannot view a tensor with shape torch.Size([1, 4, 6, 6])" in failed.reason and "\n" not in failed.reason
    assert done.error is None and done.fixed.pte  # the plain build, verified
    assert done.report.final == done.report.baseline and done.build.example[0].is_contiguous()


class Attention(torch.nn.Module):
    def __init__(self, mask: torch.Tensor | None = None, causal: bool = False, scale: float | None = None) -> None:
        super().__init__()
        self.mask, self.causal, self.scale = mask, causal, scale

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, is_causal=self.causal, scale=self.scale)


@pytest.mark.parametrize(
    "module",
    [
        Attention(),
        Attention(scale=0.3),
        Attention(mask=torch.randn(6, 6, generator=torch.Generator().manual_seed(0))),
        Attention(mask=torch.rand(6, 6, generator=torch.Generator().manual_seed(0)) > 0.3),
        Attention(causal=True),
    ],
    ids=["plain", "scale", "float-mask", "bool-mask", "causal"],
)
def test_unfused_attention_is_the_same_math_in_float(module: torch.nn.Module) -> None:
    from qlint.loading.quantize import export_float

    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=generator) for _ in range(3))
    graph = unfuse_attention(export_float(module, (q, k, v)))
    ops = {str(n.target) for n in graph.graph.nodes if n.op == "call_function"}
    assert "aten.scaled_dot_product_attention.default" not in ops
    assert {"aten.bmm.default", "aten._softmax.default"} <= ops
    torch.testing.assert_close(graph(q, k, v), module(q, k, v), rtol=1e-5, atol=1e-6)


CONV_TARGET = '''\
import torch


def make():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3))
    g = torch.Generator().manual_seed(0)
    example = (torch.randn(1, 3, 8, 8, generator=g),)
    calibration = [(torch.randn(1, 3, 8, 8, generator=g),)]
    return model.eval(), example, calibration
'''


def test_fix_with_unsafe_fixes_builds_the_target_channels_last_and_reports_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "convs.py").write_text(CONV_TARGET)
    config = tmp_path / ".qlint.yaml"
    config.write_text("targets:\n  - name: convs\n    factory: convs:make\n")
    args = ["check", "--config", str(config), "--targets-only", "--output-format", "json"]

    code, _, err = run_cli([*args, "--unsafe-fixes"], capsys)
    assert code == 2 and "--unsafe-fixes needs --fix or --diff" in err

    code, out, err = run_cli([*args, "--fix"], capsys)  # no remedy selected: the plain build
    assert json.loads(out)["remedies"] == []
    (tmp_path / "convs.pte").unlink()

    code, out, err = run_cli([*args, "--diff", "--unsafe-fixes"], capsys)  # measured and planned, nothing written
    report = json.loads(out)
    assert code == 0 and not (tmp_path / "convs.pte").exists(), err
    assert report["remedies"][0]["final"]["coverage"] == 1.0 and report["fixes"][0]["dry_run"]

    code, out, err = run_cli([*args, "--fix", "--unsafe-fixes", "--write", f"patch:{tmp_path / 'fix.diff'}"], capsys)
    report = json.loads(out)
    assert code == 0, err
    # `model.eval()` is not a plain name: the change is not mechanical, and the diff says nothing
    assert "channels-last is not mechanical in convs.py: line 10 does not return" in err
    assert (tmp_path / "fix.diff").read_text() == ""
    [remedied] = report["remedies"]
    kept = {o["remedy"]: o for o in remedied["outcomes"]}["channels-last"]
    assert kept["status"] == "kept" and kept["measured"]["coverage"] == 1.0
    assert remedied["baseline"]["coverage"] < 1.0 and remedied["final"] == kept["measured"]
    assert report["fixes"][0]["output"].endswith("convs.pte") and (tmp_path / "convs.pte").stat().st_size > 0

    config.write_text("targets:\n  - name: convs\n    factory: convs:make\n    remedies: [unfused-attention]\n")
    code, out, err = run_cli([*args, "--fix"], capsys)  # the target's own list: a remedy that does not apply
    [remedied] = json.loads(out)["remedies"]
    assert [(o["remedy"], o["status"]) for o in remedied["outcomes"]] == [("unfused-attention", "skipped")]


def test_the_api_builds_remedies_folds_and_returns_a_verified_pte() -> None:
    from qlint.api import remedy
    from qlint.full.lint import lint_pte

    namespace: dict[str, Any] = {}
    exec(CONV_TARGET, namespace)  # the same factory the CLI test imports
    model, example, calibration = namespace["make"]()
    built = remedy(model, example, calibration, remedies=["channels-last"])
    assert [o.status for o in built.report.outcomes] == [RemedyStatus.KEPT]
    assert built.example_inputs[0].is_contiguous(memory_format=torch.channels_last)
    assert built.fixed.summary.verified_inputs > 0
    [stats] = lint_pte(built.pte, "built.pte", Config()).stats
    assert stats.coverage == 1.0 and stats.fp32_elements == 0


@pytest.mark.parametrize(
    ("text", "line", "key", "message"),
    [
        ("remedies: [channels_last]\n", 1, "remedies", "'channels_last' is not one of channels-last"),
        ("remedy_max_sqnr_drop_db: -1\n", 1, "remedy_max_sqnr_drop_db", "must be a number of dB from 0"),
        ("targets:\n  - factory: m:f\n    remedies: unfused-attention\n", 3, "targets.remedies", "expected a list"),
    ],
)
def test_bad_remedy_settings_name_the_line_and_key(tmp_path: Path, text: str, line: int, key: str,
                                                   message: str) -> None:
    from qlint.settings.config import ConfigError, load_config

    path = tmp_path / ".qlint.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert (caught.value.line, caught.value.key) == (line, key) and message in caught.value.message


def test_remedy_settings_are_read_per_config_and_per_target(tmp_path: Path) -> None:
    from qlint.settings.config import load_config

    path = tmp_path / ".qlint.yaml"
    path.write_text("remedies: [channels-last]\nremedy_max_sqnr_drop_db: 2\ntargets:\n"
                    "  - {name: a, factory: m:f}\n  - {name: b, factory: m:g, remedies: []}\n")
    config = load_config(path)
    assert config.remedies == (RemedyName.CHANNELS_LAST,) and config.remedy_max_sqnr_drop_db == 2.0
    assert [t.remedies for t in config.targets] == [None, ()]


PLAIN_RETURN = CONV_TARGET.replace("return model.eval(), example, calibration", "return model, example, calibration")


def test_channels_last_is_written_as_a_diff_that_applies_and_moves_the_factorys_results(tmp_path: Path) -> None:
    import subprocess

    from qlint.records.results import Measurement, RemedyOutcome, RemedyReport
    from qlint.remedies.patch import remedy_patch

    factory = tmp_path / "convs.py"
    factory.write_text(PLAIN_RETURN)
    figures = Measurement(1.0, 0, 0, 0, 0, 0, 30.0, {})
    report = RemedyReport("target:convs", figures, [RemedyOutcome("channels-last", RemedyStatus.KEPT, "", figures)],
                          factory="convs:make", factory_file=str(factory))
    patch = remedy_patch([report], tmp_path)
    assert patch.notes == ["target:convs: channels-last written as a change to convs.py"]
    assert patch.diff.startswith("--- a/convs.py\n+++ b/convs.py\n")
    assert "+    model = model.to(memory_format=torch.channels_last)\n" in patch.diff
    assert factory.read_text() == PLAIN_RETURN  # the source is never edited
    (tmp_path / "fix.diff").write_text(patch.diff)
    subprocess.run(["git", "apply", "fix.diff"], cwd=tmp_path, check=True)
    namespace: dict[str, Any] = {}
    exec(factory.read_text(), namespace)
    model, example, calibration = namespace["make"]()
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert all(b[0].is_contiguous(memory_format=torch.channels_last) for b in [example, *calibration])


def test_only_plain_returns_of_the_factory_are_mechanical() -> None:
    from qlint.remedies.channels_last import ChannelsLast

    channels_last = ChannelsLast().edit_factory
    nested = "def make():\n    def inner():\n        return f()\n    m, e = inner()\n    return m, e\n"
    lines = channels_last(nested, "make")
    assert isinstance(lines, list) and "    import torch\n" in lines  # the module does not import torch
    assert "        return f()\n" in lines  # the inner function's return is not the factory's
    assert channels_last("def make():\n    return build()\n", "make") == (
        "line 2 does not return `model, example_inputs[, calibration]` as plain names")
    assert channels_last("def other():\n    return 1\n", "make") == "no module-level `def make` in it"
    # a hostile source is a reason, not a crash: nesting beyond the parser, null bytes
    assert channels_last("x = " + "-" * 200000 + "1\n", "make") == "cannot parse it: MemoryError"
    assert channels_last("def make():\n    return a\x00\n", "make").startswith("cannot parse it:")


def test_an_int8_port_is_one_flat_json_object() -> None:
    """The int8-io remedy's ports hold the one qparams record; JSON keeps them flat, as it always did."""
    from qlint.records.results import Measurement, ProgramIO, ProgramPort, RemedyOutcome, RemedyReport
    from qlint.rules.qparams import QParams

    io = ProgramIO((ProgramPort("x", 0, QParams(0.05, -3, -128, 127, "int8")),), ())
    measured = Measurement(coverage=1.0, fp32_ops=0, fp32_elements=0, arena_bytes=64, live_peak_bytes=64, table_folds=0,
                           sqnr_db=float("inf"), kernels={})
    report = RemedyReport("t", measured, [RemedyOutcome("int8-io", RemedyStatus.KEPT, "", measured, (), io)], io=io)
    port = {"name": "x", "index": 0, "scale": 0.05, "zero_point": -3, "qmin": -128, "qmax": 127, "dtype": "int8"}
    data = report.to_dict()
    assert data["io"] == {"inputs": [port], "outputs": []} == data["outcomes"][0]["io"]
    assert list(data["io"]["inputs"][0]) == list(port) and data["baseline"]["sqnr_db"] is None
