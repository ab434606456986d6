"""The platform targets (KServe, llm-d, Dynamo, DisaggregatedSet / LeaderWorkerSet): every example and fixture plan,
every rank, validates against the real CRD schemas (tests/data/crds/, sources in its README) and the llm-d chart's
values schema; a renamed field fails; the ``vllm serve`` line each platform will run passes vLLM 0.33's flag table
and says what the plan says (expectations read from the plan JSON, as in test_deploy_render); P/D outputs keep
separate prefill and decode roles with the plan's replicas, TP and the KV connector of the vllm serve lines."""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
import shlex
from pathlib import Path
from typing import Any, Iterator

import jsonschema
import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

import crd_schema
from recommender.cli import app
from recommender.deploy import PLATFORM_FORMATS, ClusterOptions, normalise_formats, render_deploy
from recommender.deploy.vllm_flags import check_serve_args
from recommender.errors import ConfigError, DeployError
from recommender.plan import load_plan
from test_deploy_render import assert_settings, expected_settings
from test_hostile_deploy import HOSTILE, k8s_expansions

ROOT = Path(__file__).resolve().parent.parent
PLANS = Path(__file__).parent / "data" / "plans"
CRDS = Path(__file__).parent / "data" / "crds"
SHARED_CRDS = ROOT.parent / "shared" / "reference" / "crds"
DISAGG = PLANS / "disagg-llama70b-h200.json"
AGG = PLANS / "agg-llama70b-h100.json"
ROCM_DYNAMO = "registry.example.com/dynamo/vllm-runtime-rocm:1.0.0"  # a user's own ROCm build (Dynamo ships CUDA only)

#: the files each target writes
FILES = {"kserve": ["kserve.yaml"], "llm-d": ["llm-d-values.yaml", "llm-d-inferencepool.yaml"],
         "dynamo": ["dynamo.yaml"], "disaggregatedset": ["disaggregatedset.yaml"]}
#: keys llm-d-modelservice v0.4.12's templates read (templates/*.yaml, _helpers.tpl at 3051935e:
#: `.pdSpec.X` / `.Values.decode.X`, `.container.X`); its schema leaves these objects open, so a renamed key
#: would pass the schema and be ignored by the chart: this list catches it
CHART_ROLE_KEYS = {"accelerator", "acceleratorTypes", "annotations", "autoscaling", "containers", "create",
                   "enableServiceLinks", "extraConfig", "hostIPC", "hostPID", "imagePullSecrets", "initContainers",
                   "monitoring", "nodeSelector", "parallelism", "podAnnotations", "podSecurityContext",
                   "priorityClassName", "replicas", "resourceClaims", "schedulerName", "strategy",
                   "subGroupExclusiveTopology", "subGroupPolicy", "terminationGracePeriodSeconds", "tolerations",
                   "volumes"}
CHART_CONTAINER_KEYS = {"args", "command", "env", "extraConfig", "image", "imagePullPolicy", "livenessProbe",
                        "modelCommand", "mountModelVolume", "name", "ports", "readinessProbe", "resources",
                        "securityContext", "startupProbe", "stdin", "tty", "volumeMounts", "workingDir"}
CHART_SCHEMA = json.loads((CRDS / "llm-d-modelservice.values.schema.json").read_text())


def plan_files() -> list[Path]:
    return sorted(PLANS.glob("*.json")) + sorted(ROOT.glob("examples/**/*.plan.json"))


CASES = [(p, row["rank"]) for p in plan_files() for row in json.loads(p.read_text())["plans"]]
IDS = [f"{p.stem}-r{r}" for p, r in CASES]


