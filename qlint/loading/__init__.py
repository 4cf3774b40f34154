"""Loading a program: the pinned torch stack, a `.pt2` or `.pte` read from checked bytes, a config
target's factory exported and quantized, the Cortex-M lowering, the inputs a program is run on, and
`view.GraphView`, the one view of a graph every later stage reads. Readers only read: no rule, cost
or report is made here."""
