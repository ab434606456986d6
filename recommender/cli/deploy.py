"""``recommend deploy PLAN.json``: vLLM deployment files (serve script, Kubernetes, Helm, KServe, llm-d, Dynamo,
DisaggregatedSet) for one plan."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import List, Optional

import typer

from recommender.cli import options
from recommender.cli.app import app, one_line_errors
from recommender.deploy import cluster_options, render_deploy, write_deploy_files
from recommender.errors import ConfigError
from recommender.plan import load_plan


def _cron(schedule: str) -> str:
    """A five-field cron schedule (``*/5 * * * *``), or a one-line error."""
    fields = schedule.split()
    if len(fields) != 5 or not all(re.fullmatch(r"[0-9A-Za-z*/,?-]+", f) for f in fields):
        raise ConfigError(f"--schedule {schedule!r} is not a five-field cron schedule; use e.g. '*/5 * * * *'")
    return " ".join(fields)


#: the formats that read each option that does not apply to every output: a run whose formats read none of them
#: says so on stderr, one note per option given (an option ignored in silence reads as if it took effect)
_REPLAN_ONLY = ("replan-cronjob",)
_KUBERNETES = ("k8s", "helm", "kserve", "llm-d", "dynamo", "disaggregatedset", "keda", "replan-cronjob")
_OPTION_FORMATS: dict[str, tuple[str, tuple[str, ...]]] = {
    "namespace": ("--namespace", _KUBERNETES), "image": ("--image", _KUBERNETES),
    "router_image": ("--router-image", _KUBERNETES), "storage_class": ("--storage-class", _KUBERNETES),
    "node_selector": ("--node-selector", _KUBERNETES), "gpu_label": ("--gpu-label", _KUBERNETES),
    "toleration": ("--toleration", _KUBERNETES), "values": ("--values", _KUBERNETES),
    "schedule": ("--schedule", _REPLAN_ONLY), "traffic": ("--traffic", _REPLAN_ONLY),
    "selector": ("--selector", _REPLAN_ONLY), "history_secret": ("--history-secret", _REPLAN_ONLY),
    "apply": ("--apply", _REPLAN_ONLY), "replan_image": ("--replan-image", _REPLAN_ONLY),
}


def unused_option_notes(ctx: typer.Context, formats: str) -> list[str]:
    """One ``note: --X not used: ...`` line per option given on the command line (or from the environment) that
    none of the chosen formats reads (``--schedule`` with ``--format cmd``): the output is written as asked,
    and stderr says what was left unused, as it does for a format a group left out."""
    from recommender.deploy import normalise_formats

    chosen = normalise_formats(formats)
    notes = []
    for param, (flag, readers) in _OPTION_FORMATS.items():
        source = ctx.get_parameter_source(param)  # click's ParameterSource (typer vendors click: matched by name)
        if source is None or source.name not in ("COMMANDLINE", "ENVIRONMENT"):
            continue
        if not set(chosen) & set(readers):
            which = ("only --format replan-cronjob reads it" if readers == _REPLAN_ONLY
                     else "only the Kubernetes outputs read it, not cmd or bench")
            notes.append(f"note: {flag} not used: {which}; this run writes {', '.join(chosen)}")
    return notes


def _dns_name(name: str, what: str) -> str:
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", name):
        raise ConfigError(f"{what} {name!r} is not a Kubernetes object name (lowercase letters, digits, '-', '.')")
    return name


@app.command("deploy")
@one_line_errors
def deploy_cmd(
    ctx: typer.Context,
    plan: Path = typer.Argument(..., help="Plan JSON written by `recommend --workload ... --format json`."),
    rank: int = typer.Option(1, "--rank", "-r", help="Which plan of the ranking to deploy."),
    fmt: str = typer.Option("all", "--format", "-f", help="cmd|k8s|helm|all (comma-separated list allowed); kserve|llm-d|dynamo|disaggregatedset, or platforms for all four (docs/deploy-targets.md; a target that cannot run the plan is left out of all or platforms with a note on stderr, refused when named); keda: a KEDA ScaledObject per k8s.yaml Deployment; replan-cronjob: the re-planner as a Kubernetes CronJob; bench: the vllm bench serve runs that check the deployment and the calibrate command (none of these part of all)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Directory to write the files to; without it they are printed."),
    checkpoint: Optional[str] = typer.Option(
        None, "--checkpoint",
        help="Pre-quantized checkpoint repo for int8/int4/fp4 weights (overrides the plan's 'checkpoint'), or 'none' "
             "for the model's own repo, quantized at load where the plan's weight dtype is not its own (online fp8)."),
    as_json: bool = typer.Option(False, "--json", help="Print what was written (or rendered) as JSON."),
    namespace: Optional[str] = typer.Option(None, "--namespace", "-n", help="Kubernetes namespace of every object (k8s)."),
    image: Optional[str] = typer.Option(None, "--image", help="Engine image (default vllm/vllm-openai[-rocm]:v0.33.0)."),
    router_image: Optional[str] = typer.Option(None, "--router-image", help="Router image, pinned to a tag (default lmcache/lmstack-router:v0.1.12)."),
    storage_class: Optional[str] = typer.Option(None, "--storage-class", help="StorageClass of the HF cache volume."),
    node_selector: List[str] = typer.Option([], "--node-selector", help="Extra node label key=value for engine pods (repeatable, required)."),
    gpu_label: Optional[str] = typer.Option(None, "--gpu-label", help="How pods select the GPU model's nodes: auto (default: a soft preference on every label below), gfd (nvidia.com/gpu.product, required), gke (cloud.google.com/gke-accelerator), eks (node.kubernetes.io/instance-type), none."),
    toleration: List[str] = typer.Option([], "--toleration", help="Toleration key=value:Effect, key:Effect or key (repeatable)."),
    values: Optional[Path] = typer.Option(None, "--values", help="YAML with namespace, image, router_image, storage_class, node_selector, tolerations, gpu_label (flags win)."),
    schedule: str = typer.Option("*/5 * * * *", "--schedule", help="replan-cronjob: cron schedule of the re-planner."),
    traffic: str = typer.Option("prometheus+http://prometheus-operated.monitoring.svc:9090", "--traffic", help="replan-cronjob: traffic source of `recommend replan` (a Prometheus server scraping the engine pods)."),
    selector: Optional[str] = typer.Option(None, "--selector", help="replan-cronjob: PromQL label matchers (default: model_name=\"<served model name>\")."),
    history_secret: Optional[str] = typer.Option(None, "--history-secret", help="replan-cronjob: keep the history in PostgreSQL, URL from this Secret's key 'url' (default: SQLite on the job's volume)."),
    apply: bool = typer.Option(False, "--apply", help="replan-cronjob: patch the engine Deployments' (or a multi-node pool's LeaderWorkerSet's) replicas (same-shape changes within the policy); default: write the proposal only."),
    replan_image: str = typer.Option("recommender:latest", "--replan-image", help="replan-cronjob: container image with `recommend` installed."),
    wide: options.Wide = False,
) -> None:
    """Write the vLLM serve script, Kubernetes manifests and production-stack Helm values for a plan
    (and, with --format replan-cronjob, a CronJob that re-plans it in the cluster)."""
    from recommender.deploy.replan_job import ReplanJobOptions
    from recommender.replan.promapi import check_selector

    replan = ReplanJobOptions(schedule=_cron(schedule), traffic=traffic.strip(),
                              selector=None if selector is None else check_selector(selector),
                              history_secret=_dns_name(history_secret, "--history-secret") if history_secret else None,
                              apply=apply, image=replan_image.strip())
    notes = unused_option_notes(ctx, fmt)  # printed once the files are out (an error stays the one line)
    doc = load_plan(plan)
    cluster = cluster_options(values_file=values, namespace=namespace, image=image, router_image=router_image,
                              storage_class=storage_class, node_selector=node_selector, tolerations=toleration,
                              gpu_label=gpu_label)
    if out is None:
        files = render_deploy(doc, rank=rank, formats=fmt, checkpoint=checkpoint, plan_name=str(plan), cluster=cluster,
                              replan=replan, on_skip=options.note_skipped)
        _echo_notes(notes)
        if as_json:
            typer.echo(json.dumps({"plan": str(plan), "rank": rank, "files": files}, indent=2))
            return
        for i, (name, text) in enumerate(files.items()):
            if len(files) > 1:
                typer.echo(("" if i == 0 else "\n") + f"# ==> {name} <==")
            typer.echo(text, nl=False)
        return
    paths = write_deploy_files(doc, out, rank=rank, formats=fmt, checkpoint=checkpoint, plan_name=str(plan),
                               cluster=cluster, replan=replan, on_skip=options.note_skipped)
    _echo_notes(notes)
    if as_json:
        typer.echo(json.dumps({"plan": str(plan), "rank": rank, "written": [str(p) for p in paths]}, indent=2))
    else:
        from recommender.render.table import terminal_width

        width = None if wide else terminal_width()
        if width is None or all(len(str(p)) <= width for p in paths):
            typer.echo("\n".join(str(p) for p in paths))
        else:  # long folder: name it once, then each file under it
            options.echo_fitted(f"wrote {len(paths)} files to {out}/:\n" + "\n".join(
                f"  {p.relative_to(out) if p.is_relative_to(out) else p}" for p in paths), wide)


def _echo_notes(notes: list[str]) -> None:
    for note in notes:
        typer.echo(note, err=True)
