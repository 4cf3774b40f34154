"""One module a command: `check` (also `qlint fix`, which is `check --fix`), `rules`, `rule`, `boards`, `init`.
Each takes what the parser read and returns the exit code; torch is imported only inside `check`,
once a program has to be read."""
