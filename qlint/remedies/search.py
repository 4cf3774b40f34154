"""Try each requested remedy on a target alone, keep what helps within the accuracy guard.

Each build is exported, quantized, lowered and fixed (exact folds, verified) the
way `qlint fix` does it, then measured: int8 coverage, fp32 ops and elements per
inference, the planned arena and its live peak, the 256-entry table folds, and
the SQNR of the program against the float model on the calibration batches plus
seeded ones. A remedy is kept when one of the first five improves and its SQNR
is at most `remedy_max_sqnr_drop_db` below the plain build's; the kept ones are
then built together, and that build, also within the guard, is what `--fix` writes.

On an Ethos-U target the builds are quantized by Arm's quantizer and lowered with
their NPU partitions; the inference's estimated cycles (Vela's for the partitions,
the Cortex-M model for the CPU's ops) are a gain too, which is what placing an op
on the NPU or the CPU trades, and the SQNR is the quantized program's: the delegate
calls do not run on the host, and the fix checked each partition on the TOSA
reference model against that program.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from qlint.analysis.folds import FoldKind
from qlint.analysis.values import flatten
from qlint.fix.apply import fix_program
from qlint.fix.errors import FixError, VerificationError
from qlint.fix.program import FixResult, run_program
from qlint.io.reads import first_line
from qlint.loading.inputs import seeded_batches, verification_inputs
from qlint.loading.quantize import BuildError, export_float, quantize_graph, without_fast_paths
from qlint.loading.view import op_name
from qlint.records.results import (
    Measurement,
    ProgramIO,
    RemedyOutcome,
    RemedyReport,
    RemedyStatus,
    SiteMeasurement,
)
from qlint.remedies.all_remedies import REMEDIES
from qlint.remedies.int8_io import feed, read
from qlint.remedies.layernorm_placement import LayerNormPlacement
from qlint.remedies.remedy import (
    Build,
    Remedy,
    apply_to_build,
    apply_to_graph,
    apply_to_inputs,
    apply_to_program,
    apply_to_quantizer,
)
from qlint.settings.config import Config, RemedyName
from qlint.settings.options import RunOptions

SQNR_SEEDS = 4  # seeded batches added to the calibration batches for the SQNR
SQNR_FIRST_SEED = 1000  # past the verification's seeds (0..VERIFY_SEEDS): the two sets never share a batch


class RemedyError(Exception):
    """A build with these remedies did not export, quantize, lower or run: one line."""


@dataclass
class Remediated:
    """The build `--fix` goes on with: the quantized program and its inputs in its layout and dtypes.

    `error` says why nothing may be written (the kept remedies together fail, or
    drop the SQNR over the guard); the report is complete either way.
    """

    program: Any
    build: Build
    report: RemedyReport
    fixed: FixResult          # that program with the exact folds, verified: what --fix writes
    error: str | None = None


def sqnr_db(reference: Sequence[torch.Tensor], actual: Sequence[torch.Tensor]) -> float:
    """10·log10(signal / noise) over every output element; inf when the outputs are equal."""
    signal = sum(float(r.double().pow(2).sum()) for r in reference)
    noise = sum(float((r.double() - a.double()).pow(2).sum()) for r, a in zip(reference, actual, strict=True))
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def _spread(tensor: Any) -> float:
    """An example tensor's own spread: the SQNR is measured on inputs like the model's."""
    return float(tensor.float().std()) if isinstance(tensor, torch.Tensor) and tensor.numel() > 1 else 1.0


def sqnr_batches(build: Build, seeds: int = SQNR_SEEDS) -> list[tuple[Any, ...]]:
    """The calibration batches (or the example) and `seeds` seeded batches scaled like the example,
    drawn from seeds of their own (SQNR_FIRST_SEED), not the verification's."""
    return (list(build.calibration) or [build.example]) + seeded_batches(build.example, seeds, SQNR_FIRST_SEED, _spread)


def float_outputs(model: Any, batches: Sequence[tuple[Any, ...]]) -> list[torch.Tensor]:
    """Every output tensor of the float model on every batch, flat, in order."""
    with torch.no_grad(), without_fast_paths():
        return [t.reshape(-1) for batch in batches for t in flatten(model.eval()(*batch))]


