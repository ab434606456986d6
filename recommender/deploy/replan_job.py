"""``recommend deploy PLAN --format replan-cronjob``: the re-planner as a Kubernetes CronJob next to the
model server (``replan-cronjob.yaml``, one multi-document stream for ``kubectl apply -f``).

Objects, in apply order:

* ServiceAccount ``<name>-replan`` and a Role + RoleBinding that may ``get`` the plan's engine
  Deployments and, with ``apply``, ``patch`` their ``deployments/scale`` (``resourceNames`` limit it to
  exactly those Deployments; a pool whose replica spans the trays of a GB200 rack runs as a LeaderWorkerSet:
  ``leaderworkersets`` and ``leaderworkersets/scale`` instead);
* ConfigMap ``<name>-replan-plan`` holding the plan JSON (the first run's ``--current``; the job passes
  ``--rank`` of the row deployed, so it compares traffic with that row);
* PersistentVolumeClaim ``<name>-replan-data`` (1 GiB, ReadWriteOnce): the SQLite history, the scrape
  state and ``/data/plan`` (the adopted plan and its deployment files, which later runs read as
  ``--current``). With a PostgreSQL history the URL comes from Secret ``history_secret`` (key ``url``)
  as env ``REPLAN_HISTORY_URL``; the volume still keeps the adopted plan;
* CronJob ``<name>-replan``: every ``schedule``, ``concurrencyPolicy: Forbid`` (runs never overlap; the
  history's per-deployment lock covers a manual run too), one try per run (``backoffLimit: 0``),
  ``recommend replan --current /plan/plan.json --rank N --out /data/plan --traffic TRAFFIC --selector ...
  --storage ... --format json --exit-zero-unless-error`` and, with ``apply``, ``--apply-to`` each engine
  Deployment. ``--exit-zero-unless-error``: the outcomes "changed" (10) and "not enough data" (11) end the Job
  Succeeded (the log's JSON keeps ``exit_code``), an error fails it.

The default traffic source is a Prometheus server scraping the engine pods, scoped with
``model_name="<served model name>"`` (vLLM's own label); every string from the plan or the user that
reaches ``args`` is escaped for Kubernetes (``$`` -> ``$$``).

The options are validated as what they are when built (:class:`ReplanJobOptions`): ``traffic`` an
``http(s)://`` /metrics URL or a ``prometheus+http(s)://`` server (no ``file://``, no blank, no whitespace
or control characters, no credentials in the URL), ``image`` an image reference (``registry/name:tag`` or
``@sha256:<64 hex>``, nothing else: no ``$(VAR)``, spaces or newlines), ``schedule`` five cron fields,
``selector`` one line, ``history_secret`` a Kubernetes object name. The header comment shows them escaped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml

from recommender.deploy.k8s import LWS_API_VERSION, NoAliasDumper, deployment_name, plan_annotations, plan_labels
from recommender.deploy.spec import DeploySpec, comment_lines, k8s_escape
from recommender.errors import DeployError
from recommender.httpread import parse_http_url, printable

DEFAULT_SCHEDULE = "*/5 * * * *"
DEFAULT_TRAFFIC = "prometheus+http://prometheus-operated.monitoring.svc:9090"
DEFAULT_IMAGE = "recommender:latest"  # the repository's Dockerfile (docs/docker.md); pin a digest in production
DATA_PATH = "/data"
PLAN_PATH = "/plan"
#: an OCI image reference: [host[:port]/]path[:tag][@sha256:digest] (the distribution spec's grammar, simplified)
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REF = re.compile(rf"^(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]{{1,5}})?/)?{_COMPONENT}(?:/{_COMPONENT})*"
                       rf"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?(?:@sha256:[0-9a-f]{{64}})?$")
_CRON_FIELD = re.compile(r"^[0-9A-Za-z*/,?-]{1,64}$")
_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def check_traffic_url(traffic: str, what: str = "--traffic") -> str:
    """A CronJob's traffic source: a ``prometheus+http(s)://`` server or an ``http(s)://`` /metrics URL."""
    t = traffic.strip()
    if not t:
        raise DeployError(f"{what} is blank; give the Prometheus server (prometheus+http://host:9090) or a vLLM "
                          f"/metrics URL the CronJob reads")
    url = t[len("prometheus+"):] if t.lower().startswith("prometheus+") else t
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme not in ("http", "https") or "\n" in t:
        raise DeployError(f"{what} '{printable(t)}': the CronJob reads traffic over HTTP only; give "
                          f"prometheus+http(s)://host:port or http(s)://pod:8000/metrics (no file:// or log paths)")
    try:
        parse_http_url(url, what)
    except Exception as e:  # noqa: BLE001 - ConfigError from the URL check, worded for deploy
        raise DeployError(str(e)) from None
    return t


