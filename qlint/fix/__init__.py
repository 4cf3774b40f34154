"""`qlint --fix`: apply the folds `analysis.folds` proved exact to a lowered program, verify the result
end to end and emit a `.pte` for Cortex-M; nothing is written when verification fails."""
