"""One re-planning step, and the ``--watch`` loop around it.

A step: observe the traffic source -> forecast -> Workload -> ``planner(workload, current_plan)`` ->
policy decision -> (if changed and an output folder is given) write ``plan.json`` atomically and the
deployment files -> one history row. The planner is injected: the CLI passes an adapter around
``recommender.search.planner``; tests pass a small analytic fake.

Exit codes: 0 unchanged, 10 changed, 11 unchanged because there is not enough data yet (the reason
says how much more is needed), 2..9 error (the current plan is kept).
"""

from __future__ import annotations

import importlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from recommender.errors import RecommenderError, TrafficSourceError
from recommender.replan import plans
from recommender.replan.history import History
from recommender.replan.metrics import write_text_atomically
from recommender.replan.observation import InsufficientDataError
from recommender.replan.observe import (
    base_workload_from_plan, forecast_rate_per_s, merge_points, observed_workload, rate_points_from_observed,
    slo_attainment, slo_risks,
)
from recommender.replan.policy import Policy, decide
from recommender.replan.sources import TrafficSource
from recommender.workload import Workload

EXIT_UNCHANGED = 0
EXIT_CHANGED = 10
EXIT_INSUFFICIENT_DATA = InsufficientDataError.exit_code  # 11

Planner = Callable[[Workload, "dict[str, Any] | None"], "dict[str, Any]"]


@dataclass(frozen=True)
class ReplanResult:
    """Outcome of one step; ``to_dict()`` is the ``--format json`` document."""

    decision: str  # "changed" | "unchanged" | "error"
    reason: str
    current: Mapping[str, Any]
    proposed: Mapping[str, Any] | None = None
    observed: Mapping[str, Any] | None = None
    exit_code: int = EXIT_UNCHANGED
    time_s: float = 0.0
    written: tuple[str, ...] = field(default=())

    @property
    def changed(self) -> bool:
        return self.decision == "changed"

    @property
    def usd_per_hour_delta(self) -> float:
        """proposed - current USD/hour (0 without a proposal)."""
        if self.proposed is None:
            return 0.0
        return round(plans.usd_per_hour(self.proposed) - plans.usd_per_hour(self.current), 4)

    def to_dict(self) -> dict[str, Any]:
        return {"changed": self.changed, "reason": self.reason, "observed": self.observed, "current": self.current,
                "proposed": self.proposed, "usd_per_hour_delta": self.usd_per_hour_delta,
                "decision": self.decision, "exit_code": self.exit_code, "written": list(self.written)}


def deployment_name(doc: Mapping[str, Any]) -> str:
    """History key of a plan: '<workload name>/<model>'."""
    wl = doc.get("workload") or {}
    return f"{wl.get('name') or 'workload'}/{wl.get('model') or 'model'}"


def deploy_writer() -> Callable[[dict[str, Any], Path], Any] | None:
    """``recommender.deploy.write_deploy_files`` when that package is installed, else None."""
    try:
        deploy = importlib.import_module("recommender.deploy")
    except ModuleNotFoundError as e:
        if e.name and (e.name == "recommender.deploy" or e.name.startswith("recommender.deploy.")):
            return None
        raise
    return getattr(deploy, "write_deploy_files", None)


def write_outputs(plan_doc: Mapping[str, Any], out_dir: Path) -> tuple[str, ...]:
    """The deployment files (when ``recommender.deploy`` exists), then ``out_dir/plan.json``.

    Every file is written to a temp file and renamed; the deployment files are rendered (and a refused
    plan rejected) before anything is written, and plan.json goes last, so it names a complete set.
    """
    written: list[str] = []
    writer = deploy_writer()
    if writer is not None:
        more = writer(dict(plan_doc), out_dir)
        if isinstance(more, (list, tuple)):
            written += [str(p) for p in more]
    path = out_dir / "plan.json"
    write_text_atomically(path, json.dumps(plan_doc, indent=2) + "\n")
    return tuple(written + [str(path)])


