"""Answer a check of an unchanged artifact or config target from disk, without importing torch.

An entry is keyed by the artifact's bytes (a target's: the repository files its
factory imports, see `Cache.target_key`), its displayed name, the config
(contents, mtime and command-line overrides), a hash of qlint's own code and
the versions of qlint, torch, torchao and executorch (read from package
metadata, not by importing them).
Entries are JSON; anything that does not parse into findings is ignored and
rewritten, never trusted.

A cache folder can sit in a checkout (`--cache-dir .qlint_cache`, or a HOME inside it), where a
pull request can add files. So an entry is read only when it is signed with the folder's key
(HMAC-SHA256 over its name and contents: an entry altered, or moved to another artifact's name,
after qlint wrote it is no answer), the key is one qlint made (a regular file of this user's,
readable by nobody else: a checkout writes 0644 files), and no file of the folder is tracked by
the git repository around it. A folder `actions/cache` restored keeps its key and its answers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
import secrets
import stat
import subprocess
import sys
import typing
from functools import lru_cache
from importlib import metadata, resources
from pathlib import Path
from typing import Any

from qlint import __version__
from qlint.io.limits import CONFIG_MAX_BYTES, RECORD_MAX_BYTES
from qlint.io.reads import ReadError, read_input
from qlint.io.vela import NpuPartition
from qlint.io.writes import write_atomic
from qlint.records.results import (
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
from qlint.rules.catalog import load_catalog
from qlint.rules.table import Code
from qlint.settings.config import Config, Target
from qlint.settings.options import RunOptions

SCHEMA = 7
KEY_FILE = "signing-key"
KEY_BYTES = 32
MAGIC = b"qlint-cache "  # then the entry's signature in hex, a newline and its JSON
STACK = ("torch", "torchao", "executorch", "tosa-tools", "ethos-u-vela")


def default_dir() -> Path:
    if os.environ.get("QLINT_CACHE_DIR"):
        return Path(os.environ["QLINT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "qlint"


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """A hash of qlint's own modules, rule catalog and data tables (boards, the cost model).

    Installs from different git revisions (a pre-commit `rev:` bump, an
    editable checkout) share a version number; their results must not.
    """
    package = Path(__file__).resolve().parents[1]
    rules = Path(str(resources.files("qlint._rules")))
    files = {f.relative_to(package).as_posix(): f for f in package.rglob("*.py") if "__pycache__" not in f.parts}
    files.update({f"_rules/{f.name}": f for f in rules.glob("*.yaml")})
    files.update({f"settings/{f.name}": f for f in (package / "settings").glob("*.yaml")})
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


def tracked_by_git(directory: Path) -> str | None:
    """Why `directory` cannot be trusted as a cache: it holds files the git repository around it
    tracks (a pull request can commit them), or git cannot say; None when it lies in no work tree
    or git tracks none of its files."""
    try:
        folder = directory.resolve()
    except (OSError, RuntimeError):
        return "its path cannot be resolved"
    tree = next((d for d in (folder, *folder.parents) if (d / ".git").exists()), None)
    if tree is None:
        return None
    try:
        listed = subprocess.run(["git", "-C", str(tree), "ls-files", "-z", "--", str(folder)],
                                capture_output=True, timeout=30, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return "it lies in a git work tree, and git cannot say which of its files the repository tracks"
    if listed.returncode != 0:
        return "it lies in a git work tree, and git cannot say which of its files the repository tracks"
    tracked = [name for name in listed.stdout.split(b"\0") if name]
    if tracked:
        return f"the repository tracks {len(tracked)} of its files, so a commit could answer for any artifact"
    return None


def seal(secret: bytes, key: str, body: bytes) -> bytes:
    """An entry file: `body` signed for the entry `key` with the folder's secret."""
    mac = hmac.new(secret, key.encode() + b"\0" + body, hashlib.sha256).hexdigest()
    return MAGIC + mac.encode() + b"\n" + body


def unseal(secret: bytes, key: str, data: bytes) -> bytes | None:
    """The body of an entry file that `seal` wrote for `key` with this secret, else None."""
    head, _, body = data.partition(b"\n")
    if not head.startswith(MAGIC):
        return None
    expected = seal(secret, key, body).partition(b"\n")[0]
    return body if hmac.compare_digest(head, expected) else None


