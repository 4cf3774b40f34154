"""Result cache, parallel and sharded runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import ROOT, cache_entry, rewrite_cache_entry, run_cli

PROBE = (
    "import sys\n"
    "from qlint.cli.main import main\n"
    "code = main(sys.argv[1:])\n"
    "print('HEAVY=' + ','.join(sorted(m for m in ('torch', 'executorch') if m in sys.modules)), file=sys.stderr)\n"
    "raise SystemExit(code)\n"
)


def qlint_process(args: list[str], cache: Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "QLINT_CACHE_DIR": str(cache)}
    return subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=600)


@pytest.fixture(scope="module")
def zoo(pt2_dir: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("zoo")
    for name in ("make_attention", "make_norm", "make_pool", "make_constant_first", "make_scale"):
        (folder / f"{name.removeprefix('make_')}.pt2").write_bytes(pt2_dir(name).read_bytes())
    return folder


def forge(cache: Path) -> None:
    """Every entry of `cache` made to say "forged" in its first finding's message: still a valid
    entry, so a run that reads one shows it, and a run that shows none computed its own."""
    for entry in cache.rglob("*.json"):
        data = cache_entry(entry)
        data["findings"][0]["message"] += " (forged)"
        rewrite_cache_entry(entry, data)


def test_cache_answers_without_torch_and_config_changes_invalidate(
        zoo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache = tmp_path / "cache"
    config = tmp_path / ".qlint.yaml"
    config.write_text("coverage_threshold: 0.9\n")
    args = ["check", "--config", str(config), "--output-format", "json", "--cache-dir", str(cache),
            str(zoo / "attention.pt2")]
    code, first, _ = run_cli(args, capsys)  # computed in this process, which has torch loaded
    answered = qlint_process(args, cache)  # a fresh interpreter: answered from the entry, torch never imported
    assert (code, answered.returncode) == (1, 1) and "HEAVY=\n" in answered.stderr + "\n"
    assert json.loads(answered.stdout) == json.loads(first)
    forge(cache)
    assert "(forged)" in run_cli(args, capsys)[1]  # what the cache holds is what is answered
    # Editing (or just touching) the config invalidates the entry.
    config.write_text("coverage_threshold: 0.5\n")
    third = run_cli(args, capsys)[1]
    assert "(forged)" not in third and "QL005" not in {f["code"] for f in json.loads(third)["findings"]}
    forge(cache)
    os.utime(config)
    assert "(forged)" not in run_cli(args, capsys)[1]
    # --no-cache never reads it.
    forge(cache)
    assert "(forged)" not in run_cli([*args, "--no-cache"], capsys)[1]
    assert "(forged)" in run_cli(args, capsys)[1]


def test_corrupt_cache_entries_are_ignored_and_rewritten(zoo: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    cache = tmp_path / "cache"
    args = ["check", "--output-format", "json", "--cache-dir", str(cache), str(zoo / "attention.pt2")]
    good = run_cli(args, capsys)[1]
    [entry] = list(cache.rglob("*.json"))
    written = entry.read_text()
    for junk in ('{"schema": 1, "findings": [{"code": 1}], "stats": []}', "not json", ""):
        entry.write_text(junk)
        again = run_cli(args, capsys)[1]
        assert json.loads(again) == json.loads(good)
        assert entry.read_text() == written  # recomputed and rewritten, not trusted


def fingerprint_of(copy: Path) -> str:
    """`code_fingerprint` of the qlint at `copy`, computed by a fresh interpreter that imports it from there."""
    probe = "from qlint.run.cache import code_fingerprint; print(code_fingerprint())"
    env = {**os.environ, "PYTHONPATH": str(copy)}
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=copy,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_cache_key_covers_qlint_code_and_rules(zoo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two revisions of qlint share version 0.1.0; a pre-commit rev bump must not reuse results.

    The edits are made to a copy of the package and its rule catalog, never to the checkout, which
    other tests (and other test processes) import and fingerprint meanwhile."""
    from qlint.run import cache
    from qlint.settings.config import Config
    from qlint.settings.options import RunOptions

    copy = tmp_path / "checkout"
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "qlint", copy / "qlint", symlinks=True, ignore=skip)  # qlint/_rules -> ../rules
    shutil.copytree(ROOT / "rules", copy / "rules", ignore=skip)
    before = fingerprint_of(copy)
    assert before == cache.code_fingerprint.__wrapped__()  # the copy is fingerprinted as the checkout is
    for name in ("rules/QL001.yaml", "qlint/analysis/islands.py", "qlint/settings/cycles.yaml"):
        edited = copy / name
        original = edited.read_bytes()
        edited.write_bytes(original + b"\n# an edit\n")
        assert fingerprint_of(copy) != before, name
        edited.write_bytes(original)
    assert fingerprint_of(copy) == before

    artifact = zoo / "attention.pt2"
    before = cache.Cache(tmp_path, Config(), RunOptions()).key(artifact.read_bytes(), "attention.pt2")
    monkeypatch.setattr(cache, "code_fingerprint", lambda: "another revision")
    assert cache.Cache(tmp_path, Config(), RunOptions()).key(artifact.read_bytes(), "attention.pt2") != before


def test_jobs_output_equals_serial_output(zoo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    serial = run_cli(["check", "--no-cache", "--output-format", "json", str(zoo)], capsys)
    parallel = run_cli(["check", "--no-cache", "--jobs", "2", "--output-format", "json", str(zoo)], capsys)
    assert serial[0] == parallel[0] == 1
    assert serial[1] == parallel[1]
    assert len(json.loads(serial[1])["artifacts"]) == 5


def test_shards_partition_the_inputs(zoo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    seen = []
    for index in (1, 2, 3):
        _, out, _ = run_cli(["check", "--output-format", "json", "--shard", f"{index}/3", str(zoo)], capsys)
        seen.append([Path(s["artifact"]).name for s in json.loads(out)["artifacts"]])
    assert all(seen)
    flat = [name for shard in seen for name in shard]
    assert sorted(flat) == sorted(p.name for p in zoo.iterdir())
    assert len(flat) == len(set(flat))
    _, out, _ = run_cli(["check", "--output-format", "json", "--shard", "2/3", str(zoo)], capsys)
    assert [Path(s["artifact"]).name for s in json.loads(out)["artifacts"]] == seen[1]  # deterministic


@pytest.mark.model("make_multi_head")
def test_verbose_tracebacks_never_reach_a_plain_run_through_the_cache(
    pt2_dir: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A -v run caches QL003 with its traceback; a later plain run must print one line."""
    program = pt2_dir("make_multi_head")
    args = ["check", "--cache-dir", str(tmp_path), "--lowering", "stock", "--output-format", "json", str(program)]
    _, verbose, _ = run_cli([*args, "-v"], capsys)
    _, plain, _ = run_cli(args, capsys)
    [long] = [f["message"] for f in json.loads(verbose)["findings"] if f["code"] == "QL003"]
    [short] = [f["message"] for f in json.loads(plain)["findings"] if f["code"] == "QL003"]
    assert "\n" in long and "Traceback" in long
    assert "\n" not in short and short == long.splitlines()[0]