def replan_once(*, current: Mapping[str, Any], source: TrafficSource, planner: Planner, policy: Policy,
                history: History, base: Workload | None = None, deployment: str | None = None,
                out_dir: Path | None = None, clock: Callable[[], float] = time.time) -> ReplanResult:
    """Run one step; never raises for traffic or planner trouble (it is an 'error' result + history row)."""
    dep = deployment or deployment_name(current)
    cur_usd = plans.usd_per_hour(current)

    def finish(decision: str, wanted: str, reason: str, code: int, t: float, observed: Any = None,
               proposed: Any = None, written: tuple[str, ...] = ()) -> ReplanResult:
        history.record(time_s=t, deployment=dep, decision=decision, wanted=wanted, reason=reason, observed=observed,
                       current=dict(current), proposed=proposed, usd_per_hour_current=cur_usd,
                       usd_per_hour_proposed=plans.usd_per_hour(proposed) if proposed else None)
        return ReplanResult(decision, reason, current, proposed, observed, code, t, written)

    try:
        obs = source.observe()
    except InsufficientDataError as e:
        return finish("unchanged", "", str(e), e.exit_code, clock())
    except TrafficSourceError as e:
        return finish("error", "", f"{e}; keeping the current plan", e.exit_code, clock())
    now = obs.end_s
    past_records = history.list(deployment=dep, limit=max(50, 4 * policy.scale_down_windows))
    horizon = now - policy.lookback_s - obs.window_s
    if len(past_records) >= max(50, 4 * policy.scale_down_windows) and past_records[-1].time_s > horizon:
        past_records = history.list(deployment=dep, since_s=horizon)  # frequent runs: cover the whole lookback
    past = [r.past() for r in past_records]
    if not any(p.decision == "changed" for p in past):
        last = history.last_change(dep)
        if last is not None:
            past.append(last.past())
    # the forecast looks back over earlier runs' rates too (points ending before this window starts)
    window_start = obs.end_s - obs.window_s
    earlier = [p for r in past_records if r.observed and r.observed.get("source") == obs.source
               for p in rate_points_from_observed(r.observed) if p.end_s <= window_start + 1e-6]
    points = merge_points(earlier, obs.rate_points)
    forecast = forecast_rate_per_s(points, policy, now)
    try:
        base_wl = base if base is not None else base_workload_from_plan(current)
        workload, notes = observed_workload(obs, base_wl, current, policy, forecast)
    except RecommenderError as e:
        return finish("error", "", f"{e}; keeping the current plan", e.exit_code, now)
    risks = slo_risks(obs, base_wl.slos, current, policy, forecast)
    observed = {**obs.to_dict(), "forecast_method": policy.forecast_method, "forecast_rate_per_s": round(forecast, 4),
                "headroom": policy.headroom, "planned_rate_per_s": workload.arrival_rate_per_s,
                "slo": slo_attainment(obs, base_wl.slos, policy), "slo_risks": risks,
                "notes": list(obs.notes) + notes, "workload": workload.to_dict()}
    try:
        proposed = planner(workload, dict(current))
        plans.check_plan(proposed, "the planner's proposal")
    except RecommenderError as e:
        return finish("error", "", f"planner failed for the observed workload ({e}); keeping the current plan",
                      e.exit_code, now, observed)
    except Exception as e:  # noqa: BLE001 - a planner bug must not kill a --watch loop or print a traceback
        return finish("error", "", f"planner crashed ({type(e).__name__}: {e}); keeping the current plan; please "
                      f"report this with the observed workload from `recommend history --full --format json`",
                      2, now, observed)
    d = decide(policy, current=current, proposed=proposed, risks=risks, past=past, now_s=now)
    if not d.changed:
        return finish("unchanged", d.wanted, d.reason, EXIT_UNCHANGED, now, observed, d.plan)
    written: tuple[str, ...] = ()
    if out_dir is not None:
        try:
            written = write_outputs(d.plan, out_dir)
        except (RecommenderError, OSError) as e:
            return finish("error", d.wanted, f"decided to change ({d.reason}) but writing {out_dir} failed: {e}; "
                          f"the deployed plan is unchanged", getattr(e, "exit_code", 2), now, observed, d.plan)
    return finish("changed", d.wanted, d.reason, EXIT_CHANGED, now, observed, d.plan, written)


def watch(step: Callable[[Mapping[str, Any]], ReplanResult], current: Mapping[str, Any], interval_s: float, *,
          on_result: Callable[[ReplanResult], None], sleep: Callable[[float], None] = time.sleep,
          iterations: int | None = None) -> ReplanResult | None:
    """Run ``step(current)`` every ``interval_s`` until interrupted (or ``iterations`` runs).

    After a change the adopted plan becomes the current one. Errors are reported and the loop goes on.
    """
    last = None
    n = 0
    while iterations is None or n < iterations:
        started = time.monotonic()
        last = step(current)
        on_result(last)
        if last.changed and last.proposed is not None:
            current = last.proposed
        n += 1
        if iterations is not None and n >= iterations:
            break
        sleep(max(0.0, interval_s - (time.monotonic() - started)))
    return last
