"""vLLM plans of DeepSeek-V3 / R1 borrow the routed experts' terms from SGLang's fit (``borrow_model_terms:``).

There are no vLLM DeepSeek-R1 rows in InferenceX (its frameworks: sglang, trt, atom and their disaggregated
forms; ``tests/data/measurements/inferencex-dsr1.csv``). The ``vllm`` profile ran the model without the experts'
fitted terms (0 s per MoE layer, bandwidth and compute at the dense GEMMs' rate): on SGLang's 71 H200 TP 8
non-MTP rows it predicted TPOT a median 15% below what SGLang measured, 32-45% below on B200 / B300 / MI300X /
MI325X (``benchmarks``-style comparison, 2026-12-07). SGLang's fused-MoE kernel is adapted from vLLM's
(sgl-project/sglang ``python/sglang/srt/layers/moe/fused_moe_triton/fused_moe.py``, first line), so the ``vllm``
profile now takes SGLang's per-family ``models: deepseek-v3`` terms where it has none of its own.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from recommender.calibrate.report import profile_document
from recommender.catalog import default_catalog
from recommender.cli import app
from recommender.errors import ConfigError
from recommender.estimator import EstimateRequest, estimate_request
from recommender.perf.step import StepCostModel
from recommender.profiles import engine_profile, load_profile, profile_from_doc

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT / "catalogs" / "profiles"
EXPERT_TERMS = {"moe_layer_overhead_s", "expert_bandwidth_efficiency", "expert_compute_efficiency"}


def _raw(engine: str) -> dict[str, Any]:
    return yaml.safe_load((PROFILES / f"{engine}.yaml").read_text())


def _gpu_of(family: str) -> str:
    return next(g.id for g in default_catalog().gpus.values() if g.arch == family)


def _donor_terms() -> dict[str, dict[str, float]]:
    """SGLang's ``families.<f>.models.deepseek-v3.parameters``, read from the file itself."""
    fams = _raw("sglang")["families"]
    return {f: dict(d["models"]["deepseek-v3"]["parameters"]) for f, d in fams.items()
            if "deepseek-v3" in (d.get("models") or {})}


def test_the_shipped_rule_names_sglang_and_the_expert_terms() -> None:
    rule = engine_profile("vllm").borrow_model_terms
    assert rule is not None and rule.engine == "sglang" and set(rule.parameters) == EXPERT_TERMS
    assert "fused_moe_triton/fused_moe.py" in rule.reason
    for engine in ("sglang", "trtllm", "atom", "lmdeploy", "gpt-fast"):  # the donors keep their own fits only
        assert engine_profile(engine).borrow_model_terms is None


@pytest.mark.parametrize("family", sorted(_donor_terms()))
def test_vllm_runs_deepseek_with_sglangs_terms_on_each_family(family: str) -> None:
    terms = _donor_terms()[family]
    assert terms and set(terms) <= EXPERT_TERMS
    vllm, gpu = engine_profile("vllm"), _gpu_of(family)
    p = vllm.for_gpu(gpu, "deepseek-v3")
    for k, v in terms.items():
        assert getattr(p, k) == pytest.approx(v, rel=1e-12), k
    # vLLM's own dense terms stay vLLM's (its family fit where it has one, else its engine parameters)
    own = (_raw("vllm")["families"].get(family) or {}).get("parameters") or {}
    expect = own.get("compute_efficiency", _raw("vllm")["parameters"]["compute_efficiency"])
    assert p.compute_efficiency == pytest.approx(expect, rel=1e-12)
    assert p.server_request_overhead_s == vllm.server_request_overhead_s  # the front end is vLLM's
    lent = vllm.borrowed_fit(gpu, "deepseek-v3")
    assert lent is not None and lent.borrowed_from == "sglang"
    assert lent.rows == _raw("sglang")["families"][family]["models"]["deepseek-v3"]["rows"]


def test_only_a_model_the_donor_measured_borrows() -> None:
    vllm = engine_profile("vllm")
    for model in ("mixtral-8x7b", "llama-3.1-8b"):
        assert vllm.borrowed_fit("h200", model) is None
        p = vllm.for_gpu("h200", model)
        assert (p.moe_layer_overhead_s, p.expert_bandwidth_efficiency, p.expert_compute_efficiency) == (0.0, 1.0, 1.0)
        assert p.replace(borrow_model_terms=None) == vllm.replace(borrow_model_terms=None).for_gpu("h200", model)


BORROWER = """engine: vllm
parameters:
  hbm_bandwidth_efficiency: 0.8
borrow_model_terms:
  engine: sglang
  parameters: [moe_layer_overhead_s, expert_bandwidth_efficiency, expert_compute_efficiency]
  reason: test
families:
  hopper:
    rows: 3
    parameters:
      expert_compute_efficiency: 0.25
    models:
      deepseek-v3:
        rows: 2
        parameters:
          moe_layer_overhead_s: 1.0e-04
"""


