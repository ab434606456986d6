"""Pareto dominance and hypervolume for minimisation problems (small fronts, 2-4 objectives)."""

from __future__ import annotations

from typing import Sequence

Point = Sequence[float]


def dominates(a: Point, b: Point) -> bool:
    """a dominates b: no worse in every objective and strictly better in one (minimisation)."""
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))


def non_dominated(points: Sequence[Point]) -> list[int]:
    """Indices of the points no other point dominates (duplicates all kept)."""
    return [i for i, p in enumerate(points) if not any(dominates(q, p) for j, q in enumerate(points) if j != i)]


def hypervolume(points: Sequence[Point], reference: Point) -> float:
    """Volume dominated by ``points`` and bounded by ``reference`` (exact, by recursive slicing).

    Points not strictly better than the reference in every objective contribute nothing.
    """
    pts = [tuple(p) for p in points if all(x < r for x, r in zip(p, reference))]
    if not pts:
        return 0.0
    return _hv(sorted(set(pts)), tuple(reference))


def _hv(pts: list[tuple[float, ...]], ref: tuple[float, ...]) -> float:
    if len(ref) == 1:
        return ref[0] - min(p[0] for p in pts)
    if len(ref) == 2:
        area, best_y = 0.0, ref[1]
        for x, y in sorted(pts):
            if y < best_y:
                area += (ref[0] - x) * (best_y - y)
                best_y = y
        return area
    # slice along the last objective
    pts = sorted(pts, key=lambda p: p[-1])
    vol = 0.0
    for i, p in enumerate(pts):
        upper = pts[i + 1][-1] if i + 1 < len(pts) else ref[-1]
        if upper <= p[-1]:
            continue
        layer = [q[:-1] for q in pts[: i + 1]]
        vol += _hv(sorted(set(layer)), ref[:-1]) * (upper - p[-1])
    return vol
