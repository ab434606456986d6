"""``recommend autoscale --workload FILE``: an autoscaling plan for a day of traffic, certified in a replay."""

from __future__ import annotations

import json
from typing import Optional

import typer

from recommender.cli import options
from recommender.cli.app import app, fail, one_line_errors


@app.command("autoscale")
@one_line_errors
def autoscale_cmd(
    workload: str = typer.Option(..., "--workload", "-w", metavar="FILE",
                                 help="Workload YAML with a day: block (examples/chat-day.yaml)."),
    startup: Optional[str] = typer.Option(None, "--startup", metavar="DURATION",
                                          help="Pod start-up time (e.g. 4min); default: the day: block's, else "
                                               "image pull + weights / storage bandwidth + engine start "
                                               "(policies/autoscale.yaml)."),
    fmt: str = typer.Option("text", "--format", "-f", help="text|json"),
    emit: Optional[str] = typer.Option(None, "--emit", metavar="DIR",
                                       help="Write plan.json, autoscale.json, the deployment files of rank 1 and "
                                            "its KEDA ScaledObject + HPA to DIR."),
    prometheus: str = typer.Option("http://prometheus-operated.monitoring.svc:9090", "--prometheus", metavar="URL",
                                   help="Prometheus the KEDA trigger queries."),
    compare_static: bool = typer.Option(False, "--compare-static",
                                        help="Also replay the static peak plan (doubles the replay time)."),
    seed: int = typer.Option(0, "--seed", help="Search and arrival seed."),
    engine: str = typer.Option("vllm", "--engine", help="Efficiency profile name."),
    profile: Optional[str] = typer.Option(None, "--profile", metavar="FILE", help="Calibrated profile YAML."),
    policy: Optional[str] = typer.Option(None, "--policy", metavar="FILE", help="Search policy YAML."),
    autoscale_policy: Optional[str] = typer.Option(None, "--autoscale-policy", metavar="FILE",
                                                   help="Autoscaler policy YAML (default policies/autoscale.yaml)."),
) -> None:
    """Plan the configuration for the day's peak, derive the KEDA/HPA rule from the load model and the pod
    start-up time, and certify it in a day-long replay (SLO windows, flaps, GPU-hours vs static and ideal)."""
    from recommender.autoscale import parse_startup_s, plan_autoscaling, summary_lines
    from recommender.autoscale.rule import load_autoscale_policy
    from recommender.cli.checks import check_writable_dir, resolve_workload_names
    from recommender.deploy.keda import check_prometheus_url
    from recommender.profiles import resolve_profile
    from recommender.search.policy import load_search_policy
    from recommender.workload import load_workload

    if fmt not in ("text", "json"):
        raise fail(f"--format {fmt!r}: use text or json", 2)
    # every flag is checked before the search and the day's replay (tens of seconds), with or without --emit
    check_prometheus_url(prometheus, "--prometheus")
    start = parse_startup_s(startup, "--startup") if startup is not None else None
    if emit:
        check_writable_dir(emit, "--emit")
    w = resolve_workload_names(load_workload(workload))
    ap = plan_autoscaling(w, profile=resolve_profile(engine, profile), policy=load_search_policy(policy),
                          autoscale_policy=load_autoscale_policy(autoscale_policy), startup_override_s=start,
                          seed=seed, compare_static=compare_static)
    doc = ap.to_dict()
    if emit:  # written before the report is printed: a folder the writer refuses never follows a printed report
        _emit(emit, ap, doc, prometheus)
    if fmt == "json":
        typer.echo(json.dumps(doc, indent=2))
    else:
        typer.echo("\n".join(summary_lines(ap)))
        if ap.static_certification is not None:
            s = ap.static_certification
            typer.echo(f"static     the peak plan in the same replay: SLOs met in {s.windows_met}/{s.windows} "
                       f"windows ({s.attainment:.1%})")


def _emit(out_dir: str, ap: object, doc: dict[str, object], prometheus: str) -> None:
    from pathlib import Path

    from recommender.autoscale import AutoscalePlan
    from recommender.deploy import build_spec, write_deploy_files
    from recommender.deploy.keda import AutoscalerSettings, render_autoscaler
    from recommender.plan import dump_plan

    assert isinstance(ap, AutoscalePlan)
    r = ap.rule
    settings = AutoscalerSettings(min_replicas=r.min_replicas, max_replicas=r.max_replicas,
                                  target_per_replica_per_s=r.target_per_replica_per_s, polling_s=int(r.polling_s),
                                  metric_window_s=int(r.metric_window_s),
                                  scale_down_stabilisation_s=int(round(r.scale_down_stabilisation_s)),
                                  metric_hold_s=int(round(r.metric_hold_s)),
                                  prometheus_url=prometheus)
    plan = ap.peak_plan()  # the static peak plan the report names: its replicas in plan.json and every file
    extra = {"plan.json": dump_plan(plan),
             "autoscale.json": json.dumps(doc, indent=2) + "\n",
             **render_autoscaler(build_spec(plan, 1, plan_name="plan.json"), settings)}
    paths = write_deploy_files(plan, Path(out_dir), plan_name="plan.json", extra_files=extra,
                               on_skip=options.note_skipped)
    typer.echo(f"wrote plan.json, autoscale.json, keda-scaledobject.yaml, hpa.yaml and {len(paths)} deployment "
               f"files to {out_dir}", err=True)
