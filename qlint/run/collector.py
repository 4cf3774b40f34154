"""The garbage collector in the processes qlint owns: the stack's objects frozen out of its generations.

Importing torch, torchao and ExecuTorch leaves about 450,000 tracked objects that live as long as the
process. Lowering allocates fast (every `run_decompositions` registers ~12,000 kernels and restores
them), and each full collection walks all of those objects again: 70 % of those registrations' time
here, and a check of 20 small `.pt2` files 9-14 % faster frozen, with the same report. Frozen before
the forkserver forks, the objects are not written to by the children's collections either.

Only a process that is qlint's freezes: the command (`own_the_process` from `cli.main`), its
forkserver, the test suite's workers. A host that calls qlint's API keeps its collector as it set it:
freezing objects it may still free is its call.
"""

from __future__ import annotations

import gc

_owned = False
_frozen = False


def own_the_process() -> None:
    """Say that this process is qlint's: `freeze_the_stack` freezes in it."""
    global _owned
    _owned = True


def freeze_the_stack() -> None:
    """Load the stack; in a process qlint owns, freeze what is alive then, once."""
    from qlint.loading import stack

    stack.load()
    global _frozen
    if _owned and not _frozen:
        _frozen = True
        gc.freeze()
