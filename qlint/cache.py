"""Answer a check of an unchanged artifact from disk, without importing torch.

An entry is keyed by the artifact's bytes, its displayed name, the config
(contents, mtime and command-line overrides), a hash of qlint's own code and
the versions of qlint, torch, torchao and executorch (read from package
metadata, not by importing them).
Entries are JSON; anything that does not parse into findings is ignored and
rewritten, never trusted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from functools import lru_cache
from importlib import metadata, resources
from pathlib import Path
from typing import Any

from qlint import __version__
from qlint.config import Config
from qlint.findings import ArtifactStats, Finding, Location, Report
from qlint.output import write_atomic

SCHEMA = 1
STACK = ("torch", "torchao", "executorch", "tosa-tools")


def default_dir() -> Path:
    if os.environ.get("QLINT_CACHE_DIR"):
        return Path(os.environ["QLINT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "qlint"


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """A hash of qlint's own modules and rule catalog.

    Installs from different git revisions (a pre-commit `rev:` bump, an
    editable checkout) share a version number; their results must not.
    """
    package = Path(__file__).resolve().parent
    rules = Path(str(resources.files("qlint._rules")))
    digest = hashlib.sha256()
    for file in sorted([*package.glob("*.py"), *rules.glob("*.yaml")], key=lambda f: f.name):
        digest.update(file.name.encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


def _versions() -> dict[str, str]:
    found = {"qlint": __version__, "qlint-code": code_fingerprint()}
    for name in STACK:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "missing"
    return found


def _config_fingerprint(config: Config) -> str:
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name != "path"}
    text = json.dumps(fields, default=str, sort_keys=True)
    if config.path is not None and config.path.exists():
        stat = config.path.stat()
        text += f"|{config.path.resolve()}|{stat.st_mtime_ns}|{hashlib.sha256(config.path.read_bytes()).hexdigest()}"
    return text


class Cache:
    def __init__(self, directory: Path, config: Config, options: dict[str, Any]) -> None:
        self.directory = directory
        self.salt = json.dumps(
            {"schema": SCHEMA, "versions": _versions(), "config": _config_fingerprint(config), "options": options},
            sort_keys=True, default=str,
        )

    def key(self, path: Path, artifact: str) -> str:
        digest = hashlib.sha256(self.salt.encode())
        digest.update(artifact.encode() + b"\0")
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()

    def _file(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str) -> Report | None:
        try:
            data = json.loads(self._file(key).read_text(encoding="utf-8"))
            if data.get("schema") != SCHEMA:
                return None
            findings = [_finding(f) for f in data["findings"]]
            stats = [ArtifactStats(**s) for s in data["stats"]]
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return None  # missing or corrupt: recompute and rewrite
        return Report(findings=findings, stats=stats)

    def put(self, key: str, report: Report) -> None:
        if report.errors:
            return  # input errors are re-reported every run
        data = {"schema": SCHEMA, "findings": [f.to_dict() for f in report.findings],
                "stats": [s.to_dict() for s in report.stats]}
        target = self._file(key)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(target, json.dumps(data).encode())
        except OSError:
            pass  # a read-only cache only costs speed


def _finding(data: dict[str, Any]) -> Finding:
    location = Location(**data["location"]) if data["location"] else None
    return Finding(**{**data, "location": location})
