"""Answer a check of an unchanged artifact or config target from disk, without importing torch.

An entry is keyed by the artifact's bytes (a target's: the repository files its
factory imports, see `Cache.target_key`), its displayed name, the config
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
import sys
import typing
from functools import lru_cache
from importlib import metadata, resources
from pathlib import Path
from typing import Any

from qlint import __version__
from qlint.io.reads import ReadError, read_input
from qlint.io.writes import write_atomic
from qlint.rules.catalog import load_catalog
from qlint.rules.records import (
    ArtifactStats,
    Contributor,
    Figures,
    Finding,
    LivePeak,
    Location,
    MemoryTimeline,
    PlanMemory,
    Report,
    Severity,
)
from qlint.settings.config import CONFIG_MAX_BYTES, Config, Target
from qlint.settings.options import RunOptions

SCHEMA = 2
ENTRY_MAX_BYTES = 16 << 20
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
    package = Path(__file__).resolve().parents[1]
    rules = Path(str(resources.files("qlint._rules")))
    files = {f.relative_to(package).as_posix(): f for f in package.rglob("*.py") if "__pycache__" not in f.parts}
    files.update({f"_rules/{f.name}": f for f in rules.glob("*.yaml")})
    digest = hashlib.sha256()
    for name, file in sorted(files.items()):
        digest.update(name.encode() + b"\0" + file.read_bytes())
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
    if config.path is not None:
        try:
            body = read_input(config.path, CONFIG_MAX_BYTES, "config file")
            text += f"|{config.path.absolute()}|{config.path.stat().st_mtime_ns}|{hashlib.sha256(body).hexdigest()}"
        except (ReadError, OSError):
            text += "|unreadable"
    return text


class Cache:
    def __init__(self, directory: Path, config: Config, options: RunOptions) -> None:
        self.directory = directory
        self.salt = json.dumps(
            {"schema": SCHEMA, "versions": _versions(), "config": _config_fingerprint(config),
             "options": options.cache_key()},
            sort_keys=True, default=str,
        )

    def key(self, data: bytes, artifact: str) -> str:
        """The entry for these artifact bytes: the same bytes that are checked on a miss."""
        digest = hashlib.sha256(self.salt.encode())
        digest.update(artifact.encode() + b"\0")
        digest.update(data)
        return digest.hexdigest()

    def target_key(self, target: Target, config: Config) -> str | None:
        """The entry for a config target: its definition and the contents of every repository
        file its factory imports (`qlint.run.imports`), with the versions of what it imports from
        outside. None when the imports cannot be known without running them."""
        from qlint.run.imports import dependencies

        module = target.factory.split(":")[0]
        found = dependencies(module, config.base, config.root, config.limits.file_bytes)
        if found.uncacheable is not None:
            return None
        digest = hashlib.sha256(self.salt.encode())
        digest.update(json.dumps({"target": dataclasses.asdict(target), "python": sys.version,
                                  "imports": found.distributions}, sort_keys=True, default=str).encode())
        for path, body in found.files.items():
            digest.update(b"\0" + path.encode() + b"\0" + hashlib.sha256(body).digest())
        return digest.hexdigest()

    def _file(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str, artifact: str) -> Report | None:
        """The cached report of `artifact`, or None when missing or not exactly what `put` writes."""
        try:
            data = json.loads(read_input(self._file(key), ENTRY_MAX_BYTES, "cache entry"))
            return _report(data, artifact)
        except (ReadError, ValueError, TypeError, KeyError, AttributeError, RecursionError):
            return None  # missing, corrupt or tampered with: recompute and rewrite

    def put(self, key: str, report: Report) -> None:
        if report.errors:
            return  # input errors are re-reported every run
        data = {"schema": SCHEMA, "findings": [f.to_dict() for f in report.findings],
                "stats": [s.to_dict() for s in report.stats], "memory": [m.to_dict() for m in report.memory],
                "figures": [dataclasses.asdict(f) for f in report.figures]}
        target = self._file(key)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(target, json.dumps(data).encode())
        except OSError:
            pass  # a read-only cache only costs speed


def _report(data: Any, artifact: str) -> Report | None:
    """Rebuild a report, checking every field's type: a well-formed entry that says less
    than a real check (no summary row, a finding of another artifact) is no answer."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or set(data) != {"schema", "findings", "stats",
                                                                                   "memory", "figures"}:
        return None
    if not isinstance(data["stats"], list) or len(data["stats"]) != 1 or not isinstance(data["findings"], list):
        return None
    if not isinstance(data["memory"], list) or len(data["memory"]) > 1:
        return None
    stats = _record(ArtifactStats, data["stats"][0])
    findings = [_finding(item) for item in data["findings"]]
    memory = [_plan_memory(item) for item in data["memory"]]
    if stats is None or stats.artifact != artifact or any(f is None or f.artifact != artifact for f in findings):
        return None
    if any(m is None or m.artifact != artifact for m in memory):
        return None
    if not isinstance(data["figures"], list) or len(data["figures"]) > 1:
        return None
    figures = [_figures(item) for item in data["figures"]]
    if any(f is None or f.artifact != artifact for f in figures):
        return None
    return Report(findings=findings, stats=[stats], memory=memory, figures=figures)  # type: ignore[arg-type]


