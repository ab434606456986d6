"""Multi-node replicas: a model no instance holds (Llama 3.1 405B in bf16 on 8-GPU H100 instances) is planned as
TP within an instance and pipeline stages across instances over the offers' NICs, and deploys as a
LeaderWorkerSet (validated against its CRD schema: tests/data/crds/, from kubernetes-sigs/lws) and `vllm serve`
lines vLLM 0.33's parser takes."""

from __future__ import annotations

import shlex

import pytest
import yaml
from crd_schema import errors_of

from recommender.catalog import default_catalog
from recommender.deploy import check_serve_args, render_deploy
from recommender.errors import DeployError
from recommender.perf import memory as mem
from recommender.perf.step import EngineLimits
from recommender.profiles import engine_profile
from recommender.search.planner import SearchSettings, build_context, recommend
from recommender.search.policy import SearchPolicy
from recommender.perf.pipeline import PP_HOP_LATENCY_S
from recommender.workload import LengthDist, Slo, Workload

CAT = default_catalog()
W = Workload(model="llama-3.1-405b", prompt_tokens=LengthDist.constant(2000), output_tokens=LengthDist.constant(200),
             arrival_rate_per_s=0.5, gpus=("h100-sxm",), slos=(Slo("tpot", 0.1, "p90"),), name="405b-bf16")
BF16 = SearchPolicy(weight_dtypes=("bf16",))


def test_405b_bf16_does_not_fit_one_h100_instance_but_a_pipeline_stage_does() -> None:
    model, gpu = CAT.model("llama-3.1-405b"), CAT.gpu("h100-sxm")
    # ~405e9 parameters x 2 bytes / 8 GPUs = ~101 GB per GPU > 80 GB; half the layers per stage: ~51 GB
    assert mem.weights_bytes_per_gpu(model, "bf16", 8) > gpu.memory_bytes
    ctx = build_context(W, BF16, engine_profile("vllm"), CAT)
    lim = EngineLimits(max_num_seqs=16, max_num_batched_tokens=1024)
    assert ctx.cost_model("h100-sxm", 8, "bf16", "fp8", lim)[0] is None
    cost, why = ctx.cost_model("h100-sxm", 8, "bf16", "fp8", lim, pp=2)
    assert cost is not None, why
    # one stage hop per step: hidden 16,384 x 2 B per token over the slowest NIC per GPU of the H100 offers that
    # name one (AWS p5 EFA, Azure ND H100 v5 IB, CoreWeave IB: 400 Gb/s = 50e9 B/s each)
    assert cost.pp_hop_s_per_token == pytest.approx(16384 * 2 / 50e9)


@pytest.fixture(scope="module")
def plan():  # type: ignore[no-untyped-def]
    return recommend(W, settings=SearchSettings(seed=0, verify=1), policy=BF16)


def test_a_plan_for_405b_bf16_on_h100_spans_nodes(plan) -> None:  # type: ignore[no-untyped-def]
    top = plan.top
    (pool,) = top.pools
    assert pool.weight_dtype == "bf16" and pool.pp >= 2 and pool.tp == 8
    assert top.gpus_total == pool.tp * pool.pp * pool.replicas
    r = pool.rental
    assert r is not None and r.gpus_per_instance == 8 and r.instances == pool.replicas * pool.pp
    # every stage on an offer whose NIC the catalog names (stages talk over it each step)
    offer = next(o for o in CAT.gpu("h100-sxm").offers if o.provider == r.provider and o.gpus_per_instance == 8)
    assert offer.network.known and offer.network.rdma
    assert top.simulated is not None and top.simulated["tpot_s"]["p90"] <= 0.1  # the simulator agrees