def remedies_for(config: Config) -> tuple[RemedyName, ...]:
    """The remedies of the flow `config` lowers for (an Ethos-U target's, or the Cortex-M CPU's): what
    `--unsafe-fixes` tries."""
    return tuple(name for name, remedy in REMEDIES.items() if remedy.for_npu == (config.npu is not None))


def build_program(build: Build, remedies: list[Remedy], config: Config) -> tuple[Any, Build, ProgramIO | None]:
    """The quantized ExportedProgram of `build` with `remedies`, the build in its layout, and its integer IO:
    quantized as the flow `config` lowers for quantizes (`CortexMQuantizer`, or Arm's for its Ethos-U)."""
    from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer

    from qlint.loading import ethos_u

    changed = apply_to_build(build, remedies)
    graph = apply_to_graph(export_float(changed.model, changed.example), remedies)
    base = ethos_u.quantizer(config.npu) if config.npu is not None else CortexMQuantizer()
    quantizer = apply_to_quantizer(base, remedies)
    program = quantize_graph(graph, changed.example, list(changed.calibration), quantizer)
    return program, changed, apply_to_program(program, remedies)


def program_sqnr(program: Any, batches: Sequence[tuple[Any, ...]], io: ProgramIO | None,
                 reference: Sequence[torch.Tensor]) -> float:
    """The SQNR of `program` on `batches` (as it takes them, its integer outputs read back through `io`)
    against the float model's outputs `reference`."""
    outputs = [read(batch, io) for batch in run_program(program, batches)]
    return sqnr_db(reference, [t.reshape(-1) for batch in outputs for t in batch])


def measure(program: Any, config: Config, artifact: str, verify: Sequence[tuple[Any, ...]],
            batches: Sequence[tuple[Any, ...]], io: ProgramIO | None,
            reference: Sequence[torch.Tensor]) -> tuple[FixResult, Measurement]:
    """Fix `program` as `--fix` would (exact folds, verified on `verify`), and measure the result.

    The figures are those of the program `--fix` writes, so a remedy whose gain is
    a better fold (an identity instead of a table) shows it. `verify` and `batches`
    are as the program takes them; its integer outputs are read back through `io`.
    """
    try:  # the placements are priced here, build against build: no fallback is compiled the other way
        fixed = fix_program(program, artifact, config, verify, RunOptions(split_costs=False))
    except (FixError, VerificationError) as exc:
        raise RemedyError(str(exc)) from None
    lowered = fixed.program
    # On an NPU target the lowered program's delegate calls do not run on the host; the quantized
    # program does, and the fix checked each partition's TOSA computes its int8 on the reference model.
    ran = program if config.npu is not None else lowered
    try:
        sqnr = program_sqnr(ran, batches, io, reference)
    except Exception as exc:  # the fixed program cannot run on these batches
        raise RemedyError(f"the {'quantized' if ran is program else 'lowered'} program does not run: "
                          f"{first_line(exc)}") from None
    names = (op_name(n).removesuffix(".default") for n in lowered.graph.nodes if n.op == "call_function")
    kernels = Counter(n for n in names if n.startswith("cortex_m.") and not n.endswith("quantize_per_tensor"))
    summary, stats = fixed.summary, fixed.stats
    return fixed, Measurement(
        coverage=fixed.stats.coverage,
        fp32_ops=summary.fp32_ops[1],
        fp32_elements=fixed.stats.fp32_elements,
        arena_bytes=summary.activation_bytes[1],
        live_peak_bytes=summary.live_peak_bytes[1],
        table_folds=sum(1 for fold in summary.folds if fold.kind == FoldKind.TABLE),
        sqnr_db=sqnr,
        kernels=dict(sorted(kernels.items())),
        cycles=stats.cycles,
        npu_cycles=stats.npu_cycles,
        cpu_cycles=stats.cpu_cycles,
        partitions=stats.partitions,
    )


def _gains(before: Measurement, after: Measurement) -> list[str]:
    """What improved, in words; empty when nothing did. On an NPU target (a build with partitions) the
    inference's estimated time is one: placing an op trades the NPU's cycles against the CPU's."""
    gains = []
    if before.partitions is not None and before.cycles is not None and after.cycles is not None \
            and after.cycles < before.cycles:
        gains.append(f"est. cycles {before.cycles:,} -> {after.cycles:,}")
    if after.coverage > before.coverage:
        gains.append(f"int8 coverage {before.coverage:.0%} -> {after.coverage:.0%}")
    if after.fp32_elements < before.fp32_elements:
        gains.append(f"fp32 elements {before.fp32_elements} -> {after.fp32_elements}")
    if after.arena_bytes < before.arena_bytes:
        gains.append(f"arena {before.arena_bytes} -> {after.arena_bytes} bytes")
    if after.live_peak_bytes < before.live_peak_bytes:
        gains.append(f"live peak {before.live_peak_bytes} -> {after.live_peak_bytes} bytes")
    if after.table_folds < before.table_folds:
        gains.append(f"256-entry table folds {before.table_folds} -> {after.table_folds}")
    return gains