def _secret(path: Path) -> bytes | None:
    """The signing key at `path` if qlint could have made it: a regular file (not a link) of this
    user's, that no one else may read, of the right length."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o077 or info.st_uid != os.geteuid():
            return None
        data = os.read(fd, KEY_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) == KEY_BYTES else None


class Cache:
    def __init__(self, directory: Path, config: Config, options: RunOptions) -> None:
        self.directory = directory
        self.salt = json.dumps(
            {"schema": SCHEMA, "versions": _versions(), "config": _config_fingerprint(config),
             "options": options.cache_key()},
            sort_keys=True, default=str,
        )
        self.untrusted = tracked_by_git(directory) if directory.exists() else None
        self._key: bytes | None = None

    def secret(self, create: bool = False) -> bytes | None:
        """The folder's signing key; with `create`, one is made when there is none qlint could have
        made (a key a checkout wrote is replaced, and the entries signed with it stop answering)."""
        if self._key is None:
            self._key = _secret(self.directory / KEY_FILE)
        if self._key is None and create:
            self.directory.mkdir(parents=True, exist_ok=True)
            write_atomic(self.directory / KEY_FILE, secrets.token_bytes(KEY_BYTES), mode=0o600)
            self._key = _secret(self.directory / KEY_FILE)
        return self._key

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
        """The cached report of `artifact`, or None when missing, not signed with this folder's key,
        or not exactly what `put` writes."""
        secret = self.secret() if self.untrusted is None else None
        if secret is None:
            return None
        try:
            body = unseal(secret, key, read_input(self._file(key), RECORD_MAX_BYTES, "cache entry"))
            return _report(json.loads(body), artifact) if body is not None else None
        except (ReadError, ValueError, TypeError, KeyError, AttributeError, RecursionError):
            return None  # missing, corrupt or tampered with: recompute and rewrite

    def put(self, key: str, report: Report) -> None:
        if report.errors or self.untrusted is not None:
            return  # input errors are re-reported every run; an untrusted folder is left alone
        data = {"schema": SCHEMA, "findings": [f.to_dict() for f in report.findings],
                "stats": [s.to_dict() for s in report.stats], "memory": [m.to_dict() for m in report.memory],
                "figures": [dataclasses.asdict(f) for f in report.figures]}
        target = self._file(key)
        try:
            secret = self.secret(create=True)
            if secret is None:
                return
            target.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(target, seal(secret, key, json.dumps(data).encode()))
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
    row = data["stats"][0]
    costliest = _contributors(row.get("costliest")) if isinstance(row, dict) else None
    # A profiled run is never cached (`RunOptions.profile`): an entry's cycles are estimated.
    estimated = isinstance(row, dict) and row.get("profile") == [] and row.get("measured_runs") == 0
    delegates = _delegates(row.get("delegates")) if isinstance(row, dict) else None
    stats = _record(ArtifactStats, row, costliest=costliest, profile=(), delegates=delegates) \
        if costliest is not None and delegates is not None and estimated else None
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
    if data.get("code") not in tuple(Code):
        return None
    return _record(Finding, data, location=location, severity=Severity(severity), code=Code(data["code"]))


def _delegates(data: Any) -> tuple[NpuPartition, ...] | None:
    """Each delegate call's blob figures; its I/O shapes lists of integers, as Vela packed them."""
    if not isinstance(data, list):
        return None
    found = []
    for item in data:
        shapes = [item.get(side) for side in ("inputs", "outputs")] if isinstance(item, dict) else []
        if len(shapes) != 2 or not all(isinstance(s, list) and all(_integers(shape) for shape in s) for s in shapes):
            return None
        inputs, outputs = (tuple(tuple(shape) for shape in side) for side in shapes if side is not None)
        blob = _record(NpuPartition, item, inputs=inputs, outputs=outputs)
        if blob is None:
            return None
        found.append(blob)
    return tuple(found)


def _integers(data: Any) -> bool:
    return isinstance(data, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in data)


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
    parts = {key: _contributors(data.get(key)) for key in ("sram", "flash", "fp32", "time")}
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
_TYPES: dict[Any, tuple[type, ...]] = {Code: (str,),
    str: (str,), int: (int,), bool: (bool,), float: (float, int),
    dict[str, Any]: (dict,), Location | None: (dict, type(None)), str | None: (str, type(None)),
    int | None: (int, type(None)), float | None: (float, int, type(None)), dict[str, int]: (dict,),
}
