"""Regenerate the shipped example plans from their workloads, after a change to the model or the catalogs.

    python3 benchmarks/regen_examples.py [NAME ...]

``examples/plans/NAME.plan.json`` is what ``recommend --workload examples/NAME.yaml --format json`` prints (the
workload file's own SLOs, seed 0, the default search). Every NAME with a plan there is regenerated unless
names are given. Tests read these files' own numbers (tests/test_plan_twins.py, tests/test_deploy_platforms.py,
tests/test_replan_sizing_basis.py); the deploy docs quote rank 1's files.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from recommender.atomic import atomic_write_text  # noqa: E402

PLANS = ROOT / "examples" / "plans"


def regenerate(name: str) -> str:
    """Run the main job on ``examples/NAME.yaml``; write its plan JSON; return a one-line summary of rank 1."""
    res = subprocess.run([sys.executable, "-m", "recommender", "--workload", f"examples/{name}.yaml",
                          "--format", "json"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    if res.returncode != 0:
        raise SystemExit(f"{name}: recommend exited {res.returncode}: {res.stderr.strip()[-500:]}")
    doc = json.loads(res.stdout)
    atomic_write_text(PLANS / f"{name}.plan.json", json.dumps(doc, indent=2) + "\n")
    plans = doc.get("plans") or []
    if not plans:
        return f"{name}: no plan fits"
    t = plans[0]
    return (f"{name}: {len(plans)} plans; rank 1 {t['gpu']} TP{t['tp']} x{t['replicas']} {t['weight_dtype']}/{t['kv_dtype']}"
            f" ${t['usd_per_million_tokens']:.3f}/M tokens")


def main(argv: list[str]) -> int:
    names = argv or sorted(p.name.removesuffix(".plan.json") for p in PLANS.glob("*.plan.json"))
    for name in names:
        print(regenerate(name), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