def sqnr_drop(before: Measurement, after: Measurement | SiteMeasurement) -> float:
    if math.isinf(before.sqnr_db) and math.isinf(after.sqnr_db):
        return 0.0
    return before.sqnr_db - after.sqnr_db


@dataclass
class _Candidate:
    program: Any
    build: Build            # in the program's layout and input dtypes
    fixed: FixResult
    measured: Measurement
    io: ProgramIO | None


def _built(build: Build, remedies: list[Remedy], config: Config, artifact: str,
           batches: Sequence[tuple[Any, ...]], reference: Sequence[torch.Tensor]) -> _Candidate:
    try:
        program, changed, io = build_program(build, remedies, config)
    except Exception as exc:  # export or quantization raised with this remedy
        raise RemedyError(f"export/quantization failed: {type(exc).__name__}: {first_line(exc)}") from None
    verify = [feed(b, io) for b in verification_inputs(changed.example, list(changed.calibration))]
    fixed, measured = measure(program, config, artifact, verify, _fed(batches, remedies, io), io, reference)
    as_fed = Build(changed.model, feed(changed.example, io), tuple(feed(b, io) for b in changed.calibration))
    return _Candidate(program, as_fed, fixed, measured, io)


def _fed(batches: Sequence[tuple[Any, ...]], remedies: list[Remedy], io: ProgramIO | None) -> list[tuple[Any, ...]]:
    """The SQNR batches as a build with `remedies` takes them: changed as they change inputs, fed through `io`."""
    return [feed(apply_to_inputs(b, remedies), io) for b in batches]


def _each_site(build: Build, remedy: Remedy, sites: list[str], config: Config, artifact: str,
               batches: Sequence[tuple[Any, ...]], reference: Sequence[torch.Tensor],
               ) -> tuple[tuple[SiteMeasurement, ...], tuple[str, _Candidate] | None]:
    """The SQNR with `remedy` at each of `sites` alone, worst first, and the build of the best one
    alone: the search's last try, kept rather than built twice."""
    measured, best = [], None
    for site in sites:
        alone = remedy.leaving(frozenset(sites) - {site})
        try:
            candidate = _built(build, [alone], config, artifact, batches, reference)
        except RemedyError as exc:
            measured.append(SiteMeasurement(site, math.nan, str(exc)))
            continue
        measured.append(SiteMeasurement(site, candidate.measured.sqnr_db))
        if best is None or candidate.measured.sqnr_db > best[1].measured.sqnr_db:
            best = (site, candidate)
    return tuple(sorted(measured, key=lambda s: (not s.failed, s.sqnr_db))), best


def _better_built(remedy: Remedy, candidate: _Candidate, build: Build, config: Config, artifact: str,
                  batches: Sequence[tuple[Any, ...]], reference: Sequence[torch.Tensor]) -> tuple[Remedy, _Candidate]:
    """`remedy` over the guard, or its alternative build when it has one that measures better."""
    alternative = remedy.alternative()
    if alternative is None:
        return remedy, candidate
    try:
        other = _built(build, [alternative], config, artifact, batches, reference)
    except RemedyError:
        return remedy, candidate
    return (alternative, other) if other.measured.sqnr_db > candidate.measured.sqnr_db else (remedy, candidate)


