"""What a finished run says: text, JSON, GitHub, SARIF and markdown formats, the metrics file and what
changed against one, Model Explorer node data, the memory and time plots. Reads records only, never a
graph; suppressions and baselines are applied before a report is written (`run.suppressions`)."""

# The report's formats (`--output-format`, `--write FORMAT:PATH`), named once: `formats.FORMATS`
# renders each but text, and the command line reads the names here without loading a renderer.
OUTPUT_FORMATS = ("text", "json", "github", "sarif", "markdown")
# What `--write KIND:PATH` writes beside the report: files about the run (`cli.commands.check.WRITERS`).
EXTRA_WRITES = ("patch", "model-explorer", "memory-plot", "metrics", "time-plot", "profile-comparison")
