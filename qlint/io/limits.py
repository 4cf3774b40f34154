"""The bounds on what one input may cost: a hostile artifact gets an error line, not the machine.

The one record of them: `Limits`, which `limits:` in `.qlint.yaml` sets, read by every reader and
child process; and below it the fixed bounds no config changes, each with why it is what it is.
A bound's error says which of the two it is (`io.reads.CONFIGURED`, `io.reads.FIXED`)."""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20
# The most one constant a rule reads or computes may hold, in either tier: a mask or a filled scale
# is small, and an untrusted program may ask `aten.full` (or a payload) for any size.
MAX_CONSTANT_BYTES = 16 * MIB
# The most all computed constants of one program may read and write together: an untrusted program
# may apply a cheap op to one large constant tens of thousands of times (minutes in a 2 MB .pte).
MAX_COMPUTED_TOTAL_BYTES = 256 * MIB
# What QL007's runs of a program hold at once (`analysis.values.Held`: the values they made and have not
# dropped, and the next node's recorded output): the largest programs of the test zoo need a few MiB.
# A node that would not fit is not run, and QL007 says the program cannot be checked.
RUN_BUDGET_BYTES = 256 * MIB
# Input integers the static tier's identity verdicts of one program may evaluate (4,096 distinct
# int16 islands, about a second): tens of thousands of distinct int16 pairs would hold the
# in-process tier for minutes.
MAX_EVALUATED_INTEGERS = 1 << 28
# Dimensions a `.pte` tensor may declare, checked before its sizes are converted (every instruction
# may name the tensor): ExecuTorch's runtime caps a tensor's rank at 16 too (`kTensorDimensionLimit`,
# runtime/core/exec_aten/util/tensor_dimension_limit.h).
MAX_TENSOR_DIMS = 16
# Nodes a walk up one value's producers visits (to name an operand as the user wrote it, or the
# program inputs it comes from): real chains are a handful long; a crafted one stops here.
MAX_WALK_NODES = 10_000

# Files qlint reads besides artifacts, fixed: a config is a page of YAML; the JSON other runs wrote
# (baselines, metrics, result cache entries) holds thousands of findings or artifacts in a MiB or
# two; a model source file read for `# qlint: ignore` or a patch is a module, not a data file.
CONFIG_MAX_BYTES = 1 * MIB
RECORD_MAX_BYTES = 16 * MIB
SOURCE_MAX_BYTES = 4 * MIB


@dataclass(frozen=True)
class Limits:
    """Bounds on what an input may cost: a hostile artifact gets an error, not the machine."""

    file_mb: float = 64         # the largest .pt2, .pte, ETDump, ETRecord or target module read
    entry_mb: float = 32        # one .pt2 entry after decompression (all entries: twice file_mb)
    tensor_mb: float = 256      # all tensors a program's graph declares, together
    graph_objects: float = 400_000  # JSON objects and lists in a `.pt2`'s program (~9,000 nodes): its memory
    timeout_s: float = 900      # one target (export, quantization, checks), .pte or, with --jobs, artifact
    memory_mb: float = 4096     # what such a child process may allocate on top of the loaded stack
    pte_instructions: float = 100_000  # instructions a .pte runs, counted before it is decoded
    pte_entries: float = 500_000       # tables a .pte declares (values, instructions, ...) + values they read
    profile_entries: float = 200_000  # events, tables and vector items an ETDump (--profile) decodes to

    @property
    def file_bytes(self) -> int:
        return int(self.file_mb * MIB)

    @property
    def entry_bytes(self) -> int:
        return int(self.entry_mb * MIB)

    @property
    def total_bytes(self) -> int:
        """All entries of one archive together, after decompression."""
        return 2 * self.file_bytes

    @property
    def tensor_bytes(self) -> int:
        return int(self.tensor_mb * MIB)
