"""qlint: find and fold the fp32 islands left in quantized programs lowered for Cortex-M.

This module must stay free of torch imports: `qlint --version`, `--help` and
`rules` are answered from here and from the YAML catalog alone.
"""

__version__ = "0.1.0"
