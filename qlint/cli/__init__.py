"""The `qlint` command line, with ruff's habits: argument parsing, one-line errors with documented
exit codes, and torch imported only once a program has to be read.

`main` parses and dispatches; `commands` holds one module a command; `output` is how they print
(a closed stream is no traceback) and `exit_codes` how a run ends."""
