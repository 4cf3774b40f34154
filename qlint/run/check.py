"""One run as `qlint check` makes it, for the command line and `qlint.api.check` alike, so the two
cannot report different findings: the config for its board, the inputs chosen, every input checked
by the engine (QL009 over the measured figures included), then the `# qlint: ignore` comments
(QL006 for those that silenced nothing) and the baseline applied.

Torch is imported by the engine only, once a program has to be read: with `--static` never.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qlint.run.suppressions import apply_baseline, apply_suppressions, read_baseline

if TYPE_CHECKING:
    from qlint.records.results import Report
    from qlint.run.cache import Cache
    from qlint.settings.config import Config, Target
    from qlint.settings.npus import NpuChoice
    from qlint.settings.options import RunOptions


def for_board(config: Config, board: str | None = None, cpu: str | None = None,
              npu: NpuChoice | None = None) -> Config:
    """`config` for `board` (else its own `board:`), `cpu` and the command line's `npu` (`--target`,
    `--system-config`, `--memory-mode`), each config target tried as the engine will take it
    (`Config.for_target`), so that a board and a CPU that disagree (an FPU on a core without one), or a
    Vela section left without an NPU, are refused before the run, not mid-run. Raises ValueError."""
    board = board if board is not None else config.board
    if board is not None:
        config = config.with_board(board, cpu)
    config = config.with_overrides(target_cpu=cpu)
    if npu is not None:
        config = config.with_npu(npu)
    for target in config.targets:
        config.for_target(target)
    return config


def inputs(paths: Sequence[Path], config: Config, *, targets_only: bool = False,
           static: bool = False) -> tuple[list[Path], list[Target]]:
    """The paths and config targets to check: the named paths alone, the targets alone with
    `targets_only`, else the current directory and the targets (not with `static`, which cannot
    build a target)."""
    if targets_only:
        return [], list(config.targets)
    if paths:
        return list(paths), []
    return [Path(".")], [] if static else list(config.targets)


def measures(config: Config, metrics: bool = False) -> bool:
    """Whether each program's figures are measured: budgets to hold them to (QL009), or `metrics`
    (to write or compare with a base run)."""
    return config.budgets.any or any(t.budgets is not None for t in config.targets) or metrics


def check(
    paths: list[Path],
    targets: list[Target],
    config: Config,
    options: RunOptions,
    cache: Cache | None = None,
    *,
    baseline: Path | None = None,
    jobs: int = 1,
    shard: tuple[int, int] | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    base: dict[str, dict[str, Any]] | None = None,
    taken: Mapping[tuple[object, ...], str] | None = None,
) -> Report:
    """The report `qlint check` gives: the engine's (`engine.run`, its arguments), with the findings
    that `# qlint: ignore` comments silence dropped, QL006 for the comments that silenced nothing,
    and then the findings `baseline` accepts dropped. The baseline is read first: a BaselineError
    before anything is checked."""
    from qlint.run import engine

    accepted = read_baseline(baseline) if baseline is not None else None
    report = engine.run(paths, targets, config, options, cache, jobs=jobs, shard=shard, progress=progress, base=base,
                        taken=taken)
    apply_suppressions(report, config)
    if accepted is not None:
        apply_baseline(report, accepted)
    return report
