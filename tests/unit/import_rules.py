"""The layering rules of backend/__init__.py, as data, and a checker over source files (no imports executed).

A rule: the modules whose dotted name starts with `layer` may import, of our own packages, only modules under the
`allowed` prefixes. Most specific layer wins. Third-party imports are free, except those named in `banned`.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OURS = ("backend", "build_engines", "ensembles", "client", "frontend", "perf", "tests")
SOURCE_DIRS = ("backend", "build_engines", "ensembles", "client", "frontend", "perf", "model_repository")
TRITON = ("triton_python_backend_utils", "tritonclient")


@dataclass(frozen=True)
class Rule:
    layer: str
    allowed: tuple[str, ...]
    banned: tuple[str, ...] = ()  # third-party modules this layer must not import


RULES = (
    Rule("backend.errors", ()),
    Rule("backend.kernel_choices", ()),
    Rule("backend.formats", ("backend.formats",), TRITON),
    Rule("backend.model", ("backend.model", "backend.formats", "backend.errors", "backend.kernel_choices"), TRITON),
    Rule("backend.engine", ("backend.engine", "backend.model", "backend.formats", "backend.errors",
                            "backend.kernel_choices"), TRITON),
    # Scheduling never pulls in the torch model: the batch is plain sequences and block tables.
    *(Rule(f"backend.engine.{name}", ("backend.engine", "backend.errors", "backend.kernel_choices"), TRITON)
      for name in ("config", "sampling_params", "sequence", "prefix_cache", "block_manager", "scheduler",
                   "scheduler_output", "stats", "rope_regime")),
    Rule("backend.policy", ("backend.policy", "backend.errors"), TRITON + ("torch",)),
    Rule("backend.serving", ("backend",), TRITON),
    Rule("backend", ("backend",), TRITON),
    Rule("build_engines", ("build_engines", "backend"), TRITON),
    Rule("ensembles", ("ensembles", "build_engines", "backend")),
    Rule("client", ("client",)),
    # The HTTP front is a client of Triton: tenants' keys from policy, nothing of the engine (no torch).
    Rule("frontend", ("frontend", "backend.policy", "backend.errors"), ("torch", "triton_python_backend_utils")),
    Rule("model_repository", ("backend",)),
    Rule("perf", OURS),
)


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(parts)


def rule_for(module: str) -> Rule:
    matching = [r for r in RULES if module == r.layer or module.startswith(r.layer + ".")]
    return max(matching, key=lambda r: len(r.layer))


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def imports_of(source: str, module: str, is_package: bool = False) -> list[tuple[int, str, bool]]:
    """(line, imported module, at module level) for every import; `if TYPE_CHECKING:` blocks are skipped."""
    tree = ast.parse(source)
    found: list[tuple[int, str, bool]] = []
    package = module if is_package else module.rpartition(".")[0]

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                found.extend((child.lineno, a.name, top) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - child.level + 1] + ([base] if base else []))
                found.append((child.lineno, base, top))
            nested = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda))
            visit(child, top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
            del nested

    visit(tree, True)
    return found


def violations(module: str, source: str, is_package: bool = False) -> list[str]:
    """What module's imports break its layer's rule, one line each."""
    rule = rule_for(module)
    bad = []
    for line, name, _top in imports_of(source, module, is_package):
        top_pkg = name.split(".")[0]
        if top_pkg in OURS and not _under(name, rule.allowed):
            bad.append(f"{module}:{line} imports {name} (layer {rule.layer} may import only {list(rule.allowed)})")
        elif _under(name, rule.banned):
            bad.append(f"{module}:{line} imports {name} (layer {rule.layer} must not import {list(rule.banned)})")
    return bad


def source_files() -> list[Path]:
    files = []
    for d in SOURCE_DIRS:
        files += [p for p in (ROOT / d).rglob("*.py") if not any(part.startswith(".") for part in p.parts)]
    return sorted(files)
