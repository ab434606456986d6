"""Every formula line of the ``estimate`` walkthrough evaluates to the value it prints (issue #31: the fp8
compute floor printed the bf16 peak while dividing by the fp8 one, 9.24e12 / (4 x 989 TFLOP/s) = 1.17 ms).

A line is ``label  formula = value``; the formula up to a ``;`` is arithmetic on the numbers it shows
(``x`` multiplies, words between numbers name them and are ignored). The test parses it, evaluates it and
compares it with the value, allowing for the rounding of every printed number: the expression is
re-evaluated with each number moved by half a unit of its last printed digit, and the value must lie within
that spread plus its own rounding. Every catalog GPU, every weight/KV dtype pair it runs, three load modes.
"""

from __future__ import annotations

import itertools
import math
import random
import re

import pytest

from recommender.catalog import default_catalog
from recommender.estimator import EstimateRequest, conditions_of, estimate_request, pricing_for
from recommender.render.estimate import render_walkthrough
from recommender.search.space import weight_dtype_valid

UNITS = {  # the units the walkthrough prints, in SI base units
    "B": 1.0, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KiB": 1024.0, "MiB": 2.0**20, "GiB": 2.0**30,
    "TB/s": 1e12, "GB/s": 1e9, "TFLOP/s": 1e12, "FLOPs": 1.0, "s": 1.0, "ms": 1e-3, "µs": 1e-6, "us": 1e-6,
    "%": 0.01, "tok/s": 1.0, "/h": 1.0, "/GPU-hour": 1.0, "tokens": 1.0, "sequences": 1.0,
}
_UNIT_RE = "|".join(re.escape(u) for u in sorted(UNITS, key=len, reverse=True))
_TOKEN = re.compile(
    rf"(?P<word>\d+-[A-Za-z][\w-]*)"                                   # '4-GPU', '16-token': words
    rf"|(?P<num>\$?\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?)(?:\s?(?P<unit>{_UNIT_RE})(?![A-Za-z]))?"
    rf"|(?P<op><=|[()+\-*/,^])"
    rf"|(?P<name>[A-Za-zµ][\w\-]*)"
    rf"|(?P<other>\S)")


def _quantities(text: str) -> list[tuple[float, float]]:
    """(value in SI units, half a unit of its last digit in SI units) of each number in ``text``."""
    out = []
    for m in _TOKEN.finditer(text):
        if m.group("num"):
            raw = m.group("num").lstrip("$").replace(",", "")
            mant = raw.split("e")[0]
            decimals = len(mant.split(".")[1]) if "." in mant else 0
            exp = int(raw.split("e")[1]) if "e" in raw else 0
            scale = UNITS.get(m.group("unit") or "", 1.0)
            out.append((float(raw) * scale, 0.5 * 10.0 ** (exp - decimals) * scale))
    return out


def _expression(formula: str) -> tuple[str, list[tuple[float, float]]]:
    """Python expression of the formula with a placeholder per number, and the numbers (value, half-ulp)."""
    parts: list[str] = []
    nums: list[tuple[float, float]] = []
    for m in _TOKEN.finditer(formula):
        if m.group("num"):
            nums.extend(_quantities(m.group(0)))
            parts.append(f"v[{len(nums) - 1}]")
        elif m.group("op"):
            parts.append("**" if m.group("op") == "^" else m.group("op"))
        elif m.group("name") in ("x", "×"):
            parts.append("*")
        elif m.group("name") in ("max", "min", "sqrt", "ln"):
            parts.append(m.group("name"))
        elif m.group("other"):
            raise AssertionError(f"unexpected {m.group('other')!r} in {formula!r}")
        # other words name the factors
    return " ".join(parts), nums


def _check_line(line: str) -> bool:
    """True if the line is a formula line and holds; raises with the line otherwise."""
    m = re.match(r"  (?P<label>.{18}) (?P<formula>.*?)\s+= (?P<value>.*)$", line)
    if not m or m.group("label").strip() in ("price from", "price note"):
        return False
    formula = m.group("formula").split(";")[0].strip()
    value = m.group("value")
    if not value.startswith(("yes", "NO")) and not _quantities(value):
        return False  # a statement, not a figure ("sliding window ... = bounded")
    expr, nums = _expression(formula)
    if not nums:
        return False
    rng = random.Random(0)

    code = compile(expr, "<formula>", "eval")

    def ev(vs: list[float]) -> float:
        return float(eval(code, {"max": max, "min": min, "sqrt": math.sqrt, "ln": math.log}, {"v": vs}))  # noqa: S307

    if value.startswith(("yes", "NO")):
        (lhs, lnums), (rhs, rnums) = (_expression(side) for side in formula.split("<="))
        env = {"max": max, "min": min}
        left = eval(lhs, env, {"v": [v for v, _ in lnums]})  # noqa: S307
        right = eval(rhs, env, {"v": [v for v, _ in rnums]})  # noqa: S307
        assert (left <= right) == value.startswith("yes"), line
        return True
    centre = ev([v for v, _ in nums])
    spread = max(abs(ev([v + rng.choice((-1, 1)) * h for v, h in nums]) - centre) for _ in range(16))
    spread = max(spread, max(abs(ev([v + (h if j == i else 0.0) for j, (v, h) in enumerate(nums)]) - centre)
                             for i in range(len(nums))))
    shown, half = _quantities(value)[0]
    assert abs(centre - shown) <= 1.01 * spread + half + 1e-12 * abs(shown) + (1.0 if "sequences" in value else 0.0), (
        f"{line!r}: formula gives {centre:.6g}, shows {shown:.6g} (rounding allows {spread + half:.3g})")
    return True


