"""What `recommend autoscale` checks before the day is planned, and what `--emit` writes.

* the static peak plan the report names is the plan `--emit` writes (plan.json and every file rendered from it);
* hpa.yaml's external metric and the prometheus-adapter rule in its header agree with the series vLLM exposes:
  `model_name` is the served name, `meta-llama/Llama-3.1-70B-Instruct`, which no Kubernetes label value can spell;
* `--startup 0s` and a `--prometheus` URL that is not http(s) are refused in one line before the search runs.

Expected numbers are worked out here from the example plan's own figures, not read back from the code under test.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import recommender.cli  # noqa: F401  (registers every command on the app)
from recommender.autoscale import AutoscalePlan, Certification, DiurnalProfile, ScalingRule
from recommender.cli.app import app
from recommender.errors import ConfigError
from recommender.plan import load_plan

ROOT = Path(__file__).resolve().parents[1]
CHAT = ROOT / "examples" / "plans" / "chat.plan.json"   # rank 1: 1 x mi300x TP1 on 1-GPU instances at $2.59/h
RAG = ROOT / "examples" / "plans" / "rag.plan.json"     # served as meta-llama/Llama-3.1-70B-Instruct


# -- the static peak plan ------------------------------------------------------------------------------------
def test_static_peak_plan_is_rank_1_at_the_static_replicas_for_the_same_rate() -> None:
    """chat rank 1 (1 x mi300x TP1, one 1-GPU instance at $2.59/h, 20 req/s) at 3 replicas: 3 instances,
    $7.77/h; the rate and its tokens are the workload's, so $/M tokens x 3 and the load utilisation / 3."""
    from recommender.autoscale import static_peak_plan

    plan = load_plan(CHAT)
    row = plan.top
    assert (row.pools[0].replicas, row.usd_per_hour, plan.workload.arrival_rate_per_s) == (1, 2.59, 20.0)
    peak = static_peak_plan(plan, replicas=3, peak_window_rate_per_s=25.0)
    (new,) = peak.rows
    assert new.rank == 1 and new.pools[0].replicas == 3 and new.gpus_total == 3
    assert new.usd_per_hour == pytest.approx(3 * 2.59)
    assert new.pools[0].rental is not None and new.pools[0].rental.instances == 3
    assert peak.workload.arrival_rate_per_s == 20.0                       # the same day, not 3 x its rate
    assert new.output_tokens_per_s == pytest.approx(row.output_tokens_per_s)
    assert row.usd_per_million_tokens is not None and row.load_utilisation is not None
    assert new.usd_per_million_tokens == pytest.approx(3 * row.usd_per_million_tokens)
    assert new.load_utilisation == pytest.approx(row.load_utilisation / 3, abs=1e-4)
    assert "x3" in new.quality_note and "x1" in new.quality_note and "25.00 req/s" in new.quality_note
    # chat.plan.json was sized for 20 req/s x (1 + 0.2 headroom) = 24 req/s on x1; x3 serves 3 x 24 = 72 req/s at
    # the same load per replica, which replan's band holds the traffic to (it had stayed 24: alarms at a third)
    assert plan.sized_rate_per_s() == pytest.approx(24.0) and peak.sized_rate_per_s() == pytest.approx(72.0)
    assert static_peak_plan(plan, replicas=1) is plan                      # the search's count: its plan as is


def _rule(**kw: Any) -> ScalingRule:
    base: dict[str, Any] = dict(
        metric='sum(rate(vllm:request_success_total{model_name="x"}[60s]))', replica_capacity_per_s=10.0,
        target_per_replica_per_s=8.0, min_replicas=1, max_replicas=4, startup_s=240.0, polling_s=15.0,
        metric_window_s=60.0, metric_hold_s=0.0, scale_down_stabilisation_s=900.0, growth_within_delay=1.05,
        burst=1.1, gpus_per_replica=1)
    base.update(kw)
    return ScalingRule(**base)


def _certification() -> Certification:
    return Certification(requests=1000, windows=288, windows_met=288, flaps=0, scale_events=4, min_replicas_seen=1,
                         max_replicas_seen=3, gpu_hours=40.0, static_gpu_hours=72.0, ideal_gpu_hours=30.0,
                         worst_window={})


def _fake_autoscale(static_replicas: int) -> AutoscalePlan:
    """An autoscaling plan on chat rank 1 whose static peak plan runs ``static_replicas`` (the search's: 1)."""
    return AutoscalePlan(load_plan(CHAT), _rule(), _certification(),
                         DiurnalProfile(mean_rate_per_s=20.0, peak_to_trough=3.0, peak_hour=14.0), "poisson",
                         static_replicas=static_replicas, peak_window_rate_per_s=25.0, static_replicas_at_c1=3)


