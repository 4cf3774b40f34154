"""Loading torch, torchao and executorch as qlint needs them: the ops registered, the logs quiet.

Modules of `loading/`, `analysis/`, `device/`, `full/`, `fix/` and `remedies/` import the stack at
module level (the layering test allows it there and nowhere else); what reaches them first calls
`load()`, which registers the ops every reader needs. The CLI imports them only after deciding that
a program must really be read, so `--help`, `--version`, `rules`, `--static` and cached answers
never pay the 4-8 s import.
"""

from __future__ import annotations

import logging
import warnings
from functools import lru_cache

# Import-time chatter from these loggers is noise to a linter's user
# (torchao's optional CUDA kernels, pytree deprecations, fake-tensor retries).
_QUIET = {
    "torchao": logging.ERROR,
    "torch": logging.ERROR,
    "torch._subclasses.fake_tensor": logging.CRITICAL,
    "torch.export._trace": logging.CRITICAL,  # repeats, as log lines, the export error qlint reports
    "executorch": logging.ERROR,
    "executorch.exir.pass_manager": logging.ERROR,  # "PassManager is deprecated" on every lowering
    "root": logging.ERROR,
}


def quiet_logs(verbose: bool = False) -> None:
    if verbose:
        return
    for name, level in _QUIET.items():
        logging.getLogger(None if name == "root" else name).setLevel(level)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=UserWarning)


@lru_cache(maxsize=1)
def load() -> None:
    """Import the stack and register the ops every reader needs.

    `torch.export.load` of a quantized .pt2 fails unless the quantized_decomposed
    ops are registered; the cortex_m ops module registers cortex_m.* kernels.
    """
    verbose = logging.getLogger().isEnabledFor(logging.DEBUG)
    import torch  # noqa: F401

    quiet_logs(verbose)  # torch configures its loggers on import: quiet them after
    import executorch.backends.cortex_m.passes  # noqa: F401

    # The quantizer module registers the cortex_m ops before the passes package
    # needs them; importing the ops module first is a circular import.
    import executorch.backends.cortex_m.quantizer.quantizer  # noqa: F401
    import torchao.quantization.pt2e.quantize_pt2e  # noqa: F401  (quantized_decomposed ops)

    quiet_logs(verbose)  # some executorch modules set their logger levels on import
    from qlint.loading import speedups

    speedups.ask_the_dispatcher_once_per_collection()
