"""The main job: ``recommend --workload FILE [--slo ...]`` or quick flags -> ranked Pareto plan (the app's callback).

Every option is checked before the search starts (formats, their dependencies, names, writable outputs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional

import typer

from recommender.cli import options
from recommender.cli.app import app, fail, one_line_errors
from recommender.errors import ConfigError

if TYPE_CHECKING:
    from recommender.plan import Plan
    from recommender.workload import Workload


def _print_version(value: bool) -> None:
    if value:
        from recommender.version import __version__

        typer.echo(f"recommend {__version__}")
        raise typer.Exit(0)


@app.callback(invoke_without_command=True)
@one_line_errors
def main_job(
    ctx: typer.Context,
    workload: Optional[str] = typer.Option(None, "--workload", "-w", help="Workload YAML (see examples/). Quick flags below override its fields."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Model: catalog id, Hugging Face repo id (an alias names that checkpoint: deepseek-r1, Llama-3.3-70B-Instruct) or config.json path (`recommend models`)."),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="GPUs the plan may use, comma-separated ids or aliases: h100,h200 (`recommend gpus`)."),
    rate: Optional[float] = typer.Option(None, "--rate", help="Arrival rate, requests/s."),
    prompt_tokens: Optional[str] = typer.Option(None, "--prompt-tokens", help="Prompt tokens per request (constant; 2000 or 2k)."),
    output_tokens: Optional[str] = typer.Option(None, "--output-tokens", help="Output tokens per request (constant)."),
    slo: List[str] = typer.Option([], "--slo", help="SLO, repeatable or comma-separated: tpot=30ms, ttft=2s@p99, e2e=20s@p90, 'ttft=500ms,tpot=30ms'. A unit is required (us, ms, s, min); percentile p50|p90|p95|p99|mean, default p90. Overrides the file's SLO for the same metric."),
    top: int = typer.Option(5, "--top", help="Plans to show."),
    fmt: str = typer.Option("table", "--format", "-f", help="table|json|yaml|csv"),
    wide: bool = typer.Option(False, "--wide", help="Every table column and whole lines, whatever the terminal width (any command)."),
    report: Optional[str] = typer.Option(None, "--report", help="Write a self-contained HTML report (chart, table, per-plan walkthrough) to FILE.html."),
    plot: Optional[str] = typer.Option(None, "--plot", help="Write the Pareto chart alone to FILE (.html; .svg/.png need kaleido)."),
    seed: int = typer.Option(0, "--seed", help="Sampler seed (same seed, same plan)."),
    trials: Optional[int] = typer.Option(None, "--trials", help="Optuna trials (default: policies/search.yaml)."),
    timeout: Optional[str] = typer.Option(None, "--timeout", help="Search time limit: 30s, 2min, or seconds (default: policies/search.yaml)."),
    storage: Optional[str] = typer.Option(None, "--storage", help="Optuna storage URL to keep the study (sqlite:///study.db, postgresql://..., or a .log journal file)."),
    study_name: Optional[str] = typer.Option(None, "--study-name", help="Study name in --storage (default: recommend-<workload name>)."),
    workers: int = typer.Option(1, "--workers", help="Processes sharing --storage (a .log journal file or PostgreSQL); the branch and bound is split by shape."),
    engine: str = typer.Option("vllm", "--engine", help="Efficiency profile name."),
    profile: Optional[str] = typer.Option(None, "--profile", help="Calibrated profile YAML (from recommend calibrate)."),
    policy: Optional[str] = typer.Option(None, "--policy", help="Search policy YAML (default policies/search.yaml)."),
    verify: Optional[int] = typer.Option(None, "--verify", help="Verify the top K plans in the discrete-event simulator (default 3; 0 = off)."),
    confidence: float = typer.Option(0.5, "--confidence", help="Rank only plans whose P(all SLOs met), from the held-out error of their evidence class, is at least P (default 0.5: the point prediction meets them)."),
    inventory_network: Optional[str] = typer.Option(None, "--inventory-network", metavar="KIND=GBPS", help="The NIC per GPU between the nodes you own (infiniband=400, roce=200, efa=400, ethernet=100): lets a model no node holds run in pipeline stages over them (the inventory's network: in a workload file)."),
    inventory: Optional[str] = typer.Option(None, "--inventory", help="Plan onto GPUs you own: h100-sxm=16,a100-80gb=8 (add @$2.10/h for an amortised price per GPU-hour; without one the cost counts GPU-hours). Nodes as they are (the GPU's NVLink domain; inventory: in the workload for other node sizes); says how many more GPUs the SLO needs when these are not enough."),
    price: Optional[str] = typer.Option(None, "--price", help="USD per GPU-hour for GPUs without an offer, or to override the catalog's: mi355x=$3.50/h,h100=2.49, or one price with one --gpus (as prices: in a workload file, which it joins)."),
    provider: Optional[str] = typer.Option(None, "--provider", help="Price with this provider's offers only (catalogs/gpus offers:, e.g. lambda, coreweave, runpod); default: the cheapest offer per GPU."),
    emit: Optional[str] = typer.Option(None, "--emit", help="Write the plan JSON and rank 1's deployment files (vllm cmd, k8s, helm; see --targets) to DIR."),
    targets: str = typer.Option("all", "--targets", help="--emit: deploy formats to write, as `deploy --format` (e.g. all,kserve,llm-d or platforms)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar on stderr (any command)."),
    debug: bool = typer.Option(False, "--debug", help="Show the Python traceback of an unexpected error (any command)."),
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                 help="Print the version and exit."),
) -> None:
    """Plan LLM serving deployments. Without a subcommand: the ranked Pareto plan for --workload or the quick flags."""
    from recommender import progress
    from recommender.cli.app import set_debug

    set_debug(debug)
    from recommender.cli.options import set_wide

    set_wide(wide)  # `recommend --wide SUBCOMMAND` keeps every line whole
    progress.configure(quiet=quiet)  # `recommend --quiet SUBCOMMAND ...` silences every command's bar
    if ctx.invoked_subcommand is not None:
        _refuse_main_options(ctx)
        return
    quick = (model, gpus, rate, prompt_tokens, output_tokens)
    if workload is None and all(v is None for v in quick):
        typer.echo(ctx.get_help())
        raise fail("give --workload FILE (e.g. examples/rag.yaml), quick flags (--model --rate --prompt-tokens "
                   "--output-tokens), or a subcommand (estimate, deploy, simulate, replan, calibrate, models, gpus)", 2)
    from recommender import units
    from recommender.cli.checks import check_main_options, resolve_workload_names
    from recommender.profiles import resolve_profile
    from recommender.render.plan import RENDERERS, render_table
    from recommender.render.table import terminal_width
    from recommender.search import SearchSettings, recommend
    from recommender.search.policy import load_search_policy
    from recommender.workload import Slo, load_workload, parse_price_flag, workload_from_flags

    timeout_s = units.parse_duration_s(timeout, "--timeout") if timeout is not None else None
    check_main_options(fmt=fmt, formats=RENDERERS, top=top, workers=workers, storage=storage, trials=trials,
                       seed=seed, timeout=timeout_s, plot=plot, report=report, emit=emit, verify=verify)
    if emit:
        from recommender.deploy import normalise_formats

        normalise_formats(targets)  # a typo fails here, before the search
    slos = [Slo.parse(part) for s in slo for part in s.split(",") if part.strip()]  # tpot=30ms,ttft=2s
    metrics = [s.metric for s in slos]
    if len(set(metrics)) != len(metrics):  # flags override the file's SLO per metric; two flags on one would hide one
        dup = next(m for m in metrics if metrics.count(m) > 1)
        raise ConfigError(f"--slo: two limits on {dup} ({', '.join(str(s) for s in slos if s.metric == dup)}); give one "
                          f"per metric")
    base = load_workload(workload) if workload else None
    w = workload_from_flags(
        base, model=model, gpus=[g for g in (gpus or "").split(",") if g.strip()] or None, rate_per_s=rate,
        prompt_tokens=units.parse_count(prompt_tokens, "--prompt-tokens") if prompt_tokens else None,
        output_tokens=units.parse_count(output_tokens, "--output-tokens") if output_tokens else None,
        prices=parse_price_flag(_one_gpu_price(price, gpus)) if price is not None else None,
    ).with_slos(slos)
    if inventory:
        import dataclasses

        if provider:
            raise fail(f"--provider {provider} prices rented GPUs and --inventory plans on GPUs you own; give one", 2)
        from recommender.offers import parse_inventory

        w = dataclasses.replace(w, inventory=parse_inventory(inventory))
    if inventory_network is not None:
        w = _with_inventory_network(w, inventory_network)
    w = resolve_workload_names(w)
    if report:  # the report shows simulated against analytic percentiles for every listed plan
        verify = top if verify is None else max(verify, top) if verify else verify
    settings = SearchSettings(seed=seed, trials=trials, timeout_s=timeout_s, storage=storage,
                              study_name=study_name, workers=workers, top=top, verify=verify,
                              provider=provider, confidence=confidence)
    prof = resolve_profile(engine, profile)
    plan = recommend(w, settings=settings, profile=prof, policy=load_search_policy(policy))
    if emit:  # before stdout: a refused folder must not follow a printed plan
        _emit(emit, plan, workload or w.source, targets)  # as given: 'all' skips what a multi-node plan cannot use
    if fmt == "table":
        typer.echo(render_table(plan, width=None if wide else terminal_width()))
    else:
        text = RENDERERS[fmt](plan)
        typer.echo(text, nl=not text.endswith("\n"))  # CSV ends in its own newline: no blank line after it
    if plot:
        from recommender.render.plot import write_plot

        with progress.bar(f"export {plot}", total=1, unit="file") as bar:
            write_plot(plot, plan, plan.evaluations)
            bar.update(1)
        typer.echo(f"wrote {plot}", err=True)
    if report:
        from recommender.render.report import write_report

        with progress.bar(f"export {report}", total=1, unit="file") as bar:
            write_report(report, plan, profile=prof)
            bar.update(1)
        typer.echo(f"wrote {report}", err=True)


def _refuse_main_options(ctx: typer.Context) -> None:
    """A main-command option given before a subcommand (``recommend --format json replan``) is not the
    subcommand's: refused in one line saying where it goes, never silently dropped. The options every command
    takes (``--quiet``, ``--debug``, ``--wide``) may stand on either side (``recommend.cli.app.GLOBAL_OPTIONS``)."""
    from typer._click.core import ParameterSource

    from recommender.cli.app import GLOBAL_OPTIONS

    sub = ctx.invoked_subcommand
    command = ctx.command.get_command(ctx, sub) if sub and hasattr(ctx.command, "get_command") else None
    sub_opts = {o for p in getattr(command, "params", ()) for o in (*p.opts, *getattr(p, "secondary_opts", ()))}
    for p in ctx.command.params:
        if p.name in GLOBAL_OPTIONS or p.name == "version" or not p.opts:
            continue
        if ctx.get_parameter_source(str(p.name)) is not ParameterSource.COMMANDLINE:
            continue
        flag = max(p.opts, key=len)
        if sub_opts.intersection(p.opts):
            value = ctx.params.get(str(p.name))
            shown = value if isinstance(value, (str, int, float)) and not isinstance(value, bool) else "VALUE"
            raise ConfigError(f"{flag} before the subcommand sets the plan search's option, not {sub}'s; put it "
                              f"after the subcommand: recommend {sub} ... {flag} {shown}")
        raise ConfigError(f"{flag} is an option of the plan search (recommend without a subcommand); recommend {sub} "
                          f"has no {flag} (see 'recommend {sub} -h')")


def _one_gpu_price(price: str, gpus: str | None) -> str:
    """``--price 3.50`` with one GPU in ``--gpus`` is that GPU's price (as ``estimate --price``); else as given."""
    names = [g.strip() for g in (gpus or "").split(",") if g.strip()]
    return f"{names[0]}={price}" if "=" not in price and len(names) == 1 else price


