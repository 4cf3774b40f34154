"""What a result cache a pull request can reach may answer: only entries this user's qlint wrote and
signed, in a folder the repository does not track (the static tier, so no torch is loaded)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, cache_entry, rewrite_cache_entry

from qlint.run.cache import KEY_FILE

ARTIFACT = ROOT / "examples" / "attention.pt2"
GIT_ENV = {"GIT_AUTHOR_NAME": "qlint tests", "GIT_AUTHOR_EMAIL": "tests@example.invalid",
           "GIT_COMMITTER_NAME": "qlint tests", "GIT_COMMITTER_EMAIL": "tests@example.invalid"}


def qlint(work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "qlint", "check", "--static", "--cache-dir", ".qlint_cache",
                           "--output-format", "json", *args], cwd=work, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def git(work: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=work, check=True, capture_output=True, env={**os.environ, **GIT_ENV})


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A repository with an artifact that has an error finding, checked once: its entry is written."""
    shutil.copy(ARTIFACT, tmp_path / "attention.pt2")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "attention.pt2")
    git(tmp_path, "commit", "-qm", "model")
    assert qlint(tmp_path, "attention.pt2").returncode == 1
    return tmp_path


def clear(entry: Path) -> None:
    """The entry made to say the artifact is clean, signed with the folder's key."""
    data = cache_entry(entry)
    data["findings"] = []
    rewrite_cache_entry(entry, data)


def test_a_signed_entry_answers_so_the_refusals_below_can_fail(work: Path) -> None:
    [entry] = (work / ".qlint_cache").rglob("*.json")
    assert stat.S_IMODE((work / ".qlint_cache" / KEY_FILE).stat().st_mode) == 0o600
    clear(entry)
    result = qlint(work, "attention.pt2")
    assert (result.returncode, json.loads(result.stdout)["findings"]) == (0, [])


def test_an_entry_the_repository_tracks_is_never_read(work: Path) -> None:
    """A pull request commits a cache folder whose entry (and key) say the model is clean."""
    [entry] = (work / ".qlint_cache").rglob("*.json")
    clear(entry)
    git(work, "add", "-f", ".qlint_cache")
    git(work, "commit", "-qm", "a cache that passes everything")
    result = qlint(work, "attention.pt2")
    assert result.returncode == 1 and json.loads(result.stdout)["findings"][0]["code"] == "QL001"
    assert result.stderr.splitlines()[0] == (
        "qlint: warning: the result cache .qlint_cache is not used: the repository tracks 2 of its files, so a "
        "commit could answer for any artifact")
    assert cache_entry(entry)["findings"] == []  # not written either: the folder is left as it came


def test_a_key_that_others_may_read_was_not_made_by_qlint(work: Path) -> None:
    """A checkout writes files 0644: such a key (a committed one, say, with entries it signed) is
    replaced, and what it signed no longer answers."""
    [entry] = (work / ".qlint_cache").rglob("*.json")
    clear(entry)
    key = work / ".qlint_cache" / KEY_FILE
    before = key.read_bytes()
    key.chmod(0o644)
    result = qlint(work, "attention.pt2")
    assert result.returncode == 1 and json.loads(result.stdout)["findings"]
    assert key.read_bytes() != before and stat.S_IMODE(key.stat().st_mode) == 0o600
    assert cache_entry(entry)["findings"]  # rewritten with the new key
    assert qlint(work, "attention.pt2").returncode == 1


@pytest.mark.parametrize("change", ["altered", "moved"])
def test_an_entry_altered_or_moved_after_qlint_wrote_it_is_not_read(work: Path, change: str) -> None:
    """Altered: the contents changed without the key. Moved: the entry qlint signed for other bytes
    under the same name (where the artifact is clean), copied to this one's entry."""
    [entry] = (work / ".qlint_cache").rglob("*.json")
    if change == "altered":
        data = entry.read_bytes()
        entry.write_bytes(data.replace(b'"findings": [{', b'"findings": [], "x": [{', 1))
    else:
        shutil.copy(ROOT / "examples" / "layernorm.pt2", work / "attention.pt2")
        clean = qlint(work, "attention.pt2")
        assert (clean.returncode, json.loads(clean.stdout)["findings"]) == (0, [])
        [other] = {*(work / ".qlint_cache").rglob("*.json")} - {entry}
        shutil.copy(ARTIFACT, work / "attention.pt2")
        shutil.copy(other, entry)
    result = qlint(work, "attention.pt2")
    assert result.returncode == 1 and json.loads(result.stdout)["findings"][0]["code"] == "QL001"