def _record(cls: Any, data: Any, **nested: Any) -> Any:
    """`cls(**data)` when data has exactly cls's fields, each of its annotated type."""
    hints = typing.get_type_hints(cls)
    if not isinstance(data, dict) or set(data) != set(hints):
        return None
    for name, value in data.items():
        if name in nested:
            continue
        allowed = _TYPES[hints[name]]
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            return None
    return cls(**{**data, **nested})


def _finding(data: Any) -> Finding | None:
    if not isinstance(data, dict) or "location" not in data:
        return None
    location = None
    if data["location"] is not None:
        location = _record(Location, data["location"])
        if location is None:
            return None
    severity = data.get("severity")
    if severity not in tuple(Severity) or severity == Severity.OFF:
        return None
    finding = _record(Finding, data, location=location, severity=Severity(severity))
    if finding is None or finding.code not in load_catalog():
        return None
    return finding


def _contributors(data: Any) -> tuple[Contributor, ...] | None:
    if not isinstance(data, list):
        return None
    found = []
    for item in data:
        if not isinstance(item, dict) or "location" not in item:
            return None
        location = _record(Location, item["location"]) if item["location"] is not None else None
        if item["location"] is not None and location is None:
            return None
        contributor = _record(Contributor, item, location=location)
        if contributor is None:
            return None
        found.append(contributor)
    return tuple(found)


def _figures(data: Any) -> Figures | None:
    """A measured artifact's figures, with their contributors; `findings` counts by known code."""
    if not isinstance(data, dict):
        return None
    parts = {key: _contributors(data.get(key)) for key in ("sram", "flash", "fp32")}
    counts = data.get("findings")
    if any(part is None for part in parts.values()) or not isinstance(counts, dict) or not all(
            code in load_catalog() and type(n) is int and n >= 0 for code, n in counts.items()):
        return None
    return _record(Figures, data, findings=counts, **parts)


def _plan_memory(data: Any) -> PlanMemory | None:
    if not isinstance(data, dict) or not isinstance(data.get("timeline"), dict):
        return None
    series = data["timeline"]
    if set(series) != {"total", "fp32"} or not all(isinstance(series[k], list) for k in series):
        return None
    values = [*series["total"], *series["fp32"]]
    if not series["total"] or len(series["total"]) != len(series["fp32"]) or not all(
        type(v) is int for v in values
    ):
        return None
    timeline = MemoryTimeline(tuple(series["total"]), tuple(series["fp32"]))
    peak = _record(LivePeak, data.get("peak"))
    if peak is None or not 0 <= peak.step < len(timeline.total):
        return None
    return _record(PlanMemory, data, timeline=timeline, peak=peak)


# Field annotations of the cached records -> the JSON types that may fill them.
_TYPES: dict[Any, tuple[type, ...]] = {
    str: (str,), int: (int,), bool: (bool,), float: (float, int),
    dict[str, Any]: (dict,), Location | None: (dict, type(None)), str | None: (str, type(None)),
    int | None: (int, type(None)),
}
