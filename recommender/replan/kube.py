"""``recommend replan --apply-to NAME``: set the engine Deployments' replicas from inside the cluster.

Only a change between plans of the same shape (same GPU, TP, dtypes, limits: replica counts alone differ)
is applied, one ``deployments/scale`` merge patch ``{"spec": {"replicas": N}}`` per pool, in pool order (a pool
whose engine spans nodes, as the trays of a GB200 rack, runs as a LeaderWorkerSet: ``leaderworkersets/scale``, one
replica = one group);
the replica step was already capped by the policy. Any other change is a new deployment: it is written
(``--out``) but not applied, and the result says so.

In-cluster access as every Kubernetes client does it: API server at ``https://$KUBERNETES_SERVICE_HOST:
$KUBERNETES_SERVICE_PORT``, the ServiceAccount token, CA and namespace under
``/var/run/secrets/kubernetes.io/serviceaccount/``. ``RECOMMENDER_KUBE_API`` (a URL) overrides the
server for tests.
"""

from __future__ import annotations

import json
import os
import re
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Sequence

from recommender.errors import ConfigError, RecommenderError
from recommender.plan import Plan, Pool
from recommender.replan import plans

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class ApplyError(RecommenderError):
    """The Kubernetes API refused or could not be reached; the plan was not applied."""

    exit_code = 2


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")[:65536].strip()
    except OSError:
        return ""


def _api() -> tuple[str, dict[str, str], ssl.SSLContext | None, str]:
    """(base URL, headers, TLS context, namespace) of the in-cluster API server."""
    base = os.environ.get("RECOMMENDER_KUBE_API")
    namespace = os.environ.get("RECOMMENDER_KUBE_NAMESPACE") or _read(SA_DIR / "namespace") or "default"
    token = _read(SA_DIR / "token")
    if base is None:
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host or not token:
            raise ConfigError("--apply-to works inside a Kubernetes pod (no KUBERNETES_SERVICE_HOST or ServiceAccount "
                              "token here); run the re-planner as `recommend deploy PLAN --format replan-cronjob --apply`")
        base = f"https://{host}:{port}"
    ctx = None
    if base.startswith("https://"):
        ca = SA_DIR / "ca.crt"
        ctx = ssl.create_default_context(cafile=str(ca)) if ca.exists() else ssl.create_default_context()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return base.rstrip("/"), headers, ctx, namespace


#: where each kind of engine object has its scale subresource: (API path prefix, resource)
SCALE_TARGETS = {"Deployment": ("apis/apps/v1", "deployments"),
                 "LeaderWorkerSet": ("apis/leaderworkerset.x-k8s.io/v1", "leaderworkersets")}


def scale(name: str, replicas: int, *, kind: str = "Deployment", timeout_s: float = 10.0) -> None:
    """Merge-patch ``<kind's resource>/<name>/scale`` to ``replicas``."""
    base, headers, ctx, ns = _api()
    prefix, resource = SCALE_TARGETS[kind]
    url = f"{base}/{prefix}/namespaces/{ns}/{resource}/{name}/scale"
    body = json.dumps({"spec": {"replicas": int(replicas)}}).encode()
    req = urllib.request.Request(url, data=body, method="PATCH",
                                 headers={**headers, "Content-Type": "application/merge-patch+json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s, context=ctx) as resp:  # noqa: S310 (cluster API)
            resp.read(65536)
    except urllib.error.HTTPError as e:
        raise ApplyError(f"Kubernetes refused scaling {kind} {name} to {replicas} (HTTP {e.code} "
                         f"{e.reason}); check the re-planner's Role ({resource}/scale: patch)") from None
    except (urllib.error.URLError, OSError) as e:
        raise ApplyError(f"Kubernetes API at {base} unreachable ({getattr(e, 'reason', e)}); the plan was "
                         f"written but not applied") from None


def engine_kind(pool: Pool) -> str:
    """The object ``recommend deploy``'s k8s.yaml runs a pool as: a LeaderWorkerSet when a replica spans nodes
    (pipeline stages, or an engine over the trays of a GB200 / GB300 rack), else a Deployment."""
    from recommender.catalog import default_catalog

    nodes = default_catalog().gpu(pool.gpu).k8s_nodes(pool.tp * pool.data_parallel_size) * pool.pp
    return "LeaderWorkerSet" if nodes > 1 else "Deployment"


def apply_replicas(current: Plan, adopted: Plan, deployments: Sequence[str]) -> str:
    """Scale ``deployments`` (one per pool, in pool order) to ``adopted``'s replicas when the change is a
    same-shape one; returns what was done, in words."""
    old, new = current.top, adopted.top
    if not plans.same_shape(old, new):
        return (f"not applied: {plans.describe(adopted)} is a new deployment shape (not just replicas); "
                f"roll out the written files")
    for name in deployments:  # it becomes a path segment of the API URL: a Kubernetes object name only
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", name):
            raise ConfigError(f"--apply-to {name[:80]!r} is not a Deployment name (lowercase letters, digits, '-', '.')")
    counts = new.pool_replicas
    if len(counts) != len(deployments):
        raise ConfigError(f"--apply-to names {len(deployments)} Deployment(s) but the plan has {len(counts)} "
                          f"pool(s); name one per pool, in pool order (prefill, decode)")
    kinds = [engine_kind(p) for p in new.pools]
    for name, n, kind in zip(deployments, counts, kinds):
        scale(name, n, kind=kind)
    return "applied: " + ", ".join(f"{name} -> {n} replicas" + ("" if kind == "Deployment" else f" ({kind})")
                                   for name, n, kind in zip(deployments, counts, kinds))
