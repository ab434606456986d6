"""``recommend replan`` (observe traffic -> maybe a new plan) and ``recommend history`` (past decisions).

Exit codes of ``replan``: 0 unchanged, 10 changed, 11 unchanged because there is not enough data yet,
2..9 error (the current plan is kept; one line on stderr says what, why and what to try).
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, List, Mapping, Optional

import typer
from tabulate import tabulate

from recommender import units
from recommender.cli import options
from recommender.cli.app import app, one_line, one_line_errors
from recommender.bounded import check_storage
from recommender.errors import ConfigError, RecommenderError
from recommender.workload import Workload, load_workload

# The re-planning library (SQLAlchemy, the Prometheus parser, ...) is imported inside the commands so
# that `recommend --help` and the other commands start fast.
if TYPE_CHECKING:
    from recommender.plan import Plan
    from recommender.replan.history import History
    from recommender.replan.runner import Planner, ReplanResult


def default_policy() -> Path:
    """The shipped ``policies/replan.yaml`` (installed copy or source checkout), from any working folder."""
    from recommender.shipped import shipped_dir

    return shipped_dir("policies") / "replan.yaml"


def search_planner(*, storage: str | None, study_name: str, profile_file: str | None, trials: int | None,
                   seed: int, timeout_s: float | None, history_url: str | None = None,
                   deployment: str | None = None) -> Planner:
    """Adapter: ``recommender.search.planner`` warm-started from the current plan and the previous
    proposal of this deployment (from the history), verifying rank 1 only.

    The workload it gets carries the rate to size for (the forecast x (1 + headroom), the headroom of
    ``policies/search.yaml``); the search gets the forecast (``rate / (1 + headroom)``) on the mean basis and
    adds that same headroom, so the headroom is applied once and the proposal records the rate it was sized
    for as a plan from the main job does ("mean 8.00 + 20%"). The study lives in memory unless ``storage`` is
    given; each run's study is named ``<study_name>:<unix time>:<random>``, unique even for runs started
    in the same second (Optuna's enqueue skips parameters a study has already seen, and two runs sharing
    a study would rank each other's trials).
    """

    def plan(workload: Workload, current: Plan | None) -> Plan:
        try:
            from recommender.search.policy import load_search_policy
            from recommender.search import SearchSettings, recommend
        except ImportError as e:
            raise ConfigError(f"the planner (recommender.search.planner) is not available in this installation "
                              f"({e}); update the package") from None
        profile = None
        if profile_file is not None:
            from recommender.profiles import resolve_profile

            profile = resolve_profile("vllm", profile_file)
        policy = load_search_policy()
        basis = float(workload.effective_rate_per_s) / (1.0 + policy.headroom)
        workload = dataclasses.replace(workload, arrival_rate_per_s=basis)
        settings = SearchSettings(seed=seed, trials=trials, timeout_s=timeout_s, storage=storage, verify=1,
                                  study_name=f"{study_name}:{int(time.time())}:{uuid.uuid4().hex[:8]}")
        warm = [p for p in (current, previous_proposal(history_url, deployment, current)) if p is not None]
        found = recommend(workload, settings=settings, profile=profile, policy=policy, warm_start=warm)
        return dataclasses.replace(found, evaluations=())  # the search's own objects are not kept between runs

    return plan


def previous_proposal(history_url: str | None, deployment: str | None, current: Plan | None) -> Plan | None:
    """The newest proposal in the history of ``deployment`` that differs from ``current`` (or None); a stored
    proposal that no longer reads as a plan is skipped (a warm start is a hint)."""
    if history_url is None or deployment is None:
        return None
    from recommender.replan import plans
    from recommender.replan.history import History

    for r in History(history_url).list(deployment=deployment, limit=10):
        proposed = r.proposed_plan
        if proposed is not None and (current is None or not plans.same_deployment(proposed.top, current.top)):
            return proposed
    return None


def _fmt_rate(x: Any) -> str:
    return "-" if x is None else f"{float(x):.3g} req/s"


def _lengths(d: Mapping[str, Any]) -> str:
    parts = [f"{k} {d[k]:g}" for k in ("mean", "p50", "p90", "p99") if d.get(k) is not None]
    return ", ".join(parts) if parts else "-"


def render_result(r: ReplanResult) -> str:
    """Human summary: what was observed, the plans, the decision and why."""
    from recommender.replan import plans

    lines = []
    o = r.observed
    if o:
        lines.append(f"observed   {o['source']} {', '.join(o['where'])}: {o['requests']:g} requests over "
                     f"{o['window_s']:g} s = {_fmt_rate(o['arrival_rate_per_s'])}")
        sizing = o.get("sizing")
        if sizing:
            lines.append(f"sizing     {sizing['text']}")
        lines.append(f"forecast   {o['forecast_method']} {_fmt_rate(o['forecast_rate_per_s'])}; planned with "
                     f"{o['headroom']:.0%} headroom: {_fmt_rate(o['planned_rate_per_s'])}")
        lines.append(f"lengths    prompt tokens {_lengths(o['prompt_tokens'])}; output tokens {_lengths(o['output_tokens'])}")
        for s in o.get("slo", []):
            seen = "no data" if s["observed_s"] is None else units.fmt_seconds(s["observed_s"])
            ok = "" if s["ok"] is None else (" ok" if s["ok"] else " BREACHED")
            lines.append(f"slo        {s['metric']} {s['percentile']}: observed {seen} vs limit "
                         f"{units.fmt_seconds(s['limit_s'])} ({s['observations']} requests){ok}")
        g = o.get("gauges") or {}
        if g:
            lines.append("gauges     " + ", ".join(f"{k} {v:g}" for k, v in g.items()))
    # every setting that differs between the two is on both lines (plans.describe_pair), not only what
    # plans.describe shows: a change of max_num_seqs alone read as two identical lines
    if r.proposed is None:
        rows = [["current", plans.describe(r.current), f"{plans.usd_per_hour(r.current):.2f}"]]
    else:
        now, then = plans.describe_pair(r.current, r.proposed)
        rows = [["current", now, f"{plans.usd_per_hour(r.current):.2f}"],
                ["proposed", then, f"{plans.usd_per_hour(r.proposed):.2f}"]]
    lines.append(tabulate(rows, headers=["", "deployment", "USD/h"], tablefmt="simple", disable_numparse=True))
    verdict = {"changed": "CHANGED", "unchanged": "unchanged", "error": "ERROR"}[r.decision]
    delta = f" ({r.usd_per_hour_delta:+.2f} USD/h)" if r.changed else ""
    lines.append(f"decision   {verdict}{delta}: {r.reason}")
    for n in (o or {}).get("notes", []):
        lines.append(f"note       {n}")
    for w in r.written:
        lines.append(f"wrote      {w}")
    return "\n".join(lines)


def _emit(r: ReplanResult, fmt: options.TableOrJson, wide: bool = False) -> None:
    if fmt is options.TableOrJson.json:
        typer.echo(json.dumps(r.to_dict(), indent=2))
    else:
        options.echo_fitted(render_result(r), wide)
    if r.decision == "error":
        typer.echo(f"error: {one_line(r.reason)}", err=True)


@app.command("replan")
@one_line_errors
def replan_cmd(
    current: Path = typer.Option(..., "--current", help="The deployed plan (plan JSON from `recommend --format json`)."),
    rank: int = typer.Option(1, "--rank", "-r", help="Which row of --current is deployed (`recommend deploy --rank N`): the traffic is compared with that row and the re-planner resizes it. A stamped --out DIR/plan.json, once written, is the current plan instead."),
    traffic: List[str] = typer.Option(..., "--traffic", help="vLLM /metrics URL(s) (one per replica), prometheus+http://HOST:9090, or request-log file(s) (JSONL/CSV, Azure trace CSV). Repeat or list several."),
    more_traffic: Optional[List[str]] = typer.Argument(None, help="More sources, as in `--traffic A B C`.", show_default=False),
    policy: Optional[Path] = typer.Option(None, "--policy", help="Policy YAML (default: the shipped policies/replan.yaml, else built-in defaults)."),
    out: Optional[Path] = typer.Option(None, "--out", help="On a change, write the deployment files and DIR/plan.json (last, stamped with the run) atomically. A stamped DIR/plan.json of this deployment is the current plan of the next run."),
    watch_: bool = typer.Option(False, "--watch", help="Run every --interval until interrupted (default: one shot, for a CronJob)."),
    interval: str = typer.Option("5m", "--interval", help="Time between runs with --watch (e.g. 30s, 5m)."),
    fmt_name: Annotated[str, options.format_option(options.TableOrJson)] = "table",
    storage: Optional[str] = typer.Option(None, "--storage", help="History DB: SQLAlchemy URL (postgresql+psycopg://...) or SQLite file (default ./recommender-history.db)."),
    selector: str = typer.Option("", "--selector", help="Prometheus source: label matchers every query carries, e.g. 'model_name=\"meta-llama/Llama-3.1-8B\",namespace=\"prod\"'."),
    bearer_token_file: Optional[str] = typer.Option(None, "--bearer-token-file", help="HTTP sources: send 'Authorization: Bearer <token>' with the token read from this file (e.g. a mounted ServiceAccount token)."),
    bearer_token_env: Optional[str] = typer.Option(None, "--bearer-token-env", help="HTTP sources: the bearer token from this environment variable."),
    basic_auth_user: Optional[str] = typer.Option(None, "--basic-auth-user", help="HTTP sources: basic auth user (password from --basic-auth-password-file or --basic-auth-password-env)."),
    basic_auth_password_file: Optional[str] = typer.Option(None, "--basic-auth-password-file", help="Basic auth password file."),
    basic_auth_password_env: Optional[str] = typer.Option(None, "--basic-auth-password-env", help="Basic auth password environment variable."),
    served_name: Optional[List[str]] = typer.Option(None, "--served-model-name", help="/metrics sources: a model_name label (vLLM's --served-model-name) that is the plan's model, besides its catalog id, Hugging Face repo and checkpoints; series of other models are left out. Repeat for several."),
    state: Optional[Path] = typer.Option(None, "--state", help="Scrape state file for /metrics sources (default: beside the SQLite history DB)."),
    profile: Optional[str] = typer.Option(None, "--profile", help="Calibrated engine profile YAML for the planner."),
    workload: Optional[Path] = typer.Option(None, "--workload", help="The original workload YAML (GPUs, prices, SLOs); default: rebuilt from the plan, on its GPU types."),
    deployment: Optional[str] = typer.Option(None, "--deployment", help="History key (default: '<workload name>/<model>' of the plan)."),
    apply_to: Optional[List[str]] = typer.Option(None, "--apply-to", help="In a pod: after a same-shape change, scale these Deployments (one per pool, in pool order; a LeaderWorkerSet for a pool whose replica spans nodes) to the new replicas via the Kubernetes API; other changes are written only."),
    trials: Optional[int] = typer.Option(None, "--trials", help="Planner trials per run (default: the search policy's)."),
    seed: int = typer.Option(0, "--seed", help="Planner seed."),
    timeout: Optional[str] = typer.Option(None, "--timeout", help="Planner time budget per run (e.g. 20s; default: the search policy's)."),
    exit_zero_unless_error: bool = typer.Option(False, "--exit-zero-unless-error", help="Exit 0 for every outcome (unchanged, changed, not enough data; --format json's exit_code still tells them apart) and non-zero only for errors: for schedulers that mark a non-zero exit failed (the replan CronJob passes it)."),
    wide: options.Wide = False,
) -> None:
    """Observe live traffic, forecast it, and propose (or, with --out, write) the next plan only when the policy says it is worth it.

    Exit codes: 0 unchanged, 10 changed, 11 not enough data yet (plan kept; says how much more is needed),
    2-9 error (plan kept); with --exit-zero-unless-error 0 for all but the errors.
    """
    from recommender.replan import plans
    from recommender.replan.history import History, storage_url
    from recommender.replan.policy import load_policy
    from recommender.replan.promapi import auth_headers
    from recommender.replan.runner import (
        adopted_plan, deployment_name, job_exit_code, keeping, model_predictor, replan_once, watch,
    )
    from recommender.replan.sources import default_state_path, open_source

    fmt = options.choice(options.TableOrJson, fmt_name, "--format")
    pol_path = policy if policy is not None else (default_policy() if default_policy().is_file() else None)
    pol = load_policy(pol_path)
    interval_s = units.parse_duration_s(interval, "--interval")
    timeout_s = units.parse_duration_s(timeout, "--timeout") if timeout is not None else None
    if interval_s <= 0:
        raise ConfigError("--interval must be positive (e.g. 5m)")
    if deployment is not None:
        check_deployment_name(deployment)
    check_storage(storage)
    plan = plans.select_rank(plans.load_current(current), rank, str(current))
    dep = deployment or deployment_name(plan)
    url = storage_url(storage)
    history = History(url)
    try:  # from here on every failure is a history row too (an 'error' run), then the one-line error
        base = plans.check_same_model(plan, load_workload(workload), str(workload)) if workload is not None else None
        plan = adopted_plan(out, dep) or plan
        headers = auth_headers(bearer_token_file=bearer_token_file, bearer_token_env=bearer_token_env,
                               basic_user=basic_auth_user, basic_password_file=basic_auth_password_file,
                               basic_password_env=basic_auth_password_env)
        source = open_source(list(traffic) + list(more_traffic or []), pol, state or default_state_path(storage),
                             selector=selector, headers=headers, notify=lambda m: typer.echo(f"replan: {m}", err=True),
                             served=plans.served_model(plan, extra=served_name or ()))
        planner = search_planner(storage=None, study_name=f"replan:{dep}", profile_file=profile, trials=trials,
                                 seed=seed, timeout_s=timeout_s, history_url=url, deployment=dep)
        prof = None
        if profile is not None:
            from recommender.profiles import resolve_profile

            prof = resolve_profile("vllm", profile)
        predictor = model_predictor(profile=prof)
    except RecommenderError as e:
        history.record(time_s=time.time(), deployment=dep, decision="error", wanted="",
                       reason=keeping(str(e)), observed=None, current=plan, proposed=None,
                       usd_per_hour_current=plan.top.usd_per_hour)
        raise

    def step(cur: Plan) -> ReplanResult:
        r = replan_once(current=cur, source=source, planner=planner, policy=pol, history=history, base=base,
                        deployment=dep, out_dir=out, predictor=predictor)
        if apply_to and r.changed and r.proposed is not None:
            from recommender.replan.kube import apply_replicas

            typer.echo(f"replan: {apply_replicas(cur, r.proposed, list(apply_to))}", err=True)
        return r

    if not watch_:
        result = step(plan)
        _emit(result, fmt, wide)
        raise typer.Exit(job_exit_code(result.exit_code) if exit_zero_unless_error else result.exit_code)
    try:
        watch(step, plan, interval_s, on_result=lambda r: _emit(r, fmt, wide))
    except KeyboardInterrupt:
        typer.echo("stopped", err=True)
        raise typer.Exit(0) from None


def _iso(t: float) -> str:
    try:
        return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):  # a row stored by an older version with an absurd time
        return f"{t:.4g} s?"


def check_deployment_name(name: str) -> str:
    """``--deployment``: one printable line of at most 200 characters (the history column's width)."""
    if not name.strip() or not name.isprintable() or len(name) > 200:
        raise ConfigError(f"--deployment {name[:60]!r}: give one printable line of 1 to 200 characters "
                          f"(no control or invisible characters)")
    return name


def no_runs_message(history: History, deployment: str | None) -> str:
    """Why ``recommend history`` lists nothing: no runs at all, or none of ``deployment`` (naming those there are)."""
    from recommender.httpread import printable

    recorded = history.deployments(limit=6)
    if deployment is None or not recorded:
        return "no re-planning runs recorded yet"
    shown = ", ".join(f"{printable(d, 80)} ({n} run{'s' if n != 1 else ''})" for d, n in recorded[:5])
    more = ", ..." if len(recorded) > 5 else ""
    return (f"no re-planning runs of deployment {printable(deployment, 80)!r}; runs are recorded for: {shown}{more} "
            f"(--deployment takes one of these)")


@app.command("history")
@one_line_errors
def history_cmd(
    storage: Optional[str] = typer.Option(None, "--storage", help="History DB: SQLAlchemy URL or file (default ./recommender-history.db)."),
    fmt_name: Annotated[str, options.format_option(options.TableOrJson)] = "table",
    limit: int = typer.Option(20, "--limit", "-n", help="Newest N runs."),
    deployment: Optional[str] = typer.Option(None, "--deployment", help="Only this deployment ('<workload>/<model>')."),
    full: bool = typer.Option(False, "--full", help="JSON: include the observed workload and both plans."),
    wide: options.Wide = False,
) -> None:
    """List re-planning decisions, newest first: time, decision, USD/h before and after, and why."""
    from recommender.replan.history import History, records_to_dicts, sqlite_path, storage_url

    fmt = options.choice(options.TableOrJson, fmt_name, "--format")
    if limit <= 0:
        raise ConfigError("--limit must be positive")
    check_storage(storage)
    url = storage_url(storage)
    path = sqlite_path(url)
    if path is not None and not path.exists():
        raise ConfigError(f"no history at {path}: run `recommend replan` first, or pass --storage")
    history = History(url)
    records = history.list(deployment=deployment, limit=limit)
    if fmt is options.TableOrJson.json:
        typer.echo(json.dumps(records_to_dicts(records, full=full), indent=2))
        return
    if not records:
        typer.echo(no_runs_message(history, deployment))
        return
    rows = []
    for d in records_to_dicts(records):
        rows.append([_iso(d["time_s"]), d["deployment"], d["decision"], d["wanted"] or "-",
                     "-" if d["usd_per_hour_current"] is None else f"{d['usd_per_hour_current']:.2f}",
                     "-" if d["usd_per_hour_proposed"] is None else f"{d['usd_per_hour_proposed']:.2f}",
                     "-" if d["observed_rate_per_s"] is None else f"{d['observed_rate_per_s']:.3g}",
                     "-" if d["forecast_rate_per_s"] is None else f"{d['forecast_rate_per_s']:.3g}", d["reason"]])
    from recommender.render.table import fit_rows

    width = None if wide else options.fitted_width()
    text, dropped = fit_rows(["time (UTC)", "deployment", "decision", "wanted", "USD/h now", "USD/h proposed", "req/s",
                              "forecast", "reason"], rows, width=width,
                             drop_order=["forecast", "wanted", "deployment", "USD/h proposed"], max_widths={"reason": 70})
    if dropped:
        text += f"\n{len(dropped)} columns hidden to fit {width} columns ({', '.join(dropped)}); --wide shows all."
    options.echo_fitted(text, wide)