def test_it_deploys_as_a_leader_worker_set_and_vllm_lines_that_parse(plan) -> None:  # type: ignore[no-untyped-def]
    files = render_deploy(plan, rank=1, formats="all")
    assert sorted(files) == ["k8s.yaml", "vllm-serve.sh"]  # the production-stack chart has no multi-node replica
    with pytest.raises(DeployError, match="spans 2 nodes"):
        render_deploy(plan, rank=1, formats="helm")
    lws = [d for d in yaml.safe_load_all(files["k8s.yaml"]) if d and d["kind"] == "LeaderWorkerSet"]
    assert len(lws) == 1 and errors_of(lws[0]) == []
    pool = plan.top.pools[0]
    tmpl = lws[0]["spec"]["leaderWorkerTemplate"]
    assert lws[0]["spec"]["replicas"] == pool.replicas and tmpl["size"] == pool.pp
    leader = tmpl["leaderTemplate"]["spec"]["containers"][0]
    worker = tmpl["workerTemplate"]["spec"]["containers"][0]
    assert leader["resources"]["limits"]["nvidia.com/gpu"] == worker["resources"]["limits"]["nvidia.com/gpu"] == "8"
    script = leader["args"][0]
    head, _, serve = script.partition(" && exec vllm serve ")
    assert head == "ray start --head --port=6379"
    argv = shlex.split(serve)
    check_serve_args(argv)  # vLLM 0.33's flag table
    for flag, value in (("--tensor-parallel-size", "8"), ("--pipeline-parallel-size", str(pool.pp)),
                        ("--distributed-executor-backend", "ray")):
        assert argv[argv.index(flag) + 1] == value
    assert worker["args"] == ["ray start --address=$(LWS_LEADER_ADDRESS):6379 --block"]
    # the Service selects the leaders (the pods that serve HTTP), not the Ray workers
    svc = next(d for d in yaml.safe_load_all(files["k8s.yaml"]) if d and d["kind"] == "Service")
    leader_labels = tmpl["leaderTemplate"]["metadata"]["labels"]
    worker_labels = tmpl["workerTemplate"]["metadata"]["labels"]
    assert all(leader_labels.get(k) == v for k, v in svc["spec"]["selector"].items())
    assert not all(worker_labels.get(k) == v for k, v in svc["spec"]["selector"].items())
    sh = files["vllm-serve.sh"]
    line = sh[sh.index("exec vllm serve ") + len("exec vllm serve "):].replace("\\\n", " ")
    check_serve_args(shlex.split(line))
    assert "--pipeline-parallel-size 2" in line and "ray start --head" in sh


def test_models_one_instance_holds_get_no_pipeline_shapes() -> None:
    from recommender.search.planner import space_choices
    from recommender.search.shapes import pipeline_shapes

    w = Workload(model="llama-3.1-70b", prompt_tokens=W.prompt_tokens, output_tokens=W.output_tokens,
                 arrival_rate_per_s=1.0, gpus=("h100-sxm",), slos=W.slos, name="70b")
    ctx = build_context(w, BF16, engine_profile("vllm"), CAT)
    assert pipeline_shapes(ctx, space_choices(ctx)) == []  # 141 GB of bf16 weights fit 8 x 80 GB
    ctx = build_context(W, BF16, engine_profile("vllm"), CAT)
    assert {(c.tp, c.pp) for c in pipeline_shapes(ctx, space_choices(ctx))} == {(8, 2), (8, 4)}
    assert PP_HOP_LATENCY_S > 0


def test_a_moe_pipeline_stage_holds_its_share_of_the_expert_layers() -> None:
    """DeepSeek-V3 / R1 (61 layers: 3 dense, then 58 with 256 routed experts of 3 x 7168 x 2048 weights,
    catalogs/models/deepseek-v3.yaml) in two stages: the fullest holds ceil(61 / 2) = 31 layers, all of them MoE, so
    31 x 256 x 3 x 7168 x 2048 = 349.5e9 expert weights, not all 58 layers' (with the layers cut alone, a stage kept
    every expert layer and counted 31 - 58 dense ones)."""
    from recommender.perf.pipeline import pipeline_stage

    model = CAT.model("deepseek-v3")
    stage = pipeline_stage(model, 2)
    assert (stage.num_layers, stage.moe.num_moe_layers) == (31, 31)  # type: ignore[union-attr]
    assert stage.params.experts == 31 * 256 * 3 * 7168 * 2048 and stage.params.dense_mlp == 0
    assert pipeline_stage(model, 1).params.total == model.params.total
    llama = pipeline_stage(CAT.model("llama-3.1-405b"), 2)
    assert llama.num_layers == 63 and llama.moe is None  # 126 layers / 2


def test_deepseek_r1_on_h100_is_planned_over_two_nodes() -> None:
    """671B of fp8 weights: 84 GB per GPU over one 8 x 80 GB H100 node, so the search said "does not fit any allowed
    GPU set"; a PP2 stage holds 31 layers' weights, about 45 GB per GPU, and the plan is TP 8 x PP 2 over two nodes."""
    w = Workload(model="deepseek-r1", prompt_tokens=LengthDist.constant(2000), output_tokens=LengthDist.constant(500),
                 arrival_rate_per_s=1.0, gpus=("h100-sxm",), slos=(Slo("tpot", 0.05, "p90"),), name="r1-h100")
    plan = recommend(w, settings=SearchSettings(seed=0, verify=0, top=2))
    (pool,) = plan.top.pools
    assert (pool.gpu, pool.tp, pool.pp) == ("h100-sxm", 8, 2) and plan.workload.hf_repo == "deepseek-ai/DeepSeek-R1"
    files = render_deploy(plan, rank=1, formats="k8s")
    (lws,) = [d for d in yaml.safe_load_all(files["k8s.yaml"]) if d and d["kind"] == "LeaderWorkerSet"]
    assert errors_of(lws) == [] and lws["spec"]["leaderWorkerTemplate"]["size"] == 2


