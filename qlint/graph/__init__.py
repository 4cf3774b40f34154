"""The full tier, over real programs with the pinned torch stack: read a `.pt2`/`.pte` or quantize
a factory's model, lower it for Cortex-M, view the graph in any dialect, find islands and
requantize pairs, evaluate them exhaustively, explain with ExecuTorch's own checks why an op
stayed fp32, decide folds, map nodes to source lines and plan memory; `rules` turns that into
findings. The only layer below `fix` and `remedies` that imports torch."""
