"""The inputs qlint runs a program on: the example inputs saved with it, and batches made up like
them from named seeds. One module, so a check, a fix's verification and a remedy's SQNR each say
which seeds and spread they ran, and no two of them draw the same batch by accident."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def sample_inputs(program: Any) -> tuple[Any, ...] | None:
    """The example inputs saved with a program, when they are plain positional tensors."""
    example = getattr(program, "example_inputs", None)
    if not example:
        return None
    args, kwargs = example
    return tuple(args) if not kwargs else None


def check_inputs(quantized: Any | None) -> list[tuple[Any, ...]]:
    """What the check runs a lowered program against the quantized one it came from on: the sample
    inputs saved with that program (one run of each; `--fix` checks its verification inputs too)."""
    example = sample_inputs(quantized) if quantized is not None else None
    return [example] if example else []


def npu_check_inputs(quantized: Any | None) -> list[tuple[Any, ...]]:
    """What the check runs a program lowered for an Ethos-U on, its NPU partitions on the TOSA reference
    model: the sample inputs and VERIFY_SEEDS seeded batches like them, as `--fix` verifies a fold (a
    partition is many ops judged at its outputs: one batch seldom reaches all of them)."""
    return verification_inputs(sample_inputs(quantized) if quantized is not None else None)


def made_up_inputs(module: Any) -> tuple[Any, ...] | None:
    """One batch for a graph's placeholders, seed 0, each with its recorded shape, dtype and strides:
    what a program that saved no inputs (a `.pte`) is run on. None when an input is not a tensor."""
    import torch

    from qlint.loading.view import output_value

    templates = []
    for node in module.graph.nodes:
        if node.op != "placeholder":
            continue
        val = output_value(node)
        if not isinstance(val, torch.Tensor):
            return None
        # a real tensor with the recorded strides: `zeros_like` of a program's fake value is fake
        templates.append(torch.empty_strided(tuple(val.shape), tuple(val.stride()), dtype=val.dtype,
                                             device="cpu").zero_())
    [inputs] = seeded_batches(tuple(templates), 1, 0)
    return inputs


# `--fix` verifies each fold bit for bit on the artifact's own inputs and VERIFY_SEEDS seeded batches
# (each costs one run of the program before and after the folds), drawn with twice a unit normal's
# spread so that values past the calibrated range, which the quantize clamps, are checked too.
VERIFY_SEEDS = 8
VERIFY_SPREAD = 2.0


def seeded_batches(template: tuple[Any, ...], count: int, first_seed: int,
                   spread: float | Callable[[Any], float] = 1.0) -> list[tuple[Any, ...]]:
    """`count` batches like `template` (`seeded_like`), batch i drawn with seed `first_seed + i` and
    scaled by `spread` (a number, or a function of the template tensor): the one way qlint makes up
    inputs, so a check, a fix and a remedy's SQNR each name their seeds and spread."""
    import torch

    batches = []
    for seed in range(first_seed, first_seed + count):
        generator = torch.Generator().manual_seed(seed)
        batches.append(tuple(seeded_like(t, generator, spread(t) if callable(spread) else spread) for t in template))
    return batches


def seeded_like(template: Any, generator: Any, scale: float = 1.0) -> Any:
    """A seeded normal tensor with the template's shape, dtype and strides (channels_last stays
    channels_last: a lowered program's layout is fixed by its inputs'); non-float inputs are kept."""
    import torch

    if not isinstance(template, torch.Tensor) or not template.is_floating_point():
        return template
    values = torch.randn(tuple(template.shape), generator=generator, dtype=template.dtype) * scale
    return torch.empty_strided(template.shape, template.stride(), dtype=template.dtype).copy_(values)


def verification_inputs(
    example: tuple[Any, ...] | None, extra: Sequence[tuple[Any, ...]] = (), seeds: int = VERIFY_SEEDS
) -> list[tuple[Any, ...]]:
    """The artifact's own inputs plus `seeds` seeded random batches of the same shapes and layouts."""
    batches = [b for b in ([example] if example else []) + list(extra)]
    if not batches:
        return []
    return batches + seeded_batches(batches[0], seeds, 0, VERIFY_SPREAD)
