"""The bounds on what one input may cost (`limits:` in `.qlint.yaml`): a hostile artifact gets an
error line, not the machine. One record, read by every reader and child process."""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20
# The most one constant a rule reads or computes may hold, in either tier: a mask or a filled scale
# is small, and an untrusted program may ask `aten.full` (or a payload) for any size.
MAX_CONSTANT_BYTES = 16 * MIB


@dataclass(frozen=True)
class Limits:
    """Bounds on what an input may cost: a hostile artifact gets an error, not the machine."""

    file_mb: float = 64         # the largest .pt2, .pte, config or baseline read
    entry_mb: float = 32        # one .pt2 entry after decompression (all entries: twice file_mb)
    tensor_mb: float = 256      # all tensors a program's graph declares, together
    graph_objects: float = 400_000  # JSON objects and lists in a `.pt2`'s program (~9,000 nodes): its memory
    timeout_s: float = 900      # one target (export, quantization, checks), .pte or, with --jobs, artifact
    memory_mb: float = 4096     # what such a child process may allocate on top of the loaded stack
    pte_instructions: float = 100_000  # instructions a .pte runs, counted before it is decoded
    pte_entries: float = 500_000       # tables a .pte declares (values, instructions, ...) + values they read

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
