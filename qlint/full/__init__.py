"""The full tier, beside `static/`: the rules over a lowered program (`rules`), the one driver that
lowers or reads a program and runs them for a `.pt2`, a `.pte` or a config target (`lint`), and
QL009, which holds a run's figures to the config's budgets (`over_budget`)."""