def _refused_or_partly_kept(
    remedy: Remedy, refused: _Candidate, baseline: Measurement, float_graph: Any, build: Build, config: Config,
    artifact: str, batches: Sequence[tuple[Any, ...]], reference: Sequence[torch.Tensor],
) -> tuple[RemedyOutcome, tuple[Remedy, _Candidate] | None]:
    """A remedy over the guard: with several sites, measured at each alone and then built without
    the costliest ones, worst first, until the rest help within the guard (kept there) or one is left."""
    guard = config.remedy_max_sqnr_drop_db
    drop, gains = sqnr_drop(baseline, refused.measured), _gains(baseline, refused.measured)
    why = (f"SQNR {baseline.sqnr_db:.1f} -> {refused.measured.sqnr_db:.1f} dB drops {drop:.2f} dB, over the "
           f"{guard:g} dB guard (remedy_max_sqnr_drop_db); it would give {', '.join(gains)}")
    sites = remedy.sites(float_graph)
    measured, best = _each_site(build, remedy, sites, config, artifact, batches, reference) \
        if len(sites) > 1 else ((), None)
    left: frozenset[str] = frozenset(s.site for s in measured if s.failed)
    for worst in (s for s in measured if not s.failed):
        left |= {worst.site}
        if len(left) >= len(sites):
            break
        partial = remedy.leaving(left)
        try:
            candidate = best[1] if best is not None and set(sites) - left == {best[0]} else \
                _built(build, [partial], config, artifact, batches, reference)
        except RemedyError:
            continue
        partial_gains = _gains(baseline, candidate.measured)
        if partial_gains and sqnr_drop(baseline, candidate.measured) <= guard:
            reason = (f"{'; '.join(partial_gains)}; at {len(sites) - len(left)} of {len(sites)} sites: "
                      f"{', '.join(sorted(left))} left in float (the costliest alone; at all {len(sites)} the SQNR "
                      f"drops {drop:.2f} dB, over the {guard:g} dB guard)"
                      + (f"; {remedy.variant()}" if remedy.variant() else ""))
            return RemedyOutcome(remedy.name, RemedyStatus.KEPT, reason, candidate.measured, partial.user_lines(),
                                 candidate.io, measured), (partial, candidate)
    return RemedyOutcome(remedy.name, RemedyStatus.REFUSED, why, refused.measured, remedy.user_lines(), refused.io,
                         measured), None


# Each LayerNorm placed alone is a build and a lowering: past this many, the rest stay where Arm's
# quantizer puts them (on the NPU), and the report says so.
MOST_PLACED = 8


def _placed(remedy: LayerNormPlacement, baseline: Measurement, float_graph: Any, build: Build, config: Config,
            artifact: str, batches: Sequence[tuple[Any, ...]],
            reference: Sequence[torch.Tensor]) -> tuple[RemedyOutcome, tuple[Remedy, _Candidate] | None]:
    """Each LayerNorm placed on the CPU alone, priced against the plain build (on the NPU); those that
    make the inference cheaper within the guard are placed there together, and kept if that build is
    cheaper too. One LayerNorm is one build; several are each built alone, then together."""
    sites = remedy.sites(float_graph)
    guard = config.remedy_max_sqnr_drop_db

    def cheaper(m: Measurement | SiteMeasurement) -> bool:
        return m.cycles is not None and baseline.cycles is not None and m.cycles < baseline.cycles \
            and sqnr_drop(baseline, m) <= guard

    if len(sites) == 1:
        only = _built(build, [remedy], config, artifact, batches, reference)
        if not cheaper(only.measured):
            return RemedyOutcome(remedy.name, RemedyStatus.SKIPPED, "did not help: the NPU is cheaper", only.measured,
                                 remedy.user_lines(), only.io), None
        return (RemedyOutcome(remedy.name, RemedyStatus.KEPT, "; ".join(_gains(baseline, only.measured)),
                              only.measured, remedy.user_lines(), only.io), (remedy, only))
    alone: list[SiteMeasurement] = []
    chosen: set[str] = set()
    for site in sites[:MOST_PLACED]:
        try:
            measured = _priced(build, remedy.placed(frozenset({site})), config, artifact, batches, reference)
        except RemedyError as exc:
            alone.append(SiteMeasurement(site, math.nan, str(exc)))
            continue
        alone.append(measured)
        if cheaper(measured):
            chosen.add(site)
    unmeasured = f"; {len(sites) - MOST_PLACED} more left on the NPU unmeasured" if len(sites) > MOST_PLACED else ""
    if not chosen:
        return RemedyOutcome(remedy.name, RemedyStatus.SKIPPED, (
            f"did not help: at each of the {len(alone)} LayerNorms alone the NPU is cheaper{unmeasured}"),
            sites=tuple(alone)), None
    placed = remedy.placed(frozenset(chosen))
    together = _built(build, [placed], config, artifact, batches, reference)
    if not cheaper(together.measured):
        return RemedyOutcome(remedy.name, RemedyStatus.SKIPPED, (
            f"did not help: {len(chosen)} LayerNorms are cheaper on the CPU alone, not together{unmeasured}"),
            together.measured, placed.user_lines(), together.io, tuple(alone)), None
    reason = (f"{'; '.join(_gains(baseline, together.measured))}; {len(chosen)} of {len(sites)} LayerNorms on the "
              f"CPU, where each alone is cheaper{unmeasured}")
    return (RemedyOutcome(remedy.name, RemedyStatus.KEPT, reason, together.measured, placed.user_lines(),
                          together.io, tuple(alone)), (placed, together))