@pytest.mark.parametrize("fmt", ["kserve", "llm-d", "dynamo"])
def test_one_pod_platforms_refuse_a_replica_over_nodes(plan, fmt: str) -> None:  # type: ignore[no-untyped-def]
    """Each of these runs one pod per replica: an 8-GPU pod with --pipeline-parallel-size 2 would wait for the
    second node's GPUs and never start, so the output is refused in one line naming the outputs that work."""
    with pytest.raises(DeployError, match=r"spans 2 nodes .*use --format k8s or disaggregatedset") as e:
        render_deploy(plan, rank=1, formats=fmt)
    assert "\n" not in str(e.value)


def test_platforms_write_the_leader_worker_set_only(plan) -> None:  # type: ignore[no-untyped-def]
    told: dict[str, str] = {}
    files = render_deploy(plan, rank=1, formats="platforms", on_skip=told.__setitem__)
    assert sorted(files) == ["disaggregatedset.yaml"]  # kserve, llm-d and dynamo skipped, as helm under 'all'
    assert sorted(told) == ["dynamo", "kserve", "llm-d"] and all("spans 2 nodes" in why for why in told.values())
    docs = [d for d in yaml.safe_load_all(files["disaggregatedset.yaml"]) if d]
    (lws,) = [d for d in docs if d["kind"] == "LeaderWorkerSet"]
    assert errors_of(lws) == []
    k8s = next(d for d in yaml.safe_load_all(render_deploy(plan, rank=1, formats="k8s")["k8s.yaml"]) if d and d["kind"] == "LeaderWorkerSet")
    pool = plan.top.pools[0]
    tmpl = lws["spec"]["leaderWorkerTemplate"]
    assert lws["spec"]["replicas"] == pool.replicas and tmpl["size"] == pool.pp == 2
    # the same Ray leader (vllm serve with PP) and workers as the Kubernetes output
    for part in ("leaderTemplate", "workerTemplate"):
        assert tmpl[part]["spec"]["containers"] == k8s["spec"]["leaderWorkerTemplate"][part]["spec"]["containers"]
    svc = next(d for d in docs if d["kind"] == "Service")
    assert all(tmpl["leaderTemplate"]["metadata"]["labels"].get(k) == v for k, v in svc["spec"]["selector"].items())
    assert not all(tmpl["workerTemplate"]["metadata"]["labels"].get(k) == v for k, v in svc["spec"]["selector"].items())


def test_the_autoscaler_scales_the_leader_worker_set(plan) -> None:  # type: ignore[no-untyped-def]
    """k8s.yaml runs a multi-node replica as a LeaderWorkerSet, so KEDA must scale that object: the LWS CRD of
    kubernetes-sigs/lws 060ab4da declares the scale subresource (specReplicasPath .spec.replicas, one replica = one
    group; reference/crds/leaderworkerset.x-k8s.io_leaderworkersets.yaml). A Deployment target names nothing."""
    from recommender.deploy.keda import hpa, plan_autoscaler, scaled_object
    from recommender.deploy.spec import build_spec

    spec = build_spec(plan, 1)
    lws = next(d for d in yaml.safe_load_all(render_deploy(plan, rank=1, formats="k8s")["k8s.yaml"]) if d and d["kind"] == "LeaderWorkerSet")
    (pool,) = spec.pools
    a = plan_autoscaler(spec, pool)
    want = {"apiVersion": lws["apiVersion"], "kind": "LeaderWorkerSet", "name": lws["metadata"]["name"]}
    assert scaled_object(spec, pool, a)["spec"]["scaleTargetRef"] == want
    assert hpa(spec, pool, a)["spec"]["scaleTargetRef"] == want
    keda = next(d for d in yaml.safe_load_all(render_deploy(plan, rank=1, formats="keda")["keda.yaml"]) if d)
    assert errors_of(keda) == [] and keda["spec"]["scaleTargetRef"] == want


