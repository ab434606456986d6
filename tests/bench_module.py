"""Load a script of ``benchmarks/`` as a module for a test (once per session): ``benchmark("bench_bands")``.

The scripts import each other by bare name (``import bench_inferencex as bx``), so ``benchmarks/`` goes on the path."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as the module ``name`` (cached in ``sys.modules``)."""
    if name not in sys.modules:
        if str(ROOT / "benchmarks") not in sys.path:
            sys.path.insert(0, str(ROOT / "benchmarks"))
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]