def _priced(build: Build, remedy: LayerNormPlacement, config: Config, artifact: str,
            batches: Sequence[tuple[Any, ...]], reference: Sequence[torch.Tensor]) -> SiteMeasurement:
    """One LayerNorm placed alone, priced: the inference's estimated cycles of its lowering and the SQNR
    of its quantized program. Nothing of it is written, so it is not fixed, verified or value-checked:
    the build that places the cheaper ones together is, as every remedy's build is."""
    from qlint.full.lint import lint_program

    assert remedy.at is not None and len(remedy.at) == 1
    [site] = remedy.at
    try:
        program, _, io = build_program(build, [remedy], config)
        linted = lint_program(program, artifact, config, RunOptions(split_costs=False), npu_inputs=())
        sqnr = program_sqnr(program, _fed(batches, [remedy], io), io, reference)
    except Exception as exc:  # export, quantization or the run raised with it
        raise RemedyError(f"{type(exc).__name__}: {first_line(exc)}") from None
    if linted.failure is not None:
        raise RemedyError(f"it does not lower: {first_line(linted.failure)}")
    return SiteMeasurement(site, sqnr, cycles=linted.stats.cycles)


def _other_flow(remedy: Remedy, config: Config) -> str | None:
    """Why `remedy` does not apply to a build for this target's flow, or None when it is that flow's."""
    if remedy.for_npu and config.npu is None:
        return "it places ops between an Ethos-U NPU and the CPU; this target lowers for the Cortex-M CPU alone"
    if not remedy.for_npu and config.npu is not None:
        return (f"it changes what the Cortex-M CPU flow quantizes; this target lowers for {config.npu.accelerator}, "
                "whose quantizer is Arm's")
    return None


