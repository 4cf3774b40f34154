"""What a finished run says: text, JSON, GitHub, SARIF and markdown formats, inline suppressions
and baselines, Model Explorer node data and the memory plot. Reads records only, never a graph."""
