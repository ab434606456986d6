"""Engines wider than one Kubernetes node (recommender/deploy/spec.py ``_nodes_per_stage``).

GB200 NVL72 is sold and scheduled as 4-GPU compute trays (catalogs/gpus/gb200.yaml: CoreWeave's offer [P4],
``k8s.gpus_per_node: 4``) of one 72-GPU NVLink domain, and the search prices a TP 8 engine there as two trays of one
rack. Such an engine deploys as a LeaderWorkerSet group of two 4-GPU pods (a Ray cluster) that hold the IMEX
channel of an NVIDIA ComputeDomain and stay in one NVLink partition, so NCCL's all-reduce between the trays runs
over NVLink as the plan priced it. The ComputeDomain is checked against its CRD (NVIDIA/k8s-dra-driver-gpu, stored
in tests/data/crds with its source), the LeaderWorkerSet against kubernetes-sigs/lws's, the rest against Kubernetes'
own schemas, the vllm serve line against vLLM 0.33's flag table. Elsewhere an engine wider than one rented instance
is still refused in one line: the renderers would run it in one pod that no node can hold."""

from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from crd_schema import errors_of
from typer.testing import CliRunner

from recommender.cli.app import app
from recommender.deploy import check_serve_args, render_deploy
from recommender.deploy.spec import build_spec
from recommender.errors import DeployError

PLAN = Path(__file__).resolve().parents[1] / "examples" / "plans" / "batch-summarization.plan.json"


def _plan_with(gpu: str, tp: int) -> tuple[dict, int]:
    """The example plan with its ``gpu`` row's engine set to ``tp`` GPUs (gb200: rank 5, TP 1 x 8 replicas on 4-GPU
    trays; mi300x: rank 1, TP 1 on DigitalOcean's 1-GPU instances)."""
    doc = copy.deepcopy(json.loads(PLAN.read_text()))
    row = next(p for p in doc["plans"] if p["pools"][0]["gpu"] == gpu)
    row["tp"] = row["pools"][0]["tp"] = tp
    return doc, row["rank"]


def _objects(doc: dict, rank: int, fmt: str = "k8s") -> list[dict]:
    files = render_deploy(doc, rank=rank, formats=fmt)
    return [d for text in files.values() if text.lstrip().startswith(("#", "---", "api")) and not text.startswith("#!")
            for d in yaml.safe_load_all(text) if d]


def test_an_engine_within_a_tray_is_one_pod() -> None:
    doc, rank = _plan_with("gb200", 4)
    (pool,) = build_spec(doc, rank).pools
    assert (pool.tp, pool.nodes_per_stage, pool.gpus_per_pod) == (4, 1, 4)
    assert [d["kind"] for d in _objects(doc, rank)] == ["PersistentVolumeClaim", "Deployment", "Service"]


