"""The `qlint` command line, with ruff's habits: argument parsing, one-line errors with documented
exit codes, and torch imported only once a program has to be read."""