def _configs() -> list[tuple[str, str, str, str, int]]:
    """(model, gpu, weight dtype, KV dtype, TP): a dense 8B at every dtype, and gpt-oss-20b's MXFP4 experts (MoE)."""
    cat = default_catalog()
    out = []
    for mid, dtypes in (("llama-3.1-8b", ("bf16", "fp8", "int8", "int4", "fp4")), ("gpt-oss-20b", ("mxfp4",))):
        model = cat.model(mid)
        for gid, g in cat.gpus.items():
            tp = 2 if g.interconnect.gpus_per_domain >= 2 else 1
            for wd, kd in itertools.product(dtypes, ("bf16", "fp8")):
                if weight_dtype_valid(model, g, wd, kd) is None:
                    out.append((mid, gid, wd, kd, tp))
    return out


LOADS = {"static": {}, "closed": {"concurrency": "64"}, "context": {"context_tokens": 4096, "batch": 8}}


@pytest.mark.parametrize("model,gpu,wd,kd,tp", _configs())
def test_every_walkthrough_line_evaluates_to_its_value(model: str, gpu: str, wd: str, kd: str, tp: int) -> None:
    checked = 0
    for load in LOADS.values():
        lengths = {} if "context_tokens" in load else {"prompt_tokens": 3000, "output_tokens": 300}
        # --price where the catalog has no dated offer (mi325x): the price line is then per GPU
        price = 3.0 if not default_catalog().gpus[gpu].offers else None
        req = EstimateRequest(model=model, gpu=gpu, tp=tp, weight_dtype=wd, kv_dtype=kd, usd_per_gpu_hour=price,
                              **lengths, **load)  # type: ignore[arg-type]
        dep, ld, est = estimate_request(req)
        text = render_walkthrough(dep, ld, est, 1, pricing_for(dep.gpu, tp=tp, replicas=1, usd_per_gpu_hour=price),
                                  conditions_of(dep).lines())
        lines = [ln for ln in text.splitlines() if _check_line(ln)]
        assert any(ln.lstrip().startswith("compute floor") for ln in lines)
        checked += len(lines)
    assert checked >= 3 * 25


def test_the_fp8_compute_floor_divides_by_the_fp8_peak_it_prints() -> None:
    # H100 SXM datasheet: 989 TFLOP/s dense bf16, 1979 dense fp8 (catalogs/gpus); the floor line names the latter
    req = EstimateRequest(model="llama-3.1-70b", gpu="h100-sxm", tp=4, weight_dtype="fp8", kv_dtype="fp8",
                          prompt_tokens=2000, output_tokens=200)
    dep, ld, est = estimate_request(req)
    text = render_walkthrough(dep, ld, est, 1, pricing_for(dep.gpu, tp=4, replicas=1, usd_per_gpu_hour=None))
    floors = [ln for ln in text.splitlines() if ln.lstrip().startswith("compute floor")]
    assert len(floors) == 2 and all("4 x 1979 TFLOP/s fp8 peak" in ln for ln in floors)
    assert all(_check_line(ln) for ln in floors)


def test_the_checker_catches_a_wrong_line() -> None:
    # the line: 9.24e12 / (4 x 989e12) = 2.34 ms, not 1.17 ms
    with pytest.raises(AssertionError):
        _check_line(f"  {'compute floor':<18} {'9.24e+12 FLOPs / (4 x 989 TFLOP/s peak)':<66} = 1.17 ms")
    assert _check_line(f"  {'compute floor':<18} {'9.24e+12 FLOPs / (4 x 989 TFLOP/s peak)':<66} = 2.34 ms")
    assert math.isclose(9.24e12 / (4 * 989e12), 2.3356e-3, rel_tol=1e-4)
