"""What a target's factory imports from the repository, read from its source without running it."""

from __future__ import annotations

from pathlib import Path

from qlint.run.imports import dependencies


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_imports_are_followed_through_packages_relative_imports_and_functions(tmp_path: Path) -> None:
    write(tmp_path, {
        "models/__init__.py": "",
        "models/net.py": "from .layers import attn\nfrom . import norm\nimport yaml\n\n"
                         "def make():\n    from models.util import helper\n    return helper().eval()\n",
        "models/layers/__init__.py": "from .attn import Attention\n",
        "models/layers/attn.py": "import math\n",
        "models/norm.py": "",
        "models/util.py": "def helper(): ...\n",
        "models/unused.py": "",
        "train.py": "import models.net\n",
    })
    found = dependencies("models.net", tmp_path, tmp_path, 1 << 20)
    assert found.uncacheable is None
    assert list(found.files) == [
        "models/__init__.py", "models/layers/__init__.py", "models/layers/attn.py", "models/net.py",
        "models/norm.py", "models/util.py",
    ]
    assert found.distributions == {"yaml": "PyYAML==6.0.3"}  # math is the standard library's


def test_imports_only_running_can_tell_make_a_target_uncacheable(tmp_path: Path) -> None:
    for line in ("importlib.import_module(name)", "__import__(name)", "exec(code)", "runpy.run_path(p)"):
        write(tmp_path, {"net.py": f"import importlib, runpy\n\ndef make(name, code, p):\n    {line}\n"})
        found = dependencies("net", tmp_path, tmp_path, 1 << 20)
        assert found.uncacheable == (f"net.py:4 calls {line.split('(')[0]}(), "
                                     "so what it imports is known only by running it")
    for line in ("sys.path.insert(0, p)", "sys.path = [p]", "sys.path[:] = [p]", "sys.path += [p]",
                 "site.addsitedir(p)"):
        write(tmp_path, {"net.py": f"import site, sys\n\ndef make(p):\n    {line}\n"})
        assert dependencies("net", tmp_path, tmp_path, 1 << 20).uncacheable == (
            "net.py:4 changes sys.path, so where its imports come from is known only by running it")
    write(tmp_path, {"net.py": "import sys\nprint(sys.path[0], sys.path.index('x'))\n"})  # reading is fine
    assert dependencies("net", tmp_path, tmp_path, 1 << 20).uncacheable is None
    write(tmp_path, {"net.py": "from ... import far\n"})
    assert "relative import beyond" in str(dependencies("net", tmp_path, tmp_path, 1 << 20).uncacheable)
    write(tmp_path, {"net.py": "x = (" * 400 + ")" * 400})
    assert dependencies("net", tmp_path, tmp_path, 1 << 20).uncacheable == "net.py does not parse"
    write(tmp_path, {"net.py": "import big\n", "big.py": "#" * 2000})
    assert "big.py" in str(dependencies("net", tmp_path, tmp_path, 1000).uncacheable)
