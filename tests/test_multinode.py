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
from recommender.sizing import PP_HOP_LATENCY_S
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
    files = render_deploy(plan, 1, "all")
    assert sorted(files) == ["k8s.yaml", "vllm-serve.sh"]  # the production-stack chart has no multi-node replica
    with pytest.raises(DeployError, match="spans 2 nodes"):
        render_deploy(plan, 1, "helm")
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
    from recommender.sizing import pipeline_stage

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
    files = render_deploy(plan, 1, "k8s")
    (lws,) = [d for d in yaml.safe_load_all(files["k8s.yaml"]) if d and d["kind"] == "LeaderWorkerSet"]
    assert errors_of(lws) == [] and lws["spec"]["leaderWorkerTemplate"]["size"] == 2


@pytest.mark.parametrize("fmt", ["kserve", "llm-d", "dynamo"])
def test_one_pod_platforms_refuse_a_replica_over_nodes(plan, fmt: str) -> None:  # type: ignore[no-untyped-def]
    """Each of these runs one pod per replica: an 8-GPU pod with --pipeline-parallel-size 2 would wait for the
    second node's GPUs and never start, so the output is refused in one line naming the outputs that work."""
    with pytest.raises(DeployError, match=r"spans 2 nodes .*use --format k8s or disaggregatedset") as e:
        render_deploy(plan, 1, fmt)
    assert "\n" not in str(e.value)


def test_platforms_write_the_leader_worker_set_only(plan) -> None:  # type: ignore[no-untyped-def]
    told: dict[str, str] = {}
    files = render_deploy(plan, 1, "platforms", on_skip=told.__setitem__)
    assert sorted(files) == ["disaggregatedset.yaml"]  # kserve, llm-d and dynamo skipped, as helm under 'all'
    assert sorted(told) == ["dynamo", "kserve", "llm-d"] and all("spans 2 nodes" in why for why in told.values())
    docs = [d for d in yaml.safe_load_all(files["disaggregatedset.yaml"]) if d]
    (lws,) = [d for d in docs if d["kind"] == "LeaderWorkerSet"]
    assert errors_of(lws) == []
    k8s = next(d for d in yaml.safe_load_all(render_deploy(plan, 1, "k8s")["k8s.yaml"]) if d and d["kind"] == "LeaderWorkerSet")
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
    lws = next(d for d in yaml.safe_load_all(render_deploy(plan, 1, "k8s")["k8s.yaml"]) if d and d["kind"] == "LeaderWorkerSet")
    (pool,) = spec.pools
    a = plan_autoscaler(spec, pool)
    want = {"apiVersion": lws["apiVersion"], "kind": "LeaderWorkerSet", "name": lws["metadata"]["name"]}
    assert scaled_object(spec, pool, a)["spec"]["scaleTargetRef"] == want
    assert hpa(spec, pool, a)["spec"]["scaleTargetRef"] == want
    keda = next(d for d in yaml.safe_load_all(render_deploy(plan, 1, "keda")["keda.yaml"]) if d)
    assert errors_of(keda) == [] and keda["spec"]["scaleTargetRef"] == want


def test_the_replan_cronjob_is_refused_for_a_replica_over_nodes(plan) -> None:  # type: ignore[no-untyped-def]
    # `recommend replan` refuses multi-node plans (replan.predict), so the job would fail on every run
    with pytest.raises(DeployError, match="spans several nodes .*re-plan from the workload file") as e:
        render_deploy(plan, 1, "replan-cronjob")
    assert "\n" not in str(e.value)
