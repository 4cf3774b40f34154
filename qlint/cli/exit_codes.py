"""The exit codes of `qlint` (the one list; docs/cli.md repeats it).

  0    no finding at error severity (`--fail-on` moves the line);
  1    findings at error severity;
  2    usage, config, input or output errors: a bad option (one line and a `--help` hint),
       a path that cannot be read, a `--write` that cannot be written, stdout closed (`>&-`);
  130  interrupted (Ctrl-C): one line, and no temp file or half-written output is left.
A reader that stops reading stdout early (`qlint check | head -1`) ends the report quietly and
does not change the exit code: the `--write` files are still written and the code is the run's.
(Ruff and ripgrep exit 0 there, Python's docs suggest 1; either would say something about the
programs that the run did not find, and under `set -o pipefail` a 0 would pass a failing gate.)
"""

EXIT_OK, EXIT_FINDINGS, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130