def _emit(emit: str, plan: Plan, source: str, formats: str) -> None:
    import dataclasses
    from pathlib import Path

    from recommender.deploy import write_deploy_files
    from recommender.plan import dump_plan

    out = Path(emit)
    plan = dataclasses.replace(plan, workload=dataclasses.replace(plan.workload, source=source))
    # one set: plan.json and rank 1's files are swapped in together (never a new plan beside old files)
    paths = write_deploy_files(plan, out, rank=1, formats=formats, plan_name=str(out / "plan.json"),
                               extra_files={"plan.json": dump_plan(plan)}, on_skip=options.note_skipped)
    typer.echo(f"wrote {out / 'plan.json'} and {len(paths)} deployment files to {out}", err=True)


def _with_inventory_network(w: Workload, text: str) -> Workload:
    """The owned GPUs of ``w`` with the NIC ``--inventory-network`` states (entries that name their own keep it)."""
    import dataclasses

    from recommender.offers import parse_network_flag

    if not w.inventory:
        raise ConfigError("--inventory-network states the NIC between GPUs you own; give them with --inventory "
                          "(or inventory: in the workload)")
    net = parse_network_flag(text)
    return dataclasses.replace(w, inventory=tuple(o if o.network.known else dataclasses.replace(o, network=net)
                                                  for o in w.inventory))