def test_an_engine_over_two_trays_is_a_leader_worker_set_over_a_compute_domain() -> None:
    doc, rank = _plan_with("gb200", 8)
    (pool,) = build_spec(doc, rank).pools
    assert (pool.nodes_per_stage, pool.nodes_per_replica, pool.gpus_per_pod) == (2, 2, 4)
    objs = _objects(doc, rank)
    assert [d["kind"] for d in objs] == ["PersistentVolumeClaim", "ComputeDomain", "LeaderWorkerSet", "Service"]
    pvc, cd, lws, svc = objs
    for d in (pvc, svc):
        kubernetes_validate.validate(d, kubernetes_validate.latest_version(), strict=True)
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]  # 16 pods on 16 trays load their shards from it
    assert errors_of(cd) == [] and errors_of(lws) == []
    channel = cd["spec"]["channel"]["resourceClaimTemplate"]["name"]
    tmpl = lws["spec"]["leaderWorkerTemplate"]
    assert lws["spec"]["replicas"] == pool.replicas == 8 and tmpl["size"] == 2
    for part in ("leaderTemplate", "workerTemplate"):
        pod = tmpl[part]["spec"]
        (ctr,) = pod["containers"]
        assert ctr["resources"]["limits"]["nvidia.com/gpu"] == "4"       # one tray's GPUs per pod
        (claim,) = pod["resourceClaims"]
        assert claim["resourceClaimTemplateName"] == channel           # the ComputeDomain's IMEX channel
        assert ctr["resources"]["claims"] == [{"name": claim["name"]}]
        (term,) = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        # pods of one LWS group (its group-key label) on trays of one NVLink partition (GFD's clique label)
        assert term["matchLabelKeys"] == ["leaderworkerset.sigs.k8s.io/group-key"]
        assert term["topologyKey"] == "nvidia.com/gpu.clique"
        assert all(pod_labels.get(k) == v for pod_labels in [tmpl[part]["metadata"]["labels"]]
                   for k, v in term["labelSelector"]["matchLabels"].items())
    head, _, serve = tmpl["leaderTemplate"]["spec"]["containers"][0]["args"][0].partition(" && exec vllm serve ")
    assert head == "ray start --head --port=6379"
    argv = shlex.split(serve)
    check_serve_args(argv)
    assert argv[argv.index("--tensor-parallel-size") + 1] == "8"
    assert argv[argv.index("--distributed-executor-backend") + 1] == "ray"
    assert "--pipeline-parallel-size" not in argv
    script = render_deploy(doc, rank=rank, formats="cmd")["vllm-serve.sh"]
    assert "4 x gb200 GPU(s)" in script and "--distributed-executor-backend ray" in script
    assert "nvidia.com/gpu.clique" in script


def test_the_other_formats_for_it() -> None:
    doc, rank = _plan_with("gb200", 8)
    assert sorted(render_deploy(doc, rank=rank, formats="all")) == ["k8s.yaml", "vllm-serve.sh"]  # the chart has no multi-node replica
    for fmt in ("helm", "kserve", "llm-d", "dynamo"):
        with pytest.raises(DeployError, match=r"spans 2 4-GPU gb200 nodes of one NVLink domain .*use --format k8s"):
            render_deploy(doc, rank=rank, formats=fmt)
    objs = _objects(doc, rank, "disaggregatedset")
    assert [d["kind"] for d in objs] == ["PersistentVolumeClaim", "ComputeDomain", "LeaderWorkerSet", "Service"]
    assert all(errors_of(d) == [] for d in objs[1:3])
    from recommender.deploy.keda import scale_target  # (this example is an offline job: --format keda refuses it)

    assert scale_target(build_spec(doc, rank), build_spec(doc, rank).pools[0]) == {
        "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "name": objs[2]["metadata"]["name"]}


def test_trays_and_pipeline_stages_together_are_refused() -> None:
    doc, rank = _plan_with("gb200", 8)
    next(p for p in doc["plans"] if p["rank"] == rank)["pools"][0]["pp"] = 2
    with pytest.raises(DeployError, match=r"one engine of 8 GPUs \(TP 8 x DP 1 x PP 2\) on gb200 is not a whole number "
                                          "of 4-GPU nodes of one 72-GPU NVLink domain in one pipeline stage"):
        build_spec(doc, rank)


def test_an_engine_wider_than_an_instance_without_an_nvlink_domain_across_them_is_refused(tmp_path: Path) -> None:
    doc, rank = _plan_with("mi300x", 2)
    with pytest.raises(DeployError, match="one engine of 2 GPUs .* spans 2 1-GPU mi300x instances"):
        build_spec(doc, rank)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(doc))
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["deploy", str(plan), "--rank", str(rank), "--format", "k8s", "--out", str(out)])
    assert res.exit_code != 0
    assert len(res.output.strip().splitlines()) == 1 and "tensor_parallel up to 1" in res.output
    assert not out.exists()