def test_the_replan_cronjob_scales_the_leader_worker_set(plan) -> None:  # type: ignore[no-untyped-def]
    """`recommend replan` re-predicts a pipeline (recommender.plan.rebuild), so the job renders, and with --apply its
    Role may patch the LeaderWorkerSet's scale subresource that k8s.yaml runs the replica as."""
    from recommender.deploy.replan_job import ReplanJobOptions

    lws = next(d for d in yaml.safe_load_all(render_deploy(plan, rank=1, formats="k8s")["k8s.yaml"]) if d and d["kind"] == "LeaderWorkerSet")
    files = render_deploy(plan, rank=1, formats="replan-cronjob", replan=ReplanJobOptions(apply=True))
    role = next(d for d in yaml.safe_load_all(files["replan-cronjob.yaml"]) if d and d["kind"] == "Role")
    scale = [r for r in role["rules"] if r["resources"] == ["leaderworkersets/scale"]]
    assert scale and scale[0]["resourceNames"] == [lws["metadata"]["name"]] and "patch" in scale[0]["verbs"]


def test_the_replanner_predicts_a_pipeline_as_the_search_sized_it(plan) -> None:  # type: ignore[no-untyped-def]
    """At the plan's own rate the re-planner's prediction is the plan's (the same pipeline cost: the recorded
    stage NIC, 400 Gb/s = 50e9 B/s per GPU on the H100 offers that name one)."""
    from recommender.replan.predict import predict_plan

    (pool,) = plan.top.pools
    assert pool.stage_nic_bytes_per_s_per_gpu == pytest.approx(50e9)
    pred = predict_plan(plan, W, policy=BF16)
    for metric in ("ttft", "tpot"):
        assert pred.latencies[metric]["p90"] == pytest.approx(plan.top.latency_percentiles[metric]["p90"], rel=1e-9)
    assert pred.meets and pred.replicas == (pool.replicas,)


def test_a_plan_written_before_the_stage_nic_was_recorded_takes_the_catalogs_slowest(plan) -> None:  # type: ignore[no-untyped-def]
    import dataclasses

    from recommender.plan.rebuild import pool_models

    (pool,) = plan.top.pools
    old = dataclasses.replace(plan.top, pools=(dataclasses.replace(pool, stage_nic_bytes_per_s_per_gpu=None),))
    (pm,) = pool_models(old, model=CAT.model(W.model), profile=engine_profile("vllm"), catalog=CAT,
                        max_model_len=plan.top.max_model_len)
    # hidden 16,384 x 2 B per token per hop over 50e9 B/s (one hop between two stages)
    assert pm.cost.pp_hop_s_per_token == pytest.approx((pool.pp - 1) * 16384 * 2 / 50e9)
    assert pm.ranks == pool.replicas and pm.limits.max_num_seqs == pool.max_num_seqs