def _k8s_replicas(text: str) -> list[int]:
    return [d["spec"]["replicas"] for d in yaml.safe_load_all(text) if d and d.get("kind") == "Deployment"]


def test_emit_writes_the_static_peak_plan_the_report_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The report says "static peak plan x3"; plan.json's rank 1, k8s.yaml's Deployment and the Helm values run 3
    replicas (they ran the search's 1 before), at 3 x $2.59/h."""
    import recommender.autoscale as autoscale

    monkeypatch.setattr(autoscale, "plan_autoscaling", lambda *a, **k: _fake_autoscale(3))
    out = tmp_path / "em"
    res = CliRunner().invoke(app, ["autoscale", "--workload", str(ROOT / "examples" / "chat-day.yaml"),
                                   "--emit", str(out)])
    assert res.exit_code == 0, res.output
    assert "static peak plan x3" in res.stdout
    doc = json.loads((out / "plan.json").read_text(encoding="utf-8"))
    (row,) = doc["plans"]
    assert row["rank"] == 1 and row["replicas"] == 3 and [p["replicas"] for p in row["pools"]] == [3]
    assert row["usd_per_hour"] == pytest.approx(7.77)
    assert load_plan(out / "plan.json").top.pools[0].replicas == 3           # the one reader takes it back
    assert _k8s_replicas((out / "k8s.yaml").read_text(encoding="utf-8")) == [3]
    helm = yaml.safe_load((out / "helm-values.yaml").read_text(encoding="utf-8"))
    assert [m["replicaCount"] for m in helm["servingEngineSpec"]["modelSpec"]] == [3]
    auto = json.loads((out / "autoscale.json").read_text(encoding="utf-8"))
    assert auto["pools"][0]["static_replicas"] == 3 and auto["pools"][0]["search_replicas"] == 1
    for name in ("hpa.yaml", "keda-scaledobject.yaml", "k8s.yaml"):
        assert "# Pool both: 3 x mi300x TP1" in (out / name).read_text(encoding="utf-8"), name


# -- hpa.yaml against vLLM's own series -------------------------------------------------------------------------
#: vLLM 0.33's exposition of the counter the rule reads (its labels: engine, finished_reason, model_name = the
#: served name; see /work/shared/reference/vllm/metrics-example.txt and README section "Metrics"), for rag's served
#: name and for another model on the same Prometheus
RAG_SERIES = 'vllm:request_success_total{engine="0",finished_reason="stop",model_name="meta-llama/Llama-3.1-70B-Instruct"}'
OTHER_SERIES = 'vllm:request_success_total{engine="0",finished_reason="stop",model_name="Qwen/Qwen3-8B"}'
_K8S_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


def _selector(text: str) -> tuple[str, list[tuple[str, str, str]]]:
    """``name{a="x",b!="y"}`` -> (name, [(label, op, value)]): a PromQL series selector, as written here."""
    m = re.fullmatch(r"([A-Za-z_:][A-Za-z0-9_:]*)\{(.*)\}", text)
    assert m, text
    matchers = re.findall(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!=|!~|=)\s*"((?:[^"\\]|\\.)*)"\s*,?', m.group(2))
    assert re.sub(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!=|!~|=)\s*"((?:[^"\\]|\\.)*)"\s*,?', "", m.group(2)).strip() == ""
    return m.group(1), matchers


def _labels(series: str) -> tuple[str, dict[str, str]]:
    name, matchers = _selector(series)
    return name, {k: v for k, _, v in matchers}


def _selects(selector: str, series: str) -> bool:
    name, matchers = _selector(selector)
    s_name, labels = _labels(series)

    def holds(value: str, op: str, want: str) -> bool:  # PromQL: an absent label is the empty string
        return {"=": value == want, "!=": value != want, "=~": re.fullmatch(want, value) is not None,
                "!~": re.fullmatch(want, value) is None}[op]

    return name == s_name and all(holds(labels.get(k, ""), op, v) for k, op, v in matchers)


def _adapter_rule(hpa_text: str) -> dict[str, Any]:
    """The prometheus-adapter rule the header of hpa.yaml documents (its YAML comment lines)."""
    lines = [ln[1:] for ln in hpa_text.split("\n---\n", 1)[0].splitlines() if ln.startswith("#   ")]
    doc = yaml.safe_load("\n".join(lines))
    (rule,) = doc["externalRules"]
    assert isinstance(rule, dict)
    return rule