@dataclass(frozen=True)
class ReplanJobOptions:
    """What the CronJob runs: schedule (cron syntax), traffic source, selector (PromQL label matchers;
    None = the plan's served model name), history (None = SQLite on the volume, else the name of a
    Secret whose key ``url`` holds a PostgreSQL URL), apply (patch replicas) and the image."""

    schedule: str = DEFAULT_SCHEDULE
    traffic: str = DEFAULT_TRAFFIC
    selector: str | None = None
    history_secret: str | None = None
    apply: bool = False
    image: str = DEFAULT_IMAGE

    def __post_init__(self) -> None:
        fields = self.schedule.split()
        if len(fields) != 5 or not all(_CRON_FIELD.fullmatch(f) for f in fields) or not self.schedule.isprintable():
            raise DeployError(f"--schedule '{printable(self.schedule)}' is not a five-field cron schedule; use e.g. "
                              f"'*/5 * * * *'")
        check_traffic_url(self.traffic)
        if self.traffic != self.traffic.strip():
            raise DeployError(f"--traffic '{printable(self.traffic)}' has leading or trailing whitespace")
        if not IMAGE_REF.fullmatch(self.image) or len(self.image) > 255:
            raise DeployError(f"--replan-image '{printable(self.image)}' is not an image reference "
                              f"(registry/name:tag or name@sha256:<64 hex>; no spaces, '$' or line breaks)")
        if self.selector is not None and (not self.selector.isprintable() or len(self.selector) > 1000):
            raise DeployError(f"--selector '{printable(self.selector)}' must be one printable line of at most 1000 "
                              f"characters")
        if self.history_secret is not None and not _DNS_NAME.fullmatch(self.history_secret):
            raise DeployError(f"--history-secret '{printable(self.history_secret)}' is not a Kubernetes object name "
                              f"(lowercase letters, digits, '-', '.')")


def _labels(spec: DeploySpec) -> dict[str, str]:
    """The plan's labels, but never ``app.kubernetes.io/name: vllm``: the P/D router discovers engine pods
    by name + instance, and must not find the re-planner's pods."""
    return {**plan_labels(spec, "replan"), "app.kubernetes.io/name": "recommender-replan"}


def _meta(name: str, spec: DeploySpec) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": _labels(spec), "annotations": plan_annotations(spec)}
    if spec.cluster.namespace:  # beside the model server (deploy --namespace)
        meta["namespace"] = spec.cluster.namespace
    return meta


def replan_args(spec: DeploySpec, opts: ReplanJobOptions) -> list[str]:
    """The ``recommend replan`` argv of the job's container (already escaped for Kubernetes): the deployed rank,
    and an exit code that fails the Job only on an error."""
    selector = opts.selector if opts.selector is not None else f'model_name="{spec.served_model_names[0]}"'
    storage = "$(REPLAN_HISTORY_URL)" if opts.history_secret else f"{DATA_PATH}/history.db"
    args = ["replan", "--current", f"{PLAN_PATH}/plan.json", "--rank", str(spec.rank), "--out", f"{DATA_PATH}/plan",
            "--traffic", k8s_escape(opts.traffic), "--storage", storage,
            "--state", f"{DATA_PATH}/metrics-state.json", "--format", "json", "--exit-zero-unless-error"]
    if opts.traffic.startswith("prometheus+") and selector:
        args += ["--selector", k8s_escape(selector)]
    if opts.apply:
        for pool in spec.pools:
            args += ["--apply-to", deployment_name(spec, pool)]
    return args