def test_simulate_runs_a_pipeline_plan_from_its_file(plan, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from recommender.cli import app
    from recommender.plan import dump_plan

    path = tmp_path / "plan.json"
    path.write_text(dump_plan(plan))
    res = CliRunner().invoke(app, ["simulate", "--plan", str(path), "--requests", "300", "-f", "json"])
    assert res.exit_code == 0, res.output
    out = __import__("json").loads(res.output)
    # the analytic side of the simulation is the plan's own prediction
    assert out["latency_s"]["tpot"]["analytic"]["p90"] == pytest.approx(plan.top.latency_percentiles["tpot"]["p90"], rel=1e-6)


@pytest.mark.parametrize("pp", [0, -3, 10**9])
def test_a_plan_file_with_a_stage_count_out_of_range_is_refused(plan, tmp_path, pp: int) -> None:  # type: ignore[no-untyped-def]
    """A hand-edited pp reached `vllm serve --pipeline-parallel-size 1000000000` (and a KV cache of 0 tokens)."""
    import json

    from recommender.errors import ConfigError
    from recommender.plan import dump_plan, load_plan

    doc = json.loads(dump_plan(plan))
    doc["plans"][0]["pools"][0]["pp"] = pp
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=r"pp \(pipeline stages\) must be in 1\.\.256") as e:
        load_plan(path)
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_the_autoscaler_counts_every_gpu_of_a_pipeline_replica(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A replica of DeepSeek-R1 TP 8 x PP 2 on H100 takes two 8-GPU nodes: the rule's GPUs per replica and the day's
    static GPU-hours count 16 each (they counted TP alone, 8)."""
    from recommender.autoscale import plan_autoscaling
    from recommender.workload import load_workload

    path = tmp_path / "r1-day.yaml"
    path.write_text("model: deepseek-r1\ntraffic: {arrival_rate: 1.0}\nprompt_tokens: 2000\noutput_tokens: 500\n"
                    "slo: [tpot=50ms]\ngpus: [h100-sxm]\nday: {peak_to_trough: 3, startup: 10min}\n", encoding="utf-8")
    ap = plan_autoscaling(load_workload(path), seed=0)
    (pool,) = ap.static_plan.top.pools
    assert (pool.tp, pool.pp) == (8, 2) and ap.rule.gpus_per_replica == 16
    assert ap.certification.static_gpu_hours == pytest.approx(ap.static_replicas * 16 * 24)


def test_the_price_sensitivity_starts_from_the_offer_the_pipeline_rents(plan) -> None:  # type: ignore[no-untyped-def]
    """A pipeline rents only offers that name their NIC, so rank 1 here pays CoreWeave's $49.24 per 8-GPU HGX H100
    instance-hour ([P4], catalogs/gpus/h100-sxm.yaml) = $6.155/GPU-h, not the cheapest H100 offer's $2.69 (RunPod, no
    NIC in the catalog); the "now" of its price threshold said $2.69."""
    (price,) = plan.search.sensitivity["prices"]
    assert price["gpu"] == "h100-sxm" and price["usd_per_gpu_hour"] == pytest.approx(49.24 / 8)
    assert plan.top.pools[0].rental.provider == "coreweave"


def test_recommend_gpus_says_which_gpus_can_be_planned_over_nodes() -> None:
    """The catalog's H100 SXM offers that name their NIC: AWS p5 (EFA), Azure ND H100 v5 (InfiniBand), CoreWeave HGX
    H100 (InfiniBand), 400 Gb/s per GPU each (catalogs/gpus/h100-sxm.yaml); the A10G has none, so a pipeline there is
    never planned, and the table says so."""
    from recommender.render.catalog import gpu_records, render_gpus

    recs = {r["id"]: r for r in gpu_records(CAT)}
    assert recs["h100-sxm"]["multinode"] == {"offers": 3, "providers": ["aws", "azure", "coreweave"],
                                             "slowest_nic_gbps_per_gpu": 400.0}
    assert recs["a10g"]["multinode"] is None
    line = next(x for x in render_gpus(CAT, width=400).splitlines() if x.startswith("h100-sxm "))
    assert "400 Gb/s (3)" in line


def _lws_containers(doc) -> list[dict]:  # type: ignore[no-untyped-def,type-arg]
    lws = next(d for d in yaml.safe_load_all(render_deploy(doc, rank=1, formats="k8s")["k8s.yaml"]) if d and d["kind"] == "LeaderWorkerSet")
    assert errors_of(lws) == []
    tmpl = lws["spec"]["leaderWorkerTemplate"]
    return [tmpl[p]["spec"]["containers"][0] for p in ("leaderTemplate", "workerTemplate")]


@pytest.mark.parametrize(("network", "resource", "per_gpu", "want"), [
    # CoreWeave HGX H100 over InfiniBand, no device resource in the catalog: the shared RDMA device
    ("infiniband 400 Gb/s per GPU", "", 0.0, {"rdma/rdma_shared_device_a": "1"}),
    # AWS p5: 32 EFA devices for 8 GPUs ([N1]), a TP8 stage requests all 32
    ("efa 400 Gb/s per GPU", "vpc.amazonaws.com/efa", 4.0, {"vpc.amazonaws.com/efa": "32"}),
    ("ethernet 100 Gb/s per instance", "", 0.0, {}),
])
def test_pipeline_stages_request_the_rdma_nic_they_talk_over(plan, network: str, resource: str, per_gpu: float,  # type: ignore[no-untyped-def]
                                                              want: dict[str, str]) -> None:
    """The stages pass activations over the offer's NIC every step (NCCL): over RDMA a pod must request the NIC's
    devices and may pin memory (IPC_LOCK), else NCCL falls back to TCP sockets."""
    import json

    from recommender.plan import dump_plan

    doc = json.loads(dump_plan(plan))
    rental = doc["plans"][0]["pools"][0]["rental"]
    rental.update(network=network, rdma_resource=resource, rdma_per_gpu=per_gpu)
    for c in _lws_containers(doc):
        limits = c["resources"]["limits"]
        assert {k: v for k, v in limits.items() if k != "nvidia.com/gpu"} == want
        assert ("IPC_LOCK" in c.get("securityContext", {}).get("capabilities", {}).get("add", [])) == bool(want)
        assert ({"name": "FI_PROVIDER", "value": "efa"} in c["env"]) == network.startswith("efa")
