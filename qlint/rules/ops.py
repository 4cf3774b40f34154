"""The op tables both tiers classify nodes by, by base name (`div` for `aten.div.Tensor`).

One table each: an island found before lowering (the static tier, aten ops) and after it (the full
check, edge ops with their `_copy` forms) is made of the same kinds of op.
"""

from __future__ import annotations

# `x op c` by a constant: what makes a constant scale island (QL001).
SCALE_OPS = frozenset({"div", "mul"})
# `x op c` of a uniform constant: an attention mask that masks nothing, a bias; an island of them
# alone (`fc(fc(x) + 0.5)`) is a constant scale island of factor 1 (QL001) too.
OFFSET_OPS = frozenset({"add", "sub"})
# Ops that only move or reinterpret data: part of an island when they carry floats, not counted as
# compute for coverage.
SHAPE_OPS = frozenset({
    "view", "view_copy", "_unsafe_view", "reshape", "permute", "permute_copy", "transpose",
    "transpose_copy", "t", "t_copy", "clone", "_clone_dim_order", "contiguous", "expand",
    "expand_copy", "squeeze", "squeeze_copy", "unsqueeze", "unsqueeze_copy", "flatten",
    "unflatten", "slice", "slice_copy", "select", "select_copy", "getitem", "alias",
    "alias_copy", "detach", "_to_copy", "_to_dim_order_copy", "split", "split_copy",
    "split_with_sizes_copy", "cat", "chunk", "identity",
})
# Of those, the ones that read several tensors or write several (a join or a fork) or change the
# dtype: a chain of one input into one output, as the static tier walks it, does not pass them.
NOT_A_CHAIN = frozenset({"getitem", "split", "split_copy", "split_with_sizes_copy", "cat", "chunk", "_to_copy",
                         "_to_dim_order_copy", "unflatten", "identity"})
SYMBOLS = {"div": "/", "mul": "*", "add": "+", "sub": "-"}