def doc_of(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def cluster_for(doc: dict[str, Any], rank: int) -> ClusterOptions | None:
    """An AMD plan needs --image for Dynamo (refused otherwise: test_dynamo_refuses_amd_without_an_image)."""
    row = next(r for r in doc["plans"] if r["rank"] == rank)
    amd = any(p["gpu"] in ("mi300x", "mi325x", "mi355x") or p["gpu"].startswith("mi") for p in row["pools"])
    return ClusterOptions(image=ROCM_DYNAMO) if amd else None


def render(path: Path, rank: int, fmt: str = "platforms", **kw: Any) -> dict[str, str]:
    if not kw:
        return dict(_render_default(path, rank, fmt))
    doc = doc_of(path)
    kw.setdefault("cluster", cluster_for(doc, rank))
    return render_deploy(load_plan(doc), rank=rank, formats=fmt, **kw)


@functools.lru_cache(maxsize=None)
def _render_default(path: Path, rank: int, fmt: str) -> tuple[tuple[str, str], ...]:
    """Rendered once per (plan, rank, formats): several tests read the same files."""
    doc = doc_of(path)
    return tuple(render_deploy(load_plan(doc), rank=rank, formats=fmt, cluster=cluster_for(doc, rank)).items())


def yaml_docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def unescape(arg: str) -> str:
    """Undo Kubernetes' ``$$`` escape (what the container receives)."""
    return arg.replace("$$", "$")


def row_of(doc: dict[str, Any], rank: int) -> dict[str, Any]:
    return next(r for r in doc["plans"] if r["rank"] == rank)


# --------------------------------------------------------------------------- the validator itself


def test_the_validator_rejects_what_the_api_server_rejects() -> None:
    """Hand-made documents, one fault each: the converted schema must see every one (else 'valid' means nothing)."""
    good = {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool", "metadata": {"name": "p"},
            "spec": {"selector": {"matchLabels": {"a": "b"}}, "targetPorts": [{"number": 8000}],
                     "endpointPickerRef": {"name": "epp", "port": {"number": 9002}}}}
    assert crd_schema.errors_of(good) == []
    faults = {
        "unknown field": lambda d: d["spec"].__setitem__("targetPortNumber", 8000),
        "missing required": lambda d: d["spec"].pop("targetPorts"),
        "wrong type": lambda d: d["spec"]["targetPorts"][0].__setitem__("number", "8000"),
        "enum": lambda d: d["spec"]["endpointPickerRef"].__setitem__("failureMode", "Open"),
        "maximum": lambda d: d["spec"]["targetPorts"][0].__setitem__("number", 70000),
        "bad name": lambda d: d["metadata"].__setitem__("name", "Bad_Name"),
        "unknown metadata field": lambda d: d["metadata"].__setitem__("nam", "x"),
        "other version": lambda d: d.__setitem__("apiVersion", "inference.networking.k8s.io/v1alpha2"),
    }
    for what, fault in faults.items():
        d = copy.deepcopy(good)
        fault(d)
        try:
            assert crd_schema.errors_of(d), what
        except KeyError:  # no stored CRD for that apiVersion: refused as well
            assert what == "other version"
    # x-kubernetes-int-or-string (LWS maxSurge), list-type=map (DisaggregatedSet roles keyed by name)
    ds = yaml_docs(render(DISAGG, 1, "disaggregatedset")["disaggregatedset.yaml"])[1]
    ds["spec"]["roles"][0]["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]["maxSurge"] = "25%"
    assert crd_schema.errors_of(ds) == []
    ds["spec"]["roles"][1]["name"] = ds["spec"]["roles"][0]["name"]
    assert any("duplicate" in e for e in crd_schema.errors_of(ds))


@pytest.mark.slow  # parses 8 MB of CRD YAML
def test_stored_schemas_match_the_shared_crds_when_present() -> None:
    """tests/data/crds/*.schema.json are what extract.py makes of ../shared/reference/crds (sha256 of each source)."""
    if not (SHARED_CRDS / "SOURCES.json").exists():
        pytest.skip("../shared/reference/crds is not here; the stored copies carry their sha256")
    import importlib.util

    spec = importlib.util.spec_from_file_location("extract", CRDS / "extract.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sources = {e["file"]: e for e in json.loads((SHARED_CRDS / "SOURCES.json").read_text())}
    for name in mod.VERSIONS:
        stored = (CRDS / mod.out_name(name)).read_text()
        assert stored == mod.extract(SHARED_CRDS, name, sources), name
        assert json.loads(stored)["source"]["sha256"] == sources[name]["sha256"]
    chart = (CRDS / "llm-d-modelservice.values.schema.json").read_bytes()
    assert hashlib.sha256(chart).hexdigest() == sources["helm/llm-d-modelservice.values.schema.json"]["sha256"]


# --------------------------------------------------------------------------- every plan, every target


@pytest.mark.parametrize(("path", "rank"), CASES, ids=IDS)
def test_every_target_validates_against_its_schema(path: Path, rank: int) -> None:
    files = render(path, rank)
    assert sorted(files) == sorted(f for fmt in PLATFORM_FORMATS for f in FILES[fmt])
    seen: list[str] = []
    for name, text in files.items():
        if name == "llm-d-values.yaml":
            continue
        docs = yaml_docs(text)
        for d in docs:
            if (d["apiVersion"], d["kind"]) in crd_schema.KINDS:
                assert crd_schema.errors_of(d) == [], (name, d["kind"])
                seen.append(d["kind"])
            else:  # core objects beside the set (PVC, Service, router RBAC and Deployment)
                kubernetes_validate.validate(d, kubernetes_validate.latest_version(), strict=True)
    pd = row_of(doc_of(path), rank)["disaggregated"]
    assert sorted(seen) == sorted(["LLMInferenceService", "InferencePool", "DynamoGraphDeployment",
                                   "DisaggregatedSet" if pd else "LeaderWorkerSet"])
    values = yaml.safe_load(files["llm-d-values.yaml"])
    jsonschema.Draft7Validator(CHART_SCHEMA).validate(values)
    jsonschema.Draft7Validator(strict_schema(CHART_SCHEMA)).validate(values)
    for role in ("decode", "prefill"):
        assert set(values[role]) <= CHART_ROLE_KEYS, role
        for c in values[role].get("containers", []):
            assert set(c) <= CHART_CONTAINER_KEYS, role


def strict_schema(schema: Any) -> Any:
    """The chart schema with unknown keys refused wherever it lists properties and says nothing of others."""
    if isinstance(schema, dict):
        out = {k: strict_schema(v) for k, v in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict_schema(x) for x in schema]
    return schema


def closed_keys(obj: Any, node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Paths of every key the schema pins down (its node lists properties and is not open to others)."""
    if not isinstance(node, dict):
        return
    if isinstance(obj, dict):
        props = node.get("properties") or {}
        closed = props and "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields")
        for key, value in obj.items():
            if closed and key in props:
                yield path + (key,)
            sub = props.get(key) if key in props else node.get("additionalProperties")
            yield from closed_keys(value, sub, path + (key,))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            yield from closed_keys(value, node.get("items"), path + (i,))


def renamed(obj: dict[str, Any], path: tuple[Any, ...]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    parent: Any = out
    for p in path[:-1]:
        parent = parent[p]
    parent[str(path[-1]) + "Renamed"] = parent.pop(path[-1])
    return out


@pytest.mark.parametrize("path", [AGG, DISAGG], ids=["agg", "pd"])
def test_renaming_any_pinned_field_fails_the_schema(path: Path) -> None:
    """Every key our objects set where the CRD lists the fields: renamed, the document fails (x-kubernetes
    preserve-unknown-fields / additionalProperties nodes are open, as the API server treats them)."""
    files = render(path, 1)
    objs = [d for name, text in files.items() if name != "llm-d-values.yaml" for d in yaml_docs(text)
            if (d["apiVersion"], d["kind"]) in crd_schema.KINDS]
    checked = 0
    for obj in objs:
        doc, _ = crd_schema.crd(crd_schema.KINDS[(obj["apiVersion"], obj["kind"])])
        paths = [p for p in closed_keys(obj, doc["openAPIV3Schema"]) if p[0] not in ("apiVersion", "kind", "metadata")]
        assert paths, obj["kind"]
        for p in paths:
            assert crd_schema.errors_of(renamed(obj, p)), (obj["kind"], p)
            checked += 1
    assert checked > 50  # the objects are not mostly open maps
    values = yaml.safe_load(files["llm-d-values.yaml"])
    strict = jsonschema.Draft7Validator(strict_schema(CHART_SCHEMA))
    for top in ("modelArtifacts", "routing"):
        for key in values[top]:
            bad = renamed(values, (top, key))
            assert list(strict.iter_errors(bad)) or key in ("labels",), (top, key)


# --------------------------------------------------------------------------- what vLLM is told


def platform_lines(files: dict[str, str]) -> dict[str, dict[str, list[str]]]:
    """target -> role -> the argv after ``vllm serve`` that the platform will run (its own part rebuilt)."""
    out: dict[str, dict[str, list[str]]] = {t: {} for t in PLATFORM_FORMATS}
    ks = yaml_docs(files["kserve.yaml"])[0]["spec"]
    pools = [("prefill", ks["prefill"]), ("decode", ks)] if "prefill" in ks else [("both", ks)]
    for role, part in pools:
        main = part["template"]["containers"][0]
        assert main["name"] == "main"
        flags = [w for a in main["args"] for w in shlex.split(unescape(a))]  # the preset's eval undoes the quoting
        assert len(flags) == len(main["args"])  # each arg stays one word through the eval
        out["kserve"][role] = ["/mnt/models", "--served-model-name", ks["model"]["name"], "--port", "8000",
                               "--tensor-parallel-size", str(part["parallelism"]["tensor"]), *flags]
    values = yaml.safe_load(files["llm-d-values.yaml"])
    model = values["modelArtifacts"]["uri"].removeprefix("hf://")
    for role in ("prefill", "decode"):
        r = values[role]
        if not r.get("create"):
            continue
        c = r["containers"][0]
        assert c["modelCommand"] == "vllmServe"
        tp = r["parallelism"]["tensor"]
        # the chart's vllmServeModelCommand (_helpers.tpl at 3051935e) also writes --data-parallel-size and
        # --data-parallel-size-local from parallelism.data / .dataLocal when > 1
        dp, dpl = r["parallelism"].get("data", 1), r["parallelism"].get("dataLocal", 1)
        port = values["routing"]["proxy"]["targetPort"] if role == "decode" and values["routing"]["proxy"]["enabled"] \
            else values["routing"]["servicePort"]
        key = role if values["prefill"].get("create") else "both"
        out["llm-d"][key] = [model, "--port", str(port), *(["--tensor-parallel-size", str(tp)] if tp > 1 else []),
                             *(["--data-parallel-size", str(dp)] if dp > 1 else []),
                             *(["--data-parallel-size-local", str(dpl)] if dpl > 1 else []),
                             "--served-model-name", values["modelArtifacts"]["name"], *map(unescape, c["args"])]
    dgd = yaml_docs(files["dynamo.yaml"])[0]["spec"]
    assert dgd["backendFramework"] == "vllm"
    for comp in dgd["components"]:
        if comp["type"] == "frontend":
            continue
        main = comp["podTemplate"]["spec"]["containers"][0]
        assert main["command"] == ["python3", "-m", "dynamo.vllm"]
        args = [unescape(a) for a in main["args"]]
        assert args[0] == "--model"
        role = {"worker": "both", "prefill": "prefill", "decode": "decode"}[comp["type"]]
        if role != "both":
            assert args[-2:] == ["--disaggregation-mode", role]
            args = args[:-2]
        out["dynamo"][role] = [args[1], *args[2:]]
    for d in yaml_docs(files["disaggregatedset.yaml"]):
        if d["kind"] == "DisaggregatedSet":
            for r in d["spec"]["roles"]:
                c = r["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
                out["disaggregatedset"][r["name"]] = [unescape(a) for a in c["args"]]
        elif d["kind"] == "LeaderWorkerSet":
            c = d["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
            out["disaggregatedset"]["both"] = [unescape(a) for a in c["args"]]
    return out


@pytest.mark.parametrize(("path", "rank"), CASES, ids=IDS)
def test_every_target_runs_the_plans_vllm_settings(path: Path, rank: int) -> None:
    doc = doc_of(path)
    roles = [p["role"] for p in row_of(doc, rank)["pools"]]
    lines = platform_lines(render(path, rank))
    wl = doc["workload"]
    for target, by_role in lines.items():
        assert sorted(by_role) == sorted(roles), target
        for role, argv in by_role.items():
            parsed = check_serve_args(argv)  # the project's vLLM 0.33 flag check, on the whole line
            if target == "llm-d":  # the chart omits --tensor-parallel-size for TP1, vLLM's default
                parsed.setdefault("tensor_parallel_size", 1)
            exp = expected_settings(doc, rank, role)
            if target in ("kserve", "llm-d"):  # one served name: the platform's spec.model.name / modelArtifacts.name
                exp["served_model_name"] = [wl["hf_repo"]]
            if target == "kserve":  # the storage initializer downloads hf://<model> to /mnt/models
                assert yaml_docs(render(path, rank, "kserve")["kserve.yaml"])[0]["spec"]["model"]["uri"] == \
                    "hf://" + exp["model_tag"]
                exp["model_tag"] = "/mnt/models"
            assert_settings(parsed, exp, f"{target} {role}")


@pytest.mark.parametrize(("path", "rank"), [c for c in CASES if row_of(doc_of(c[0]), c[1])["disaggregated"]],
                         ids=[i for c, i in zip(CASES, IDS) if row_of(doc_of(c[0]), c[1])["disaggregated"]])
def test_pd_outputs_keep_roles_replicas_tp_and_the_kv_connector(path: Path, rank: int) -> None:
    """Replicas and TP from the plan JSON; the KV connector equal to the one the k8s vllm serve lines carry."""
    doc = doc_of(path)
    pools = {p["role"]: p for p in row_of(doc, rank)["pools"]}
    files = render(path, rank, "k8s,platforms")
    k8s_kv = {}
    for d in yaml_docs(files["k8s.yaml"]):
        if d["kind"] == "Deployment" and d["metadata"]["labels"]["app.kubernetes.io/component"] in pools:
            argv = d["spec"]["template"]["spec"]["containers"][0]["args"]
            k8s_kv[d["metadata"]["labels"]["app.kubernetes.io/component"]] = check_serve_args(argv)["kv_transfer_config"]
    assert sorted(k8s_kv) == ["decode", "prefill"]
    assert k8s_kv["prefill"]["kv_connector"] == k8s_kv["decode"]["kv_connector"] == "NixlConnector"
    dgd = yaml_docs(files["dynamo.yaml"])[0]["spec"]["components"]
    workers = {c["type"]: c for c in dgd if c["type"] in ("prefill", "decode")}
    assert [c["type"] for c in dgd] == ["frontend", "prefill", "decode"]
    ds = next(d for d in yaml_docs(files["disaggregatedset.yaml"]) if d["kind"] == "DisaggregatedSet")
    roles = {r["name"]: r["spec"] for r in ds["spec"]["roles"]}
    assert list(roles) == ["prefill", "decode"]
    lines = platform_lines(files)
    for role, pool in pools.items():
        gpu = "amd.com/gpu" if pool["gpu"].startswith("mi") else "nvidia.com/gpu"
        w = workers[role]
        assert w["replicas"] == pool["replicas"]
        assert w["podTemplate"]["spec"]["containers"][0]["resources"]["limits"][gpu] == str(pool["tp"] * pool.get("data_parallel_size", 1))
        r = roles[role]
        assert r["replicas"] == pool["replicas"] and r["leaderWorkerTemplate"]["size"] == 1
        assert r["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["resources"]["limits"][gpu] == str(pool["tp"] * pool.get("data_parallel_size", 1))
        for target in ("dynamo", "disaggregatedset", "kserve", "llm-d"):
            parsed = check_serve_args(lines[target][role])
            assert parsed.get("tensor_parallel_size", 1) == pool["tp"], target
            assert parsed["kv_transfer_config"] == k8s_kv[role], target
    ks = yaml_docs(files["kserve.yaml"])[0]["spec"]
    assert (ks["prefill"]["replicas"], ks["replicas"]) == (pools["prefill"]["replicas"], pools["decode"]["replicas"])
    values = yaml.safe_load(files["llm-d-values.yaml"])
    assert (values["prefill"]["replicas"], values["decode"]["replicas"]) == (pools["prefill"]["replicas"], pools["decode"]["replicas"])
    assert values["routing"]["proxy"]["enabled"] is True


def test_gpu_selection_is_the_kubernetes_rule_in_every_target() -> None:
    """The node affinity (and the user's node selector / tolerations) of k8s.yaml's engine pods, unchanged."""
    cluster = ClusterOptions(node_selector=(("pool", "gpu-a"),), tolerations=({"key": "nvidia.com/gpu", "operator": "Exists"},))
    files = render(DISAGG, 1, "k8s,platforms", cluster=cluster)
    want = {}
    for d in yaml_docs(files["k8s.yaml"]):
        if d["kind"] == "Deployment" and "vllm" == d["metadata"]["labels"]["app.kubernetes.io/name"]:
            pod = d["spec"]["template"]["spec"]
            want[d["metadata"]["labels"]["app.kubernetes.io/component"]] = {k: pod[k] for k in ("affinity", "nodeSelector", "tolerations")}
    assert want["prefill"]["affinity"]["nodeAffinity"]  # the H200 product label
    pick = lambda pod: {k: pod[k] for k in ("affinity", "nodeSelector", "tolerations")}  # noqa: E731
    ks = yaml_docs(files["kserve.yaml"])[0]["spec"]
    assert pick(ks["template"]) == want["decode"] and pick(ks["prefill"]["template"]) == want["prefill"]
    values = yaml.safe_load(files["llm-d-values.yaml"])
    assert pick(values["decode"]["extraConfig"]) == want["decode"] and pick(values["prefill"]["extraConfig"]) == want["prefill"]
    # the chart requests parallelism.tensor GPUs of accelerator.resources[type] (values.yaml: nvidia -> nvidia.com/gpu)
    assert values["accelerator"]["type"] == "nvidia" and values["prefill"]["parallelism"]["tensor"] == 2
    assert "nvidia.com/gpu" not in values["prefill"]["containers"][0]["resources"]["requests"]
    for c in yaml_docs(files["dynamo.yaml"])[0]["spec"]["components"][1:]:
        assert pick(c["podTemplate"]["spec"]) == want[c["type"]]
    ds = next(d for d in yaml_docs(files["disaggregatedset.yaml"]) if d["kind"] == "DisaggregatedSet")
    for r in ds["spec"]["roles"]:
        assert pick(r["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]) == want[r["name"]]


def test_hf_token_only_from_the_secret() -> None:
    files = render(DISAGG, 1)
    for name, text in files.items():
        for env in find_key(yaml.safe_load_all(text), "env"):
            for e in env:
                if e["name"] == "HF_TOKEN":
                    assert "value" not in e and e["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token", "optional": True}, name
    assert "authSecretName" not in yaml.safe_load(files["llm-d-values.yaml"])["modelArtifacts"]


def find_key(docs: Any, key: str) -> Iterator[Any]:
    for d in docs:
        stack = [d]
        while stack:
            x = stack.pop()
            if isinstance(x, dict):
                if key in x:
                    yield x[key]
                stack.extend(x.values())
            elif isinstance(x, list):
                stack.extend(x)


# --------------------------------------------------------------------------- refusals, hostile strings, CLI


def test_dynamo_refuses_amd_without_an_image() -> None:
    with pytest.raises(DeployError) as e:
        render(PLANS / "amd-qwen7b-mi300x.json", 1, "dynamo", cluster=None)
    assert "--image" in str(e.value) and "\n" not in str(e.value)
    files = render(PLANS / "amd-qwen7b-mi300x.json", 1, "dynamo", cluster=ClusterOptions(image=ROCM_DYNAMO))
    main = yaml_docs(files["dynamo.yaml"])[0]["spec"]["components"][1]["podTemplate"]["spec"]["containers"][0]
    assert main["image"] == ROCM_DYNAMO and main["resources"]["limits"] == {"amd.com/gpu": "1"}
    values = yaml.safe_load(render(PLANS / "amd-qwen7b-mi300x.json", 1, "llm-d")["llm-d-values.yaml"])
    assert values["accelerator"]["type"] == "amd"  # chart values.yaml: amd -> amd.com/gpu


def test_local_model_paths_are_refused_where_the_platform_downloads_from_hf() -> None:
    for fmt in ("kserve", "llm-d"):
        with pytest.raises(DeployError) as e:
            render(AGG, 1, fmt, checkpoint="/models/llama-70b")
        assert "local path" in str(e.value) and "\n" not in str(e.value)
    assert render(AGG, 1, "dynamo,disaggregatedset", checkpoint="/models/llama-70b")  # they take a path


def test_platforms_are_not_part_of_all() -> None:
    assert normalise_formats("all") == ("cmd", "k8s", "helm")
    assert normalise_formats("platforms") == PLATFORM_FORMATS
    assert normalise_formats("llm-d,kserve") == ("kserve", "llm-d")
    with pytest.raises(DeployError) as e:
        normalise_formats("kserv")
    assert "kserve" in str(e.value)


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_free_text_never_expands_in_any_target(hostile: str) -> None:
    doc = doc_of(DISAGG)
    doc["workload"].update(model=hostile or "m", name=hostile, source=hostile, hf_repo="org/model")
    doc["plans"][0]["id"] = hostile or "id"
    try:
        plan = load_plan(doc)
    except ConfigError as e:  # the plan reader refuses non-printable names first (round-3 hostile input)
        assert "printable" in str(e) and "\n" not in str(e)
        return
    try:
        files = render_deploy(plan, rank=1, formats="platforms", plan_name=hostile or None)
    except DeployError as e:
        assert "control characters" in str(e) and "\n" not in str(e)
        return
    for name, text in files.items():
        docs = list(yaml.safe_load_all(text))
        for args in find_key(docs, "args"):
            for a in args:
                allowed = ["POD_NAMESPACE"] * len(k8s_expansions(a)) if "$(POD_NAMESPACE)" in a else []
                assert k8s_expansions(a) == allowed, (name, a)
        for env in find_key(docs, "env"):
            for e in env:
                assert k8s_expansions(str(e.get("value", ""))) == [], name
        for d in docs:
            if isinstance(d, dict) and (d.get("apiVersion"), d.get("kind")) in crd_schema.KINDS:
                assert crd_schema.errors_of(d) == [], (name, d["kind"])
        for labels in find_key(docs, "labels"):
            for v in labels.values():
                assert isinstance(v, str) and len(v) <= 63 and (v == "" or v[0].isalnum()), (name, v)
    lines = platform_lines(files)
    for target, by_role in lines.items():
        for argv in by_role.values():
            assert hostile not in argv or hostile in ("org/model",), target


def test_kserve_args_survive_the_presets_eval(tmp_path: Path) -> None:
    """The preset runs `eval "exec vllm serve /mnt/models ... $@"`: run that in bash with a fake vllm that
    records its argv, and compare with the flags we meant."""
    import os
    import shutil
    import subprocess
    import sys

    if shutil.which("bash") is None:
        pytest.skip("no bash")
    fake = tmp_path / "vllm"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    fake.chmod(0o755)
    main = yaml_docs(render(DISAGG, 1, "kserve")["kserve.yaml"])[0]["spec"]["template"]["containers"][0]
    args = [unescape(a) for a in main["args"]]
    env = {"PATH": f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}"}
    out = subprocess.run(["bash", "-c", 'eval "exec vllm serve /mnt/models $@"', "--", *args], env=env,
                         capture_output=True, text=True, timeout=30, check=True).stdout
    words = json.loads(out)
    assert words[:2] == ["serve", "/mnt/models"]
    assert words[2:] == [shlex.split(a)[0] for a in args]
    assert json.loads(words[words.index("--kv-transfer-config") + 1])["kv_role"] == "kv_consumer"


def test_cli_writes_and_prints_each_target(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "out"
    res = runner.invoke(app, ["deploy", str(DISAGG), "--format", "platforms", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == sorted(
        f for fmt in PLATFORM_FORMATS for f in FILES[fmt])
    res = runner.invoke(app, ["deploy", str(DISAGG), "--format", "kserve"])
    assert res.exit_code == 0 and "kind: LLMInferenceService" in res.output
    res = runner.invoke(app, ["deploy", str(PLANS / "amd-qwen7b-mi300x.json"), "--format", "dynamo"])
    assert res.exit_code != 0 and "--image" in res.output and "Traceback" not in res.output


def test_platforms_leave_out_a_target_that_cannot_run_the_plan_and_say_why(tmp_path: Path) -> None:
    """'platforms' on an AMD plan without --image: KServe, llm-d and the DisaggregatedSet are written, Dynamo (whose
    default image is built for CUDA) is left out with one note on stderr; named alone it is still refused."""
    out = tmp_path / "amd"
    res = CliRunner().invoke(app, ["deploy", str(PLANS / "amd-qwen7b-mi300x.json"), "--format", "platforms", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == sorted(
        f for fmt in PLATFORM_FORMATS if fmt != "dynamo" for f in FILES[fmt])
    notes = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(notes) == 1 and notes[0].startswith("note: dynamo not written: ") and "--image" in notes[0], res.stderr
    with pytest.raises(DeployError, match="--image"):  # named beside the group: refused
        render(PLANS / "amd-qwen7b-mi300x.json", 1, "platforms,dynamo", cluster=None)


def test_a_group_whose_every_output_refuses_the_plan_raises_the_first_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    import recommender.deploy as deploy

    def refuse(name: str) -> Any:
        def render_one(spec: Any) -> dict[str, str]:
            raise DeployError(f"{name}: cannot run this plan")
        return render_one

    monkeypatch.setattr(deploy, "_RENDERERS", {f: refuse(f) for f in ("cmd", "k8s", "helm")})
    told: list[str] = []
    with pytest.raises(DeployError, match="^cmd: cannot run this plan$"):
        render_deploy(load_plan(PLANS / "agg-llama70b-h100.json"), rank=1, formats="all", on_skip=lambda f, why: told.append(f))
    assert told == []


def test_emit_writes_the_named_targets(tmp_path: Path) -> None:
    out = tmp_path / "emit"
    res = CliRunner().invoke(app, ["--workload", str(ROOT / "examples" / "chat.yaml"), "--policy",
                                   str(Path(__file__).parent / "data" / "policies" / "tiny-search.yaml"),
                                   "--verify", "0", "--format", "json", "--emit", str(out), "--targets", "cmd,kserve"])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["kserve.yaml", "plan.json", "vllm-serve.sh"]
    ks = yaml_docs((out / "kserve.yaml").read_text())[0]
    assert crd_schema.errors_of(ks) == []


def test_emit_targets_are_checked_before_the_search() -> None:
    res = CliRunner().invoke(app, ["--model", "llama-3.1-8b", "--rate", "1", "--prompt-tokens", "100",
                                   "--output-tokens", "10", "--emit", "x", "--targets", "kserv"])
    assert res.exit_code != 0 and "unknown deploy format 'kserv'" in res.output


def test_cluster_options_reach_the_platform_objects() -> None:
    cluster = ClusterOptions(namespace="llm", image="registry.example.com/vllm:v0.33.0")
    files = render(AGG, 1, "platforms", cluster=cluster)
    for name, text in files.items():
        if name == "llm-d-values.yaml":
            v = yaml.safe_load(text)
            assert v["decode"]["containers"][0]["image"] == cluster.image
            continue
        for d in yaml_docs(text):
            assert d["metadata"].get("namespace") == "llm", (name, d["kind"])
    for images in find_key(yaml_docs(files["kserve.yaml"]) + yaml_docs(files["dynamo.yaml"]), "image"):
        assert images == cluster.image
    assert dataclasses.replace(cluster, image=None).image is None


# --------------------------------------------------------------------------- KEDA (issue #25 item 4)


def keda_cases() -> list[tuple[Path, int]]:
    """Rows with a rate and modelled mean latencies (the rule's inputs); offline jobs are refused below."""
    out = []
    for p, r in CASES:
        doc = doc_of(p)
        row = row_of(doc, r)
        if doc["workload"].get("arrival_rate_per_s") and (row.get("latency_percentiles") or {}).get("e2e"):
            out.append((p, r))
    return out


@pytest.mark.parametrize(("path", "rank"), keda_cases(), ids=[f"{p.stem}-r{r}" for p, r in keda_cases()])
def test_keda_scaled_objects_validate_and_follow_the_plan(path: Path, rank: int) -> None:
    doc = doc_of(path)
    row = row_of(doc, rank)
    files = render(path, rank, "k8s,keda")
    objs = yaml_docs(files["keda.yaml"])
    deployments = {d["metadata"]["name"]: d for d in yaml_docs(files["k8s.yaml"]) if d["kind"] == "Deployment"}
    assert len(objs) == len(row["pools"])
    lat = row["latency_percentiles"]
    rate = doc["workload"]["arrival_rate_per_s"]
    for obj, pool in zip(objs, row["pools"]):
        assert crd_schema.errors_of(obj) == []
        s = obj["spec"]
        target = deployments[s["scaleTargetRef"]["name"]]  # a Deployment of k8s.yaml
        assert target["spec"]["replicas"] == pool["replicas"] == s["fallback"]["replicas"]
        wait = {"both": lat["e2e"]["mean"], "prefill": lat["ttft"]["mean"],
                "decode": lat["e2e"]["mean"] - lat["ttft"]["mean"]}[pool["role"]]
        # Little's law at the modelled point, at most a replica's sequences: max_num_seqs on each data-parallel rank
        want = min(rate / pool["replicas"] * wait, pool["max_num_seqs"] * pool.get("data_parallel_size", 1))
        trig = s["triggers"][0]
        assert trig["type"] == "prometheus" and trig["metricType"] == "AverageValue"
        assert float(trig["metadata"]["threshold"]) == pytest.approx(want, abs=0.005)
        assert "vllm:num_requests_running" in trig["metadata"]["query"] and "vllm:num_requests_waiting" in trig["metadata"]["query"]
        assert f'pod=~"{target["metadata"]["name"]}-.*"' in trig["metadata"]["query"]
        assert s["minReplicaCount"] == max(1, -(-pool["replicas"] * row["load_utilisation"] // 1))
        assert s["maxReplicaCount"] == 2 * pool["replicas"]
        startup = target["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
        window = min(startup["periodSeconds"] * startup["failureThreshold"], 1800)
        assert s["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == window


def test_keda_rag_rank1_by_hand() -> None:
    """examples/plans/rag.plan.json rank 1, by the module's formulas on the file's own numbers: threshold =
    rate / replicas x mean E2E (rag: 4 / 4 x 14.754 s = 14.75 when the plan has 4 replicas and that E2E);
    min = ceil(replicas x load_utilisation); max = 2 x replicas; scale-down window = ceil((300 s + checkpoint
    bytes / 150 MB/s) / 10) x 10, capped at 1800 s."""
    import math

    path = ROOT / "examples" / "plans" / "rag.plan.json"
    row = json.loads(path.read_text())["plans"][0]
    (pool,) = row["pools"]
    n, e2e, util = pool["replicas"], row["latency_percentiles"]["e2e"]["mean"], row["load_utilisation"]
    from recommender.deploy import build_spec

    spec = build_spec(str(path), 1)
    obj = yaml_docs(render(path, 1, "keda")["keda.yaml"])[0]["spec"]
    assert float(obj["triggers"][0]["metadata"]["threshold"]) == pytest.approx(min(4.0 / n * e2e, pool["max_num_seqs"]),
                                                                             abs=0.005)
    assert (obj["minReplicaCount"], obj["maxReplicaCount"]) == (math.ceil(n * util), 2 * n)
    window = min(1800, math.ceil((300 + spec.pools[0].checkpoint_bytes / 150e6) / 10) * 10)
    assert obj["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == window


def test_keda_refuses_what_it_cannot_derive() -> None:
    with pytest.raises(DeployError) as e:
        render(ROOT / "examples" / "plans" / "batch-summarization.plan.json", 1, "keda")
    assert "offline" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(DeployError) as e:  # hand-written fixture: no latency_percentiles
        render(DISAGG, 1, "keda")
    assert "latency" in str(e.value) and "\n" not in str(e.value)


def test_a_longer_startup_never_shortens_the_scale_down_window_nor_moves_min_or_threshold() -> None:
    from recommender.deploy.keda import plan_autoscaler, scaled_object
    from recommender.deploy.spec import build_spec

    spec = build_spec(load_plan(ROOT / "examples" / "plans" / "rag.plan.json"), 1)
    window = lambda s: s["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"]  # noqa: E731
    seen = []
    for nbytes in (16e9, 141.1e9, 400e9):  # 8B bf16, 70B bf16, 405B fp8 checkpoints: longer download + load
        slow = dataclasses.replace(spec, pools=tuple(dataclasses.replace(p, checkpoint_bytes=nbytes) for p in spec.pools))
        seen.append(scaled_object(slow, slow.pools[0], plan_autoscaler(slow, slow.pools[0]))["spec"])
    assert [window(s) for s in seen] == [410, 1250, 1800]  # ceil((300 + B / 150 MB/s) / 10) x 10, capped at 1800
    assert len({(s["minReplicaCount"], s["triggers"][0]["metadata"]["threshold"]) for s in seen}) == 1


def test_the_docs_show_what_deploy_writes() -> None:
    """Every YAML block of docs/deploy-targets.md after a `recommend deploy ...` command is that command's output
    (the docs trim metadata labels and annotations, and show one object of a multi-object file)."""
    text = (ROOT / "docs" / "deploy-targets.md").read_text()
    command: list[str] | None = None
    checked = 0
    for part in text.split("```"):
        if part.startswith("yaml\n"):
            if command is None or "roles:" in part.split("\n", 2)[1]:  # the hand-drawn P/D sketch
                continue
            rendered = CliRunner().invoke(app, ["deploy", *command])
            assert rendered.exit_code == 0, rendered.output
            actual = [d for d in yaml.safe_load_all(rendered.output.replace("# ==> llm-d-inferencepool.yaml <==", "---"))
                      if isinstance(d, dict)]
            for shown in yaml_docs(part[len("yaml\n"):]):
                kind = shown.get("kind")
                match = next(d for d in actual if d.get("kind") == kind and ("kind" in d or "modelArtifacts" in d)) \
                    if kind else next(d for d in actual if "modelArtifacts" in d)
                for d in (shown, match):
                    if "metadata" in d:
                        d["metadata"] = {"name": d["metadata"]["name"]}
                assert shown == match, (command, kind)
                checked += 1
        else:
            cmds = [c for c in part.split("`") if c.startswith("recommend deploy ")]
            if cmds:
                command = shlex.split(cmds[-1])[2:]
    assert checked >= 6