def remediate(build: Build, names: Sequence[RemedyName], config: Config, artifact: str) -> Remediated:
    """Try each remedy alone against the plain build; build the kept ones together.

    Raises BuildError when the plain build fails.
    """
    batches = sqnr_batches(build)
    reference = float_outputs(build.model, batches)
    guard = config.remedy_max_sqnr_drop_db
    try:
        plain = _built(build, [], config, artifact, batches, reference)
    except RemedyError as exc:
        raise BuildError(f"the plain build fails: {exc}") from None
    baseline = plain.measured
    report = RemedyReport(artifact, baseline, sqnr_inputs=len(batches), max_sqnr_drop_db=guard)
    float_graph = export_float(build.model, build.example)
    kept: dict[RemedyName, tuple[Remedy, _Candidate]] = {}
    for name in names:
        remedy = REMEDIES[name]
        reason = _other_flow(remedy, config) or remedy.not_applicable(float_graph)
        if reason is not None:
            report.outcomes.append(RemedyOutcome(name, RemedyStatus.SKIPPED, f"does not apply: {reason}"))
            continue
        if isinstance(remedy, LayerNormPlacement):  # priced per LayerNorm, not kept for a gain elsewhere
            try:
                outcome, placed = _placed(remedy, baseline, float_graph, build, config, artifact, batches, reference)
            except RemedyError as exc:
                report.outcomes.append(RemedyOutcome(name, RemedyStatus.FAILED, str(exc)))
                continue
            report.outcomes.append(outcome)
            if placed is not None:
                kept[name] = placed
            continue
        try:
            candidate = _built(build, [remedy], config, artifact, batches, reference)
        except RemedyError as exc:
            report.outcomes.append(RemedyOutcome(name, RemedyStatus.FAILED, str(exc)))
            continue
        measured, io = candidate.measured, candidate.io
        if io is not None and not io.inputs and not io.outputs:
            report.outcomes.append(RemedyOutcome(name, RemedyStatus.SKIPPED, (
                "does not apply: no program input feeds one quantize and no output is a dequantize")))
            continue
        gains, drop = _gains(baseline, measured), sqnr_drop(baseline, measured)
        if gains and drop > guard:
            remedy, candidate, plain_drop = *_better_built(remedy, candidate, build, config, artifact, batches,
                                                           reference), drop
            measured, io = candidate.measured, candidate.io
            gains, drop = _gains(baseline, measured), sqnr_drop(baseline, measured)
            if remedy.variant() and gains and drop <= guard:
                gains = [*gains, f"{remedy.variant()} (built plainly, the SQNR drops {plain_drop:.2f} dB, "
                                 f"over the {guard:g} dB guard)"]
        if not gains:
            report.outcomes.append(RemedyOutcome(name, RemedyStatus.SKIPPED, "did not help", measured))
        elif drop > guard:
            outcome, partly = _refused_or_partly_kept(remedy, candidate, baseline, float_graph, build, config,
                                                      artifact, batches, reference)
            report.outcomes.append(outcome)
            if partly is not None:
                kept[name] = partly
        else:
            kept[name] = (remedy, candidate)
            report.outcomes.append(RemedyOutcome(name, RemedyStatus.KEPT, "; ".join(gains), measured,
                                                 remedy.user_lines(), io))
    if not kept:
        report.final = baseline
        return Remediated(plain.program, plain.build, report, plain.fixed)
    if len(kept) == 1:
        final = next(iter(kept.values()))[1]
    else:
        try:
            in_order = [kept[name][0] for name in REMEDIES if name in kept]  # the table's order, not the request's
            final = _built(build, in_order, config, artifact, batches, reference)
        except RemedyError as exc:
            return Remediated(plain.program, plain.build, report, plain.fixed,
                              f"the kept remedies together fail, nothing written: {exc}")
    drop = sqnr_drop(baseline, final.measured)
    if drop > guard and len(kept) > 1:
        final = _without_one(kept, report, final, drop, build, config, artifact, batches, reference) or final
        drop = sqnr_drop(baseline, final.measured)
    report.final, report.io = final.measured, final.io
    if drop > guard:
        return Remediated(final.program, final.build, report, final.fixed, (
            f"with {', '.join(kept)} together the SQNR drops {drop:.2f} dB "
            f"({baseline.sqnr_db:.1f} -> {final.measured.sqnr_db:.1f} dB), over the {guard:g} dB guard; "
            "nothing written"
        ))
    return Remediated(final.program, final.build, report, final.fixed)


def _without_one(kept: dict[RemedyName, tuple[Remedy, _Candidate]], report: RemedyReport, together: _Candidate,
                 drop: float, build: Build, config: Config, artifact: str, batches: Sequence[tuple[Any, ...]],
                 reference: Sequence[torch.Tensor]) -> _Candidate | None:
    """Kept remedies each within the guard alone, over it together: built without one of them in
    turn, the build within the guard that leaves the fewest fp32 elements (then the best SQNR). The
    one it leaves out is refused with both figures, and `kept` loses it. None when no such build is."""
    guard = config.remedy_max_sqnr_drop_db
    builds: list[tuple[RemedyName, _Candidate]] = []
    for left in kept:
        rest = [kept[name][0] for name in REMEDIES if name in kept and name != left]
        try:
            candidate = next(c for n, (_, c) in kept.items() if n != left) if len(rest) == 1 else \
                _built(build, rest, config, artifact, batches, reference)
        except RemedyError:
            continue
        if sqnr_drop(report.baseline, candidate.measured) <= guard:
            builds.append((left, candidate))
    if not builds:
        return None
    left, best = min(builds, key=lambda b: (b[1].measured.fp32_elements, -b[1].measured.sqnr_db))
    index, alone = next((i, o) for i, o in enumerate(report.outcomes) if o.remedy == left)
    report.outcomes[index] = dataclasses.replace(alone, status=RemedyStatus.REFUSED, reason=(
        f"{alone.reason} alone, but with {', '.join(kept)} together the SQNR drops {drop:.2f} dB "
        f"({report.baseline.sqnr_db:.1f} -> {together.measured.sqnr_db:.1f} dB), over the {guard:g} dB guard; "
        f"left out, the build without it leaves the fewest fp32 elements ({best.measured.fp32_elements})"))
    del kept[left]
    return best
