"""The design's layering rules, held by reading every import of the package (those inside functions too).

DESIGN.md: `engine/`, `store/`, `gateway/` and `distributed/` never import `algorithms/`, `train/` or `rollout/`;
`rollout/` never imports `algorithms/` or `train/`; `engine/` never imports `policy/`; no import cycles; the top
level holds at most eight modules (the shared vocabulary and serving).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "agentgrad"

FORBIDDEN = {
    "engine": {"algorithms", "train", "rollout", "policy"},
    "store": {"algorithms", "train", "rollout"},
    "gateway": {"algorithms", "train", "rollout"},
    "distributed": {"algorithms", "train", "rollout"},
    "rollout": {"algorithms", "train"},
}
"""Package -> the packages it never imports."""


def import_edges(root: Path) -> dict[str, set[str]]:
    """Every module of the package at `root` -> the package's modules it imports, wherever the import stands."""
    package = root.name
    modules = {
        ".".join(path.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__"): path
        for path in root.rglob("*.py")
    }
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target not in (name, package):
                    edges[name].add(target)
    return edges


def layer(module: str) -> str:
    """`agentgrad.engine.engine` -> `engine`; a top-level module is its own layer."""
    return module.split(".")[1] if "." in module else module


def violations(edges: dict[str, set[str]]) -> list[str]:
    """`a -> b` for each import that breaks a rule of `FORBIDDEN`."""
    return sorted(
        f"{source} -> {target}"
        for source, targets in edges.items()
        for target in targets
        if layer(target) in FORBIDDEN.get(layer(source), set())
    )


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles among the modules (each once, from its smallest module)."""
    found: set[tuple[str, ...]] = set()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for target in sorted(edges[module]):
            if state.get(target) == 1:
                cycle = stack[stack.index(target) :]
                start = cycle.index(min(cycle))
                found.add(tuple(cycle[start:] + cycle[:start]))
            elif target not in state:
                visit(target)
        stack.pop()
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module)
    return [list(cycle) for cycle in sorted(found)]


def test_no_module_imports_across_a_layering_rule_and_there_are_no_cycles() -> None:
    edges = import_edges(PACKAGE)
    assert len(edges) > 100  # the whole package was read
    assert violations(edges) == []
    assert cycles(edges) == []


def test_the_top_level_holds_at_most_eight_modules() -> None:
    top = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(top) <= 8, top


def test_a_lazy_import_inside_a_function_that_breaks_a_rule_is_found(tmp_path: Path) -> None:
    root = tmp_path / "agentgrad"
    for package in ("engine", "algorithms", "rollout"):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "algorithms" / "loop.py").write_text("from agentgrad.engine import model\n")  # allowed: downwards
    (root / "engine" / "model.py").write_text(
        "def checkpoint_kind():\n    from agentgrad.algorithms.loop import train  # planted\n    return train\n"
    )
    (root / "rollout" / "agent.py").write_text("import agentgrad.algorithms.loop\n")
    edges = import_edges(root)
    assert violations(edges) == ["agentgrad.engine.model -> agentgrad.algorithms.loop",
                                 "agentgrad.rollout.agent -> agentgrad.algorithms.loop"]  # fmt: skip
    assert cycles(edges) == [["agentgrad.algorithms.loop", "agentgrad.engine.model"]]
