"""The canary router runs router_instance_count processes (16 by default): what its model.py imports must stay light.
Importing the engine (torch) made each instance ~290 MB (seen in a CI run: 16 of them, 4.6 GB) and slow to start."""
from __future__ import annotations

import ast
import subprocess
import sys

from ensembles.render import REPO_ROOT

ROUTER_MODEL = REPO_ROOT / "model_repository" / "router" / "1" / "model.py"
HEAVY = ("torch", "transformers", "tokenizers")


def _project_imports() -> list[str]:
    tree = ast.parse(ROUTER_MODEL.read_text())
    modules = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module]
    return sorted(m for m in modules if m.split(".")[0] == "backend")


def test_the_router_imports_neither_torch_nor_a_tokenizer():
    modules = _project_imports()
    assert "backend.serving.router_metrics" in modules  # the parse found the router's imports
    code = "import sys\n" + "".join(f"import {m}\n" for m in modules) + \
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", f"the router's imports pull in {result.stdout.strip()}"
