"""The import direction of backend/__init__.py holds in every source file, and there is no import cycle."""
from __future__ import annotations

from collections import defaultdict

from tests.unit.import_rules import imports_of, module_name, source_files, violations


def test_every_import_follows_the_layering():
    bad = []
    for path in source_files():
        bad += violations(module_name(path), path.read_text(), path.name == "__init__.py")
    assert not bad, "\n".join(bad)


def test_a_forbidden_import_is_caught():
    assert violations("backend.engine.scheduler", "from backend.model.runner import ModelRunner\n")
    assert violations("backend.model.decoder", "import backend.engine.sequence\n")
    assert violations("backend.formats.checkpoint", "from build_engines.convert import x\n")
    assert violations("backend.policy.tenants", "import torch\n")
    assert violations("build_engines.build", "from ensembles.render import render\n")
    assert violations("backend.serving.engine_loop", "from perf.bench_engine import prompts\n")
    assert violations("backend.model.loader", "from . import x\nfrom ..engine import y\n")  # relative, resolved
    assert not violations("backend.engine.llm_engine", "from backend.model.runner import ModelRunner\n")
    assert not violations("backend.engine.scheduler", "if TYPE_CHECKING:\n    from backend.model import x\n")


def test_no_import_cycle():
    ours = {module_name(p): p for p in source_files() if not module_name(p).startswith("model_repository")}
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in ours.items():
        for _line, imported, top in imports_of(path.read_text(), name, path.name == "__init__.py"):
            target = next((m for m in (imported, imported.rpartition(".")[0]) if m in ours), None)
            if top and target and target != name:
                graph[name].add(target)
    cycles = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt] if nxt in stack else [node, nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(ours):
        if node not in state:
            visit(node, [node])
    assert not cycles, cycles
