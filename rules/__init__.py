"""The rule catalog: one YAML file per rule, installed as the package `qlint._rules`."""