@pytest.mark.parametrize("bad", [0, 72, 5, "4", True, -4])
def test_a_node_size_the_domain_cannot_hold_is_a_one_line_catalog_error(bad: object) -> None:
    import yaml as _yaml

    from recommender.catalog import catalog_dir, gpu_from_doc
    from recommender.errors import CatalogError

    doc = _yaml.safe_load((catalog_dir() / "gpus" / "gb200.yaml").read_text())
    assert gpu_from_doc(doc).k8s_gpus_per_node == 4
    doc["k8s"]["gpus_per_node"] = bad
    with pytest.raises(CatalogError, match="k8s.gpus_per_node .* must be a whole number of GPUs below the NVLink "
                                           "domain of 72 that divides it") as e:
        gpu_from_doc(doc, "gb200")
    assert "\n" not in str(e.value)


def _with_dp(tp: int, dp: int) -> tuple[dict, int]:
    doc, rank = _plan_with("gb200", tp)
    next(p for p in doc["plans"] if p["rank"] == rank)["pools"][0]["data_parallel_size"] = dp
    return doc, rank


def test_data_parallel_ranks_over_trays_are_launched_by_vllms_ray_data_parallel_backend() -> None:
    """TP 4 x DP 2 on two trays: one rank per tray. vLLM's data-parallel deployment docs: ``vllm serve --data-parallel-size
    N --data-parallel-size-local L --data-parallel-backend=ray`` on one node launches the local and the remote ranks
    over the Ray cluster (``--distributed-executor-backend ray`` spreads one rank's TP group instead)."""
    doc, rank = _with_dp(4, 2)
    (pool,) = build_spec(doc, rank).pools
    assert (pool.nodes_per_stage, pool.gpus_per_pod) == (2, 4)
    lws = next(d for d in _objects(doc, rank) if d["kind"] == "LeaderWorkerSet")
    assert errors_of(lws) == []
    serve = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["args"][0]
    argv = shlex.split(serve.partition(" && exec vllm serve ")[2])
    check_serve_args(argv)
    got = {f: argv[argv.index(f) + 1] for f in ("--tensor-parallel-size", "--data-parallel-size",
                                                "--data-parallel-size-local", "--data-parallel-backend")}
    assert got == {"--tensor-parallel-size": "4", "--data-parallel-size": "2", "--data-parallel-size-local": "1",
                   "--data-parallel-backend": "ray"}
    assert "--distributed-executor-backend" not in argv
    # the file header counts every GPU: 8 replicas x TP 4 x DP 2
    assert ("# Pool both: 8 x gb200 TP4 x DP2, a replica over 2 4-GPU gb200 nodes of one NVLink domain (TP 4 x DP 2) "
            "(64 GPUs)") in render_deploy(doc, rank=rank, formats="cmd")["vllm-serve.sh"]


def test_a_data_parallel_rank_wider_than_a_tray_is_refused() -> None:
    doc, rank = _with_dp(8, 2)
    with pytest.raises(DeployError, match="a data-parallel rank of TP 8 does not fit whole on the 4-GPU nodes of gb200"):
        build_spec(doc, rank)


def test_the_default_formats_skip_helm_for_it() -> None:
    """``render_deploy``'s default is 'all' (cmd, k8s, helm, helm skipped for a multi-node replica), as the
    re-planner's and ``recommend --emit``'s writes use it; naming helm still refuses."""
    doc, rank = _plan_with("gb200", 8)
    assert sorted(render_deploy(doc, rank=rank)) == ["k8s.yaml", "vllm-serve.sh"]


def test_recommend_emit_writes_rank_1_over_two_trays(tmp_path: Path) -> None:
    # Llama-3.1-405B at 2 req/s, TPOT <= 50 ms on GB200: rank 1 is TP 8 on two trays (int4), which --emit once
    # refused because it asked for helm by name
    out = tmp_path / "emit"
    res = CliRunner().invoke(app, ["--model", "llama-3.1-405b", "--gpus", "gb200", "--rate", "2", "--prompt-tokens",
                                   "2000", "--output-tokens", "300", "--slo", "tpot=50ms", "--verify", "0",
                                   "--emit", str(out)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["k8s.yaml", "plan.json", "vllm-serve.sh"]
    kinds = [d["kind"] for d in yaml.safe_load_all((out / "k8s.yaml").read_text()) if d]
    assert "ComputeDomain" in kinds and "LeaderWorkerSet" in kinds