def test_the_borrowers_own_family_and_model_terms_win_parameter_by_parameter(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text(BORROWER)
    prof = load_profile(f)
    donor = _donor_terms()["hopper"]
    p = prof.for_gpu("h200", "deepseek-v3")
    assert p.moe_layer_overhead_s == 1.0e-04          # the model's own override
    assert p.expert_compute_efficiency == 0.25        # the family's own parameter
    assert p.expert_bandwidth_efficiency == pytest.approx(donor["expert_bandwidth_efficiency"])  # borrowed
    lent = prof.borrowed_fit("h200", "deepseek-v3")
    assert lent is not None and dict(lent.parameters) == {"expert_bandwidth_efficiency": donor["expert_bandwidth_efficiency"]}
    # a release-specialised profile carries the same values and no rule left to apply twice
    r = prof.for_release("h200", "0.33.0", "deepseek-v3")
    assert r.borrow_model_terms is None and r.families == ()
    assert (r.moe_layer_overhead_s, r.expert_bandwidth_efficiency, r.expert_compute_efficiency) == (
        p.moe_layer_overhead_s, p.expert_bandwidth_efficiency, p.expert_compute_efficiency)
    assert r.for_gpu("h200", "deepseek-v3") == r


@pytest.mark.parametrize("rule, says", [
    ({"engine": "vllm", "parameters": ["moe_layer_overhead_s"]}, "is not another shipped engine"),
    ({"engine": "nosuch", "parameters": ["moe_layer_overhead_s"]}, "is not another shipped engine"),
    ({"engine": "sglang", "parameters": ["moe_overhead"]}, "unknown parameter(s) moe_overhead"),
    ({"engine": "sglang", "parameters": "moe_layer_overhead_s"}, "needs engine (a name) and parameters"),
    ("sglang", "needs engine (a name) and parameters"),
])
def test_a_malformed_rule_is_one_line(rule: Any, says: str) -> None:
    doc = {"engine": "vllm", "parameters": {"hbm_bandwidth_efficiency": 0.8}, "borrow_model_terms": rule}
    with pytest.raises(ConfigError) as e:
        profile_from_doc(doc, "p.yaml")
    assert says in str(e.value) and "\n" not in str(e.value)


def test_the_rule_survives_calibrate_and_fit_profiles_writing_the_file(tmp_path: Path) -> None:
    vllm = engine_profile("vllm")
    doc = profile_document(vllm)
    assert doc["borrow_model_terms"]["engine"] == "sglang"
    f = tmp_path / "vllm.yaml"
    f.write_text(yaml.safe_dump(doc))
    assert load_profile(f).borrow_model_terms == vllm.borrow_model_terms
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import fit_profiles
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert fit_profiles.carried("vllm")["borrow_model_terms"] == vllm.borrow_model_terms
    assert "borrow_model_terms" not in fit_profiles.carried("sglang")


def test_the_decode_step_adds_58_moe_layers_of_sglangs_overhead() -> None:
    """Hand calculation: DeepSeek-V3 has 61 layers, the first 3 dense (``first_k_dense_replace: 3``,
    ``catalogs/models/deepseek-v3.yaml``), so 58 MoE layers each add SGLang's hopper ``moe_layer_overhead_s``."""
    per_layer = _donor_terms()["hopper"]["moe_layer_overhead_s"]
    dep, _, _ = estimate_request(EstimateRequest(model="deepseek-r1", gpu="h200", tp=8, concurrency="4",
                                                 prompt_tokens=1024, output_tokens=1024))
    p = engine_profile("vllm").for_gpu("h200")
    want = p.step_overhead_s + 61 * p.layer_overhead_s + 58 * per_layer
    assert StepCostModel.build(dep).overhead_s == pytest.approx(want, rel=1e-9)


def test_estimate_names_the_borrowed_terms_in_text_and_json() -> None:
    args = ["estimate", "--model", "deepseek-r1", "--gpu", "h200", "--tp", "8", "--batch", "4",
            "--prompt-tokens", "1024", "--output-tokens", "1024"]
    rows = _raw("sglang")["families"]["hopper"]["models"]["deepseek-v3"]["rows"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    head = out.output.splitlines()[0]
    assert head.endswith(f"engine profile vllm (hopper family fit; deepseek-v3's terms borrowed from sglang's "
                         f"hopper fit: {rows} rows)")
    overhead = next(ln for ln in out.output.splitlines() if ln.strip().startswith("overhead"))
    assert "58 MoE layers x " in overhead
    d = json.loads(CliRunner().invoke(app, [*args, "--format", "json"]).output)
    assert d["borrowed_terms"]["engine"] == "sglang" and d["borrowed_terms"]["rows"] == rows
    assert d["borrowed_terms"]["parameters"] == _donor_terms()["hopper"]
    d = json.loads(CliRunner().invoke(app, [*args, "--engine", "sglang", "--format", "json"]).output)
    assert d["borrowed_terms"] is None


def test_vllm_predicts_sglangs_h200_rows_as_sglangs_profile_does() -> None:
    """SGLang's 71 H200 TP 8 fp8 rows without MTP (1k:8k and 8k:1k, InferenceX): with the borrowed terms the
    ``vllm`` profile's TPOT lands where SGLang's own does (median error 0.2% both, 2026-12-07); without them it read
    a median 15% low."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_inferencex as bx
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    cases = [c for c in bx.single_node_cases(ROOT / "tests" / "data" / "measurements" / "inferencex-dsr1.csv")
             if c.gpu == "h200" and c.framework == "sglang" and not c.mtp and c.dp == 1 and not c.ep]
    assert len(cases) == 71
    vllm = engine_profile("vllm").for_gpu("h200", bx.MODEL)
    errs = []
    for c in cases[::5]:
        got = bx.predict(c, profile=vllm)
        assert isinstance(got, dict), got
        errs.append(got["tpot"] / c.measured["tpot"] - 1.0)
    assert abs(statistics.median(errs)) < 0.06
