"""The import graph runs one way: a module imports only from its own layer or the layers below it.

The layers are docs/ARCHITECTURE.md's table (lowest first). Every import counts, including the ones inside
functions and under ``TYPE_CHECKING``: a lazy import still couples the layers. A new top-level module must be
given a layer here and in docs/ARCHITECTURE.md.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "recommender"

#: top-level module or package of ``recommender`` -> layer (lower = more basic)
LAYERS: dict[str, int] = {
    # 0 foundations: errors, units, bounded reads, the YAML edge, the progress bar
    "errors": 0, "units": 0, "bounded": 0, "httpread": 0, "yamlfile": 0, "atomic": 0, "progress": 0, "shipped": 0, "version": 0,
    # 1 catalogs (data): dtype rules, kernel support, Hugging Face configs, the registry, name resolution
    "dtypes": 1, "kernels": 1, "hf_config": 1, "catalog": 1, "names": 1, "offers": 1,
    # 2 specs at the edge: workloads and engine profiles
    "workload": 2, "profiles": 2,
    # 3 perf model (pure)
    "perf": 3,
    # 4 load model (analytic and simulator, behind load.protocols)
    "load": 4,
    # 5 one configuration: the estimate library; pools, replica sizing and pricing
    "estimator": 5, "sizing": 5,
    # 6 the plan as data and its file format
    "plan": 6,
    # 7 the search (Optuna), which builds plans
    "search": 7,
    # 8 renderers: tables/JSON/CSV/charts and deployment files
    "render": 8, "deploy": 8,
    # 9 applications on top: re-planning and calibration
    "replan": 9, "calibrate": 9, "autoscale": 9,
    # 10 the CLI (parse, call, render)
    "cli": 10, "__main__": 10,
    # 11 the public API re-exports (recommender/__init__.py)
    "__init__": 11, "api": 11,
}


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py"))


@functools.lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _top(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def _imported_tops(tree: ast.AST) -> set[str]:
    """Top-level ``recommender`` modules an AST imports (``from recommender import units`` -> units)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "recommender":
                names = [f"recommender.{a.name}" for a in node.names]
            else:
                names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] != "recommender":
                continue
            top = parts[1] if len(parts) > 1 else "__init__"
            if top != "__init__" and not (PACKAGE / top).is_dir() and not (PACKAGE / f"{top}.py").exists():
                top = "__init__"  # a name re-exported by the package, not a module
            out.add(top)
    return out


def test_every_module_has_a_layer() -> None:
    tops = {_top(p) for p in _modules()}
    missing = sorted(tops - set(LAYERS))
    assert not missing, f"give {missing} a layer in tests/test_layers.py and docs/ARCHITECTURE.md"


def test_imports_run_one_way() -> None:
    bad = []
    for path in _modules():
        me = _top(path)
        for other in _imported_tops(_tree(path)):
            if other == me or other not in LAYERS or me not in LAYERS:
                continue
            if LAYERS[other] > LAYERS[me]:
                bad.append(f"{path.relative_to(PACKAGE.parent)} ({me}, layer {LAYERS[me]}) imports "
                           f"{other} (layer {LAYERS[other]})")
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_no_module_hides_imports_behind_getattr() -> None:
    # a module-level __getattr__ is how an import cycle gets hidden (search <-> plan used one)
    hiding = [str(p.relative_to(PACKAGE.parent)) for p in _modules()
              if any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__"
                     for n in _tree(p).body)]
    assert not hiding


@pytest.mark.parametrize(("source", "expected"), [
    ("from recommender import units", {"units"}),
    ("import recommender.search.planner", {"search"}),
    ("from recommender import recommend", {"__init__"}),
    ("def f():\n    from recommender.plan import load_plan", {"plan"}),
    ("from .x import y\nimport json", set()),
])
def test_the_checker_sees_every_kind_of_import(source: str, expected: set[str]) -> None:
    assert _imported_tops(ast.parse(source)) == expected


def test_a_violation_is_reported() -> None:
    # plan (6) importing search (7) is exactly what must fail
    tree = ast.parse("from recommender.search import recommend")
    assert all(LAYERS[t] > LAYERS["plan"] for t in _imported_tops(tree))


def test_every_third_party_import_is_a_declared_dependency() -> None:
    # On a fresh machine `pip install -e .` installs only pyproject's dependencies: the main job once failed
    # there with "No module named 'click'" (typer 0.29 vendors click; click came from another package here).
    import ast
    import importlib.metadata as md
    import re
    import sys
    import tomllib

    root = Path(__file__).resolve().parents[1]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    declared = {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower().replace("_", "-")
                for r in project["dependencies"] + [r for rs in project["optional-dependencies"].values() for r in rs]}
    owners = md.packages_distributions()
    undeclared = set()
    for path in (root / "recommender").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top == "recommender":
                    continue
                dists = {d.lower().replace("_", "-") for d in owners.get(top, [top])}
                if not dists & declared:
                    undeclared.add(f"{path.relative_to(root)}: {top} ({', '.join(sorted(dists))})")
    assert not undeclared, sorted(undeclared)