def _render(hold_s: int) -> dict[str, str]:
    from recommender.deploy import build_spec
    from recommender.deploy.keda import AutoscalerSettings, render_autoscaler

    s = AutoscalerSettings(min_replicas=2, max_replicas=7, target_per_replica_per_s=1.999, polling_s=15,
                           metric_window_s=60, scale_down_stabilisation_s=3600 if hold_s else 900, metric_hold_s=hold_s)
    return render_autoscaler(build_spec(load_plan(RAG), 1, plan_name="plan.json"), s)


@pytest.mark.parametrize("hold_s", [0, 3405])
def test_hpa_and_its_adapter_rule_select_vllms_series(hold_s: int) -> None:
    """The adapter rule finds rag's series and not another model's; the HPA's metric is the name the rule
    serves; what the HPA's selector adds (prometheus-adapter puts it into <<.LabelMatchers>>) holds on vLLM's
    series; and the query the adapter then runs is the ScaledObject's own query, which selects the series."""
    import kubernetes_validate

    files = _render(hold_s)
    (hpa,) = [d for d in yaml.safe_load_all(files["hpa.yaml"]) if d]
    kubernetes_validate.validate(hpa, kubernetes_validate.latest_version(), strict=True)
    (so,) = [d for d in yaml.safe_load_all(files["keda-scaledobject.yaml"]) if d]
    keda_query = so["spec"]["triggers"][0]["metadata"]["query"]
    rule = _adapter_rule(files["hpa.yaml"])
    series_name, series_labels = _labels(RAG_SERIES)
    assert "/" in series_labels["model_name"]                      # no label value can spell it: the bug's cause

    assert _selects(rule["seriesQuery"], RAG_SERIES) and not _selects(rule["seriesQuery"], OTHER_SERIES)
    assert re.fullmatch(rule["name"]["matches"], series_name)
    metric = hpa["spec"]["metrics"][0]["external"]["metric"]
    assert metric["name"] == rule["name"]["as"]
    assert rule["resources"] == {"namespaced": False}               # no namespace matcher: as the KEDA query
    wanted = metric.get("selector", {}).get("matchLabels", {})
    for key, value in wanted.items():                               # a selector, if any, must hold on the series
        assert series_labels.get(key) == value and _K8S_LABEL_VALUE.fullmatch(value)
    matchers = ",".join(f'{k}="{v}"' for k, v in wanted.items())
    query = rule["metricsQuery"].replace("<<.Series>>", series_name).replace("<<.LabelMatchers>>", matchers)
    assert query == keda_query
    inner = re.search(r"rate\((.*?)\[\d+s\]\)", query)
    assert inner and _selects(inner.group(1), RAG_SERIES) and not _selects(inner.group(1), OTHER_SERIES)
    assert query.startswith("max_over_time(") == (hold_s > 0)


# -- flags checked before the day is planned -----------------------------------------------------------------------
@pytest.mark.parametrize(("flags", "needle"), [
    (["--startup", "0s"], "--startup '0s'"), (["--startup", "0"], "--startup '0'"),
    (["--startup", "-4min"], "--startup '-4min'"), (["--startup", "2h"], "(0 s, 1 h]"),
    (["--prometheus", "file:///etc/passwd"], "--prometheus 'file:///etc/passwd'"),
    (["--prometheus", "http://user:secret@prom:9090"], "credentials"),
    (["--prometheus", "http://prom:90909"], "port"),
])
def test_bad_flags_are_one_line_before_the_search(flags: list[str], needle: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import recommender.autoscale as autoscale

    def never(*a: object, **k: object) -> AutoscalePlan:
        raise AssertionError("planned the day with a flag that should have been refused")

    monkeypatch.setattr(autoscale, "plan_autoscaling", never)
    res = CliRunner().invoke(app, ["autoscale", "--workload", str(ROOT / "examples" / "chat-day.yaml"), *flags])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], res.stderr


def test_a_zero_startup_override_is_refused_not_replaced_by_the_default() -> None:
    """The API refuses 0 s too (before, `0.0 or default` planned with the 252.66 s default)."""
    from recommender.autoscale import plan_autoscaling
    from recommender.workload import load_workload

    with pytest.raises(ConfigError, match=r"\(0 s, 1 h\]"):
        plan_autoscaling(load_workload(str(ROOT / "examples" / "chat-day.yaml")), static_plan=load_plan(CHAT),
                         startup_override_s=0.0)
