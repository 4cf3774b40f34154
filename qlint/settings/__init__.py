"""How qlint is asked to run: `.qlint.yaml` (discovery, parsing with line numbers, validation),
the options of one run, and the fold guards a config sets, checked in one place for both tiers."""