#: the API group of LeaderWorkerSets (a pool whose replica spans nodes runs as one in k8s.yaml)
LWS_GROUP = LWS_API_VERSION.split("/")[0]


def manifests(spec: DeploySpec, plan_json: str, opts: ReplanJobOptions) -> list[dict[str, Any]]:
    """All objects of the re-planner for ``spec`` (see the module docstring)."""
    name = f"{spec.name}-replan"
    rules: list[dict[str, Any]] = []
    for group, resource, multinode in (("apps", "deployments", False), (LWS_GROUP, "leaderworkersets", True)):
        engines = [deployment_name(spec, p) for p in spec.pools if (p.nodes_per_replica > 1) == multinode]
        if engines:
            rules.append({"apiGroups": [group], "resources": [resource], "resourceNames": engines, "verbs": ["get"]})
            if opts.apply:
                rules.append({"apiGroups": [group], "resources": [f"{resource}/scale"], "resourceNames": engines,
                              "verbs": ["get", "patch"]})
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(name, spec)}
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(name, spec), "rules": rules}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _meta(name, spec),
               "subjects": [{"kind": "ServiceAccount", "name": name}],
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}}
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(f"{name}-plan", spec),
              "data": {"plan.json": plan_json}}
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": _meta(f"{name}-data", spec),
           "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                    **({"storageClassName": spec.cluster.storage_class} if spec.cluster.storage_class else {})}}
    env: list[dict[str, Any]] = []
    if opts.history_secret:
        env.append({"name": "REPLAN_HISTORY_URL",
                    "valueFrom": {"secretKeyRef": {"name": opts.history_secret, "key": "url"}}})
    container = {
        "name": "replan", "image": opts.image, "command": ["recommend"], "args": replan_args(spec, opts),
        "env": env,
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
        "volumeMounts": [{"name": "plan", "mountPath": PLAN_PATH, "readOnly": True},
                         {"name": "data", "mountPath": DATA_PATH}],
    }
    pod = {"serviceAccountName": name, "restartPolicy": "Never", "containers": [container],
           "securityContext": {"fsGroup": 1000},
           "volumes": [{"name": "plan", "configMap": {"name": f"{name}-plan"}},
                       {"name": "data", "persistentVolumeClaim": {"claimName": f"{name}-data"}}]}
    cron = {
        "apiVersion": "batch/v1", "kind": "CronJob", "metadata": _meta(name, spec),
        "spec": {"schedule": opts.schedule, "concurrencyPolicy": "Forbid", "startingDeadlineSeconds": 120,
                 "successfulJobsHistoryLimit": 3, "failedJobsHistoryLimit": 3,
                 "jobTemplate": {"metadata": {"labels": _labels(spec)},
                                 "spec": {"backoffLimit": 0, "activeDeadlineSeconds": 600,
                                          "template": {"metadata": {"labels": _labels(spec)},
                                                       "spec": pod}}}},
    }
    return [account, role, binding, config, pvc, cron]


def render_replan_cronjob(spec: DeploySpec, plan_json: str, opts: ReplanJobOptions | None = None) -> dict[str, str]:
    """``replan-cronjob.yaml``: header comment + the objects."""
    opts = opts or ReplanJobOptions()
    what = "patches the engine Deployments' replicas within the policy" if opts.apply else \
        "writes the proposal to the volume (apply it yourself, or deploy with --apply)"
    header = "\n".join(comment_lines(spec)) + (
        f"\n# Re-planner: runs `recommend replan` on schedule '{printable(opts.schedule)}' against "
        f"{printable(opts.traffic)}; {what}."
        "\n# Apply with: kubectl apply -f replan-cronjob.yaml (in the namespace of the model server)\n")
    body = yaml.dump_all(manifests(spec, plan_json, opts), Dumper=NoAliasDumper, sort_keys=False,
                         default_flow_style=False, width=1_000_000)
    return {"replan-cronjob.yaml": header + "---\n" + body}
