"""Deployment files for a plan: ``vllm serve`` scripts, Kubernetes manifests, production-stack Helm values,
and the platforms teams already run vLLM on (KServe, llm-d, NVIDIA Dynamo, LWS DisaggregatedSet).

``render_deploy`` returns file name -> text for one row of a typed :class:`~recommender.plan.Plan`; ``write_deploy_files``
writes them atomically. Both refuse undeployable plans with ``DeployError`` before anything is written,
and every emitted ``vllm serve`` argument list has been checked against vLLM 0.33's flag table.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from recommender.deploy.cluster import ClusterOptions, cluster_options
from recommender.deploy.disaggset import render_disaggset
from recommender.deploy.dynamo import render_dynamo
from recommender.deploy.gpus import GpuFacts, GpuLookup
from recommender.deploy.helm import render_helm
from recommender.deploy.k8s import render_k8s
from recommender.deploy.keda import render_keda
from recommender.deploy.kserve import render_kserve
from recommender.deploy.llmd import render_llmd
from recommender.deploy.spec import DeploySpec, build_spec
from recommender.deploy.vllm_cmd import VLLM_VERSION, render_cmd
from recommender.deploy.vllm_flags import VllmFlagError, check_serve_args
from recommender.deploy.writer import write_file_set
from recommender.errors import DeployError
from recommender.plan import Plan, load_plan

FORMATS = ("cmd", "k8s", "helm")
#: the platform targets (one renderer module each); 'platforms' names them all. Not part of 'all': a default
#: `deploy` keeps writing the three files it always wrote, and Dynamo refuses AMD pools without --image
PLATFORM_FORMATS = ("kserve", "llm-d", "dynamo", "disaggregatedset")
#: formats only rendered when named (not part of 'all'): the platforms, the KEDA autoscaler of k8s.yaml's Deployments,
#: the re-planner CronJob (deploy.replan_job), the vllm bench serve runs that check the deployment (deploy.bench)
EXTRA_FORMATS = (*PLATFORM_FORMATS, "keda", "replan-cronjob", "bench")
_RENDERERS = {"cmd": render_cmd, "k8s": render_k8s, "helm": render_helm, "kserve": render_kserve,
              "llm-d": render_llmd, "dynamo": render_dynamo, "disaggregatedset": render_disaggset, "keda": render_keda}
#: outputs that run one pod per replica: a plan whose replica spans nodes (pipeline stages, or an engine over
#: the trays of an NVL72 rack) is refused by name (``spec.refuse_multinode``); like any refusal of one output, it is
#: skipped, with its reason, when that output was asked for only through 'all' or 'platforms'
ONE_POD_FORMATS = ("helm", "kserve", "llm-d", "dynamo")
#: ``on_skip(format, reason)``: told of each output left out of a group ('all', 'platforms') because it refused the plan
OnSkip = Callable[[str, str], None]
_FORMAT_HINT = "use cmd, k8s, helm, all, kserve, llm-d, dynamo, disaggregatedset, platforms, keda, replan-cronjob or bench"

__all__ = [
    "FORMATS", "PLATFORM_FORMATS", "VLLM_VERSION", "ClusterOptions", "DeploySpec", "cluster_options", "GpuFacts", "GpuLookup", "VllmFlagError",
    "OnSkip", "build_spec", "check_serve_args", "normalise_formats", "render_deploy", "write_deploy_files",
]


def normalise_formats(formats: str | Iterable[str]) -> tuple[str, ...]:
    """'all' | 'cmd' | 'k8s,helm' | 'platforms' | ['cmd', 'helm'] -> ordered unique subset of FORMATS + EXTRA_FORMATS."""
    items = [formats] if isinstance(formats, str) else list(formats)
    names: list[str] = []
    for item in items:
        for part in str(item).split(","):
            part = part.strip().lower()
            if part == "all":
                names.extend(FORMATS)
            elif part == "platforms":
                names.extend(PLATFORM_FORMATS)
            elif part in FORMATS or part in EXTRA_FORMATS:
                names.append(part)
            else:
                raise DeployError(f"unknown deploy format {part!r}; {_FORMAT_HINT}")
    if not names:
        raise DeployError(f"no deploy format given; {_FORMAT_HINT}")
    return tuple(f for f in FORMATS + EXTRA_FORMATS if f in names)


def _named(formats: str | Iterable[str], fmt: str) -> bool:
    """Whether ``fmt`` was asked for by its own name (not only through 'all' or 'platforms')."""
    items = [formats] if isinstance(formats, str) else list(formats)
    return any(part.strip().lower() == fmt for item in items for part in str(item).split(","))


def render_deploy(plan: Plan | Mapping[str, Any], *, rank: int = 1, formats: str | Iterable[str] = "all",
                  checkpoint: str | None = None, plan_name: str | None = None,
                  gpus: GpuLookup | None = None, cluster: ClusterOptions | None = None,
                  replan: Any = None, on_skip: OnSkip | None = None) -> dict[str, str]:
    """Render row ``rank`` of ``plan`` into deployment files: file name -> text.

    ``checkpoint`` overrides the plan's pre-quantized checkpoint repo; ``plan_name`` (e.g. the plan
    file path) is named in each file's header; ``gpus`` replaces the GPU catalog lookup; ``cluster`` sets
    namespace, images, tolerations, node selector and storage class of the k8s/Helm output; ``replan``
    (a ``replan_job.ReplanJobOptions``) configures the ``replan-cronjob`` format.

    An output asked for by its own name that refuses the plan raises its one-line refusal. One asked for only
    through 'all' or 'platforms' is left out and ``on_skip`` is told why (a multi-node replica in Helm, KServe,
    llm-d, Dynamo; an AMD pool in Dynamo without ``--image``), unless every output of the request refused.
    """
    if not isinstance(plan, Plan):
        plan = load_plan(plan)  # a plan document: through the one reader
    spec = build_spec(plan, rank, checkpoint, plan_name=plan_name, gpus=gpus)
    if cluster is not None:
        spec = dataclasses.replace(spec, cluster=cluster)
    files: dict[str, str] = {}
    skipped: dict[str, DeployError] = {}
    for fmt in normalise_formats(formats):
        try:
            files.update(_render_one(fmt, spec, plan, replan))
        except DeployError as e:
            if _named(formats, fmt):
                raise
            skipped[fmt] = e
    if not files and skipped:
        raise next(iter(skipped.values()))
    for fmt, refusal in skipped.items():
        if on_skip is not None:
            on_skip(fmt, str(refusal))
    return files


def _render_one(fmt: str, spec: DeploySpec, plan: Plan, replan: Any) -> dict[str, str]:
    """One output's files (name -> text); raises its DeployError where that output cannot run the plan."""
    if fmt == "replan-cronjob":
        from recommender.deploy.replan_job import render_replan_cronjob
        from recommender.plan import dump_plan

        return render_replan_cronjob(spec, dump_plan(plan), replan)
    if fmt == "bench":
        from recommender.deploy.bench import render_bench

        return render_bench(spec, plan)
    return _RENDERERS[fmt](spec)


def write_deploy_files(plan: Plan | Mapping[str, Any], out_dir: str | Path, *, rank: int = 1,
                       formats: str | Iterable[str] = "all", checkpoint: str | None = None,
                       plan_name: str | None = None, gpus: GpuLookup | None = None,
                       extra_files: Mapping[str, str] | None = None, cluster: ClusterOptions | None = None,
                       replan: Any = None, on_skip: OnSkip | None = None) -> list[Path]:
    """Render (all files first, so a refused plan writes nothing) and write them as one set into ``out_dir``.

    ``extra_files`` (name -> text, e.g. ``plan.json``) join the same set. The folder is swapped in whole
    (:func:`recommender.deploy.writer.write_file_set`): it holds the old set or the new one, never a mix.
    Shell scripts are made executable (0o755). Returns the written deployment paths in render order.
    """
    files = render_deploy(plan, rank=rank, formats=formats, checkpoint=checkpoint, plan_name=plan_name, gpus=gpus,
                          cluster=cluster, replan=replan, on_skip=on_skip)
    label = f"plan rank {rank}" + (f" of {plan_name}" if plan_name else "")
    paths = write_file_set(out_dir, {**(extra_files or {}), **files}, label=label)
    return [p for p in paths if p.name in files]
