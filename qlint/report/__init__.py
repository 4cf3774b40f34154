"""What a finished run says: text, JSON, GitHub, SARIF and markdown formats, inline suppressions
and baselines, Model Explorer node data and the memory plot. Reads records only, never a graph."""

# The report's formats (`--output-format`, `--write FORMAT:PATH`), named once: `formats.FORMATS`
# renders each but text, and the command line reads the names here without loading a renderer.
OUTPUT_FORMATS = ("text", "json", "github", "sarif", "markdown")
# What `--write KIND:PATH` writes beside the report: files about the run (`cli.commands.check.WRITERS`).
EXTRA_WRITES = ("patch", "model-explorer", "memory-plot", "metrics", "time-plot", "profile-comparison")
