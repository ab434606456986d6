"""One re-planning step, and the ``--watch`` loop around it.

A step: observe the traffic source -> forecast -> Workload -> the current plan under the model at the
forecast (``predictor``; its misses and observed SLO breaches are the risks) -> when the traffic is inside
the plan's band, stop there (no search) -> else ``planner(workload, current_plan)`` -> the policy decision,
the files and the history row under the deployment's lock, in one transaction (``History.decision``).
The plan a change writes carries a ``replan`` stamp (run id); a stamped plan.json without its history row
(killed before the commit) is recorded by the next run. Planner and predictor are injected: the CLI
passes adapters around ``recommender.search`` and ``recommender.replan.predict``; tests pass small fakes.

Exit codes: 0 unchanged, 10 changed, 11 unchanged because there is not enough data yet (the reason
says how much more is needed), 2..9 error (the current plan is kept).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from recommender.atomic import atomic_write_text
from recommender.errors import RecommenderError
from recommender.plan import Plan, dump_plan, plan_document
from recommender.replan import plans
from recommender.replan.band import BandCheck, check_band
from recommender.replan.history import History, Transaction
from recommender.replan.observation import InsufficientDataError, Observation, check_observation
from recommender.replan.observe import (
    base_workload_from_plan, forecast_rate_per_s, merge_points, observed_workload, rate_points_from_observed,
    slo_attainment, slo_risks,
)
from recommender.replan.policy import PastRun, Policy, decide
from recommender.replan.sources import TrafficSource
from recommender.workload import Workload

if TYPE_CHECKING:
    from recommender.replan.predict import Prediction

EXIT_UNCHANGED = 0
EXIT_CHANGED = 10
EXIT_INSUFFICIENT_DATA = InsufficientDataError.exit_code  # 11

#: the longest reason a run records and prints: an error's is one line of the house's 500 characters (an excerpt of
#: what a source answered, never the answer), a decision's (its risks and both plans) at most 2,000
MAX_ERROR_REASON_CHARS = 500
MAX_REASON_CHARS = 2000
KEEPING = "keeping the current plan"

Planner = Callable[[Workload, "Plan | None"], Plan]
# (plan, workload, replicas per pool or None = the plan's) -> the model's verdict
Predictor = Callable[..., "Prediction"]


@dataclass(frozen=True)
class ReplanResult:
    """Outcome of one step; ``to_dict()`` is the ``--format json`` document."""

    decision: str  # "changed" | "unchanged" | "error"
    reason: str
    current: Plan
    proposed: Plan | None = None
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
        """The plans as plan files hold them (JSON, version 2)."""
        return {"changed": self.changed, "reason": self.reason, "observed": self.observed,
                "current": plan_document(self.current),
                "proposed": None if self.proposed is None else plan_document(self.proposed),
                "usd_per_hour_delta": self.usd_per_hour_delta,
                "decision": self.decision, "exit_code": self.exit_code, "written": list(self.written)}


def bounded(text: str, limit: int) -> str:
    """``text`` on one line (whitespace runs collapsed) of at most ``limit`` characters, ending '...' where cut;
    only the first ``4 x limit`` characters are looked at, so a 100 MB message costs nothing more."""
    head = " ".join(text[: 4 * limit].split())
    if len(head) <= limit and len(text) <= 4 * limit:
        return head
    return head[: limit - 3] + "..."


def keeping(reason: str) -> str:
    """An error run's reason: ``reason`` bounded (:func:`bounded`) and ending '; keeping the current plan' once (a
    source's own message may say so already)."""
    core = bounded(reason, MAX_ERROR_REASON_CHARS - len(KEEPING) - 2)
    return core if core.rstrip(" ;,.").endswith(KEEPING) else f"{core.rstrip(' ;,')}; {KEEPING}"


def job_exit_code(code: int) -> int:
    """``replan --exit-zero-unless-error``: 0 for the outcomes (unchanged, changed, not enough data), ``code`` for
    an error; a scheduler that marks a non-zero exit failed (a Kubernetes Job) then fails only on errors."""
    return 0 if code in (EXIT_UNCHANGED, EXIT_CHANGED, EXIT_INSUFFICIENT_DATA) else code


def deployment_name(plan: Plan) -> str:
    """History key of a plan: '<workload name>/<model>'."""
    return f"{plan.workload.name or 'workload'}/{plan.workload.model or 'model'}"


def deploy_writer() -> Callable[..., Any] | None:
    """``recommender.deploy.write_deploy_files`` when that package is installed, else None."""
    try:
        deploy = importlib.import_module("recommender.deploy")
    except ModuleNotFoundError as e:
        if e.name and (e.name == "recommender.deploy" or e.name.startswith("recommender.deploy.")):
            return None
        raise
    return getattr(deploy, "write_deploy_files", None)


def write_outputs(plan: Plan, out_dir: Path) -> tuple[str, ...]:
    """The deployment files (when ``recommender.deploy`` exists) and ``out_dir/plan.json`` (:func:`dump_plan`,
    version 2) as one set.

    The deployment files are rendered (and a refused plan rejected) before anything is written. A writer
    that takes ``extra_files`` (``recommender.deploy.write_deploy_files``) swaps the whole set, plan.json
    included, into ``out_dir`` at once; otherwise plan.json is written last (temp file + rename).
    """
    path = out_dir / "plan.json"
    text = dump_plan(plan)
    writer = deploy_writer()
    if writer is not None and "extra_files" in inspect.signature(writer).parameters:
        # recommender.deploy.write_deploy_files: plan.json joins the deployment files' set, swapped in as one
        more = writer(plan, out_dir, extra_files={"plan.json": text})
        return tuple([str(p) for p in more or ()] + [str(path)])
    written: list[str] = []
    if writer is not None:
        more = writer(plan, out_dir)
        if isinstance(more, (list, tuple)):
            written += [str(p) for p in more]
    atomic_write_text(path, text)
    return tuple(written + [str(path)])


def model_predictor(*, profile: Any = None) -> Predictor:
    """``predict_plan`` with the shipped catalog, search policy and ``profile`` (default: vLLM's)."""
    def predict(plan: Plan, workload: Workload, replicas: tuple[int, ...] | None = None) -> Prediction:
        from recommender.replan.predict import predict_plan

        return predict_plan(plan, workload, profile=profile, replicas=replicas)

    return predict


def _smaller_meets(predictor: Predictor, plan: Plan, workload: Workload) -> tuple[tuple[int, ...], Prediction] | None:
    """One replica fewer in one pool that still meets the load (the plan is above its band), else None."""
    cur = plan.top.pool_replicas
    for i, r in enumerate(cur):
        if r > 1:
            fewer = tuple(x - 1 if j == i else x for j, x in enumerate(cur))
            p = predictor(plan, workload, fewer)
            if p.meets:
                return fewer, p
    return None


def _lengths_moved(plan: Plan, workload: Workload, tolerance: float) -> str:
    """Why the observed mean lengths are outside ``tolerance`` of the plan's ('' when within)."""
    out = []
    for key, summary in (("prompt_tokens", plan.workload.prompt_tokens), ("output_tokens", plan.workload.output_tokens)):
        planned = summary.mean if summary is not None else None
        seen = getattr(workload, key).mean
        if planned and abs(seen - planned) > tolerance * planned:
            out.append(f"mean {key.replace('_', ' ')} {seen:.0f} vs {planned:.0f} planned")
    return "; ".join(out)


def scale_down_workload(workload: Workload, obs: Any, policy: Policy, forecast_per_s: float) -> Workload:
    """The workload a search for a cheaper plan sizes for (the current plan is not at risk): the forecast's
    one-sided upper confidence bound at ``band_false_alarm`` for Poisson counts over the window,
    ``(sqrt(forecast x T) + z/2)^2 / T``, x (1 + headroom). A smaller plan is adopted only when it carries
    the highest rate the window's data allows, so noise in the window means does not scale down a plan that
    the next window scales up again; a search at risk sizes for the forecast itself (the rise is real)."""
    from recommender.replan.band import count_edges, z_one_sided

    span_s = max(float(obs.window_s), 1.0)
    high = count_edges(forecast_per_s, span_s, z_one_sided(policy.band_false_alarm))[1] / span_s
    rate = max(float(workload.effective_rate_per_s), high * (1.0 + policy.headroom))
    return dataclasses.replace(workload, arrival_rate_per_s=rate)


def stamp(plan: Plan, *, run_id: str, deployment: str, time_s: float, wanted: str,
          reason: str, window: tuple[float, float] | None) -> Plan:
    """The plan a change writes, carrying which run adopted it (``Plan.replan``; deploy ignores it)."""
    return dataclasses.replace(plan, replan={"run_id": run_id, "deployment": deployment, "time_s": time_s,
                                             "wanted": wanted, "reason": reason,
                                             "window": list(window) if window else None})


def adopted_plan(out_dir: Path | None, deployment: str) -> Plan | None:
    """``out_dir/plan.json`` when an earlier run of ``deployment`` wrote it (its ``replan`` stamp), else None:
    the plan adopted last is the current one of the next run."""
    if out_dir is None or not (out_dir / "plan.json").is_file():
        return None
    try:
        plan = plans.load_current(out_dir / "plan.json")
    except RecommenderError:
        return None
    st = plan.replan
    return plan if st is not None and st.get("deployment") == deployment else None


def recover_lost_row(tx: Transaction, out_dir: Path | None) -> None:
    """A plan.json stamped by a run whose history row is missing (killed between writing the files and
    the commit) is recorded now, so its cooldown is not lost."""
    plan = adopted_plan(out_dir, tx.deployment)
    st = plan.replan if plan is not None else None
    if out_dir is None or plan is None or st is None or not st.get("run_id"):
        return
    if tx.has_run(str(st["run_id"])):
        return
    w = st.get("window")
    tx.record(time_s=float(st.get("time_s") or 0.0), decision="changed", wanted=str(st.get("wanted") or ""),
              reason=f"recovered from {out_dir / 'plan.json'} (its run ended before recording): {st.get('reason', '')}",
              observed=None, current=None, proposed=plan, usd_per_hour_proposed=plans.usd_per_hour(plan),
              run_id=str(st["run_id"]), window=(float(w[0]), float(w[1])) if w else None)


def replan_once(*, current: Plan, source: TrafficSource, planner: Planner, policy: Policy,
                history: History, base: Workload | None = None, deployment: str | None = None,
                out_dir: Path | None = None, clock: Callable[[], float] = time.time,
                predictor: Predictor | None = None) -> ReplanResult:
    """Run one step; never raises for traffic or planner trouble (it is an 'error' result + history row).

    Order: observe -> forecast -> evaluate the current plan under the model at the forecast (risk) ->
    inside the band (meets it at utilisation >= band_min_utilisation, one replica fewer would not, lengths
    as planned): done, no search ->
    else the planner -> evaluate its proposal -> decide, write and record under the deployment's lock.
    """
    dep = deployment or deployment_name(current)
    cur_usd = plans.usd_per_hour(current)
    run_id = uuid.uuid4().hex
    predict = predictor or model_predictor()
    window: tuple[float, float] | None = None

    def finish(decision: str, wanted: str, reason: str, code: int, t: float, observed: Any = None,
               proposed: Plan | None = None, written: tuple[str, ...] = (), tx: Transaction | None = None) -> ReplanResult:
        reason = bounded(reason, MAX_ERROR_REASON_CHARS if decision == "error" else MAX_REASON_CHARS)
        row = dict(time_s=t, decision=decision, wanted=wanted, reason=reason, observed=observed, current=current,
                   proposed=proposed, usd_per_hour_current=cur_usd, run_id=run_id, window=window,
                   usd_per_hour_proposed=None if proposed is None else plans.usd_per_hour(proposed))
        if tx is not None:
            tx.record(**row)
        else:
            history.record(deployment=dep, **row)
        return ReplanResult(decision, reason, current, proposed, observed, code, t, written)

    try:
        obs = check_observation(source.observe())  # shape and physics before any use
    except InsufficientDataError as e:
        return finish("unchanged", "", str(e), e.exit_code, clock())
    except RecommenderError as e:  # unreachable, malformed, refused readings, a special file as the state
        return finish("error", "", keeping(str(e)), e.exit_code, clock())
    except Exception as e:  # noqa: BLE001 - a source bug must not kill a --watch loop or skip its history row
        return finish("error", "", keeping(f"traffic source failed ({type(e).__name__}: {bounded(str(e), 200)})"),
                      2, clock())
    now = obs.end_s
    window = obs.window
    forecast = _forecast(history, dep, obs, policy)
    try:
        base_wl = base if base is not None else base_workload_from_plan(current)
        workload, notes = observed_workload(obs, base_wl, current, policy, forecast)
    except RecommenderError as e:
        return finish("error", "", keeping(str(e)), e.exit_code, now)
    observed_risks = slo_risks(obs, base_wl.slos, policy)
    band = check_band(obs, current, false_alarm=policy.band_false_alarm, subwindow_s=policy.subwindow_s,
                      min_requests=policy.min_requests)
    observed: dict[str, Any] = {
        **obs.to_dict(), "forecast_method": policy.forecast_method, "forecast_rate_per_s": round(forecast, 4),
        "headroom": policy.headroom, "planned_rate_per_s": workload.arrival_rate_per_s,
        "slo": slo_attainment(obs, base_wl.slos, policy), "notes": list(obs.notes) + notes,
        "sizing": None if band is None else band.to_dict(), "workload": workload.to_dict()}
    workload, burst_risks, burst_holds = _burst(predict, current, workload, band, observed)
    own_traffic = band is not None and band.rate_inside and not band.lengths and not observed_risks and (
        not band.burst or bool(burst_holds))
    pred = None if own_traffic else _predict_current(predict, current, workload, observed)
    risks = _risks(pred, policy) + burst_risks + observed_risks
    observed["slo_risks"] = risks
    if pred is not None:
        observed["current_predicted"] = pred.to_dict()
    in_band = ""
    if own_traffic and band is not None:
        in_band = (f"{band.where()}{burst_holds}: the plan was sized for this traffic; "
                   f"keeping {plans.describe(current)}, no search")
    elif pred is not None and not risks:
        in_band = _within_band(predict, current, workload, pred, policy, forecast, burst_holds)
    proposal_meets: str | None = ""
    if in_band:
        proposed = current
    else:
        try:
            proposed = plans.check_plan(planner(scale_down_workload(workload, obs, policy, forecast) if not risks
                                                else workload, current), "the planner's proposal")
        except RecommenderError as e:
            return finish("error", "", keeping(f"planner failed for the observed workload ({bounded(str(e), 300)})"),
                          e.exit_code, now, observed)
        except Exception as e:  # noqa: BLE001 - a planner bug must not kill a --watch loop or print a traceback
            return finish("error", "", keeping(f"planner crashed ({type(e).__name__}: {bounded(str(e), 200)}); please "
                                               f"report this with the observed workload from `recommend history "
                                               f"--full --format json`"), 2, now, observed)
        proposal_meets = _proposal_meets(predict, proposed, workload, observed)
    # P(all SLOs met) of each plan's rank 1 from its bands (recommender.search.bands), at the workload it was made
    # for: the proposal's is at this run's forecast; None for plans written without bands
    observed["p_slo_met"] = {"current": _p_slo(current), "proposed": _p_slo(proposed)}
    with history.decision(dep) as tx:
        recover_lost_row(tx, out_dir)
        if in_band:
            return finish("unchanged", "none", in_band, EXIT_UNCHANGED, now, observed, proposed, tx=tx)
        past = _past_runs(tx, policy, now, obs.window_s)
        d = decide(policy, current=current, proposed=proposed, risks=risks, past=past, now_s=now, window=window,
                   proposal_meets=proposal_meets)
        if not d.changed:
            return finish("unchanged", d.wanted, d.reason, EXIT_UNCHANGED, now, observed, d.plan, tx=tx)
        plan = stamp(d.plan, run_id=run_id, deployment=dep, time_s=now, wanted=d.wanted, reason=d.reason,
                     window=window)
        written: tuple[str, ...] = ()
        if out_dir is not None:
            try:
                written = write_outputs(plan, out_dir)
            except (RecommenderError, OSError) as e:
                return finish("error", d.wanted, f"decided to change ({d.reason}) but writing {out_dir} failed: {e}; "
                              f"the deployed plan is unchanged", getattr(e, "exit_code", 2), now, observed, plan, tx=tx)
        return finish("changed", d.wanted, d.reason, EXIT_CHANGED, now, observed, plan, written, tx=tx)


def _forecast(history: History, dep: str, obs: Observation, policy: Policy) -> float:
    """The policy's forecast rate (req/s) from this window's rate points and earlier runs' of the same source (the
    points ending before this window starts), over the policy's lookback."""
    now = obs.end_s
    past_records = history.list(deployment=dep, limit=max(50, 4 * policy.scale_down_windows))
    horizon = now - policy.lookback_s - obs.window_s
    if len(past_records) >= max(50, 4 * policy.scale_down_windows) and past_records[-1].time_s > horizon:
        past_records = history.list(deployment=dep, since_s=horizon)  # frequent runs: cover the whole lookback
    window_start = obs.end_s - obs.window_s
    earlier = [p for r in past_records if r.observed and r.observed.get("source") == obs.source
               for p in rate_points_from_observed(r.observed) if p.end_s <= window_start + 1e-6]
    return forecast_rate_per_s(merge_points(earlier, obs.rate_points), policy, now)


def _burst(predict: Predictor, current: Plan, workload: Workload, band: BandCheck | None,
           observed: dict[str, Any]) -> tuple[Workload, list[str], str]:
    """A real burst above the rate the model is asked about anyway: the plan under the model at the burst's rate.
    Returns (the workload a proposal must carry, the burst's SLO risks, a note that the SLOs hold at it); records the
    prediction (and a carried burst's rate and workload) in ``observed``."""
    if band is None or not band.burst or band.burst_per_s <= workload.effective_rate_per_s:
        return workload, [], ""
    at_burst = dataclasses.replace(workload, arrival_rate_per_s=band.burst_per_s)
    try:
        bp = predict(current, at_burst)
    except RecommenderError as e:
        observed["notes"].append(f"the burst could not be evaluated under the model ({e})")
        return workload, [], ""
    observed["burst_predicted"] = bp.to_dict()
    if not bp.slo_misses:  # the utilisation cap is the sizing margin: a burst acts only on an SLO
        return workload, [], (f"; at the burst's {band.burst_per_s:.2f} req/s the model predicts "
                              f"{bp.summary(at_burst)}: the SLOs hold")
    observed["planned_rate_per_s"] = at_burst.arrival_rate_per_s
    observed["workload"] = at_burst.to_dict()
    return at_burst, [f"burst of {band.burst_per_s:.2f} req/s ({band.record.text()}): {m}" for m in bp.slo_misses], ""


def _predict_current(predict: Predictor, current: Plan, workload: Workload, observed: dict[str, Any]) -> Prediction | None:
    """The current plan under the model at the planned workload; None, with a note in ``observed``, when the model
    cannot evaluate it (the run then searches)."""
    try:
        return predict(current, workload)
    except RecommenderError as e:
        observed["notes"].append(f"the current plan could not be evaluated under the model ({e}); searching")
        return None


def _risks(pred: Prediction | None, policy: Policy) -> list[str]:
    """The SLOs the current plan misses under the model, and a risk where the point prediction meets them but the
    band's pessimistic end at the policy's confidence does not."""
    if pred is None:
        return []
    risks = list(pred.misses)
    if pred.meets and pred.p_slo is not None and pred.p_slo < policy.slo_risk_confidence:
        risks.append(f"P(all SLOs met) {pred.p_slo:.2f} < {policy.slo_risk_confidence:g} at "
                     f"{pred.rate_per_s:.2f} req/s (the plan's error band)")
    return risks


def _proposal_meets(predict: Predictor, proposed: Plan, workload: Workload, observed: dict[str, Any]) -> str | None:
    """The proposal under the model: its summary where it meets the SLOs, None where it misses, "" where the model
    cannot evaluate it (the planner's own evaluation stands)."""
    try:
        pp = predict(proposed, workload)
    except RecommenderError:
        return ""
    observed["proposed_predicted"] = pp.to_dict()
    return pp.summary(workload) if pp.meets else None


def _within_band(predict: Predictor, current: Plan, workload: Workload, pred: Prediction, policy: Policy,
                 forecast: float, burst_holds: str) -> str:
    """Why no search is needed when the current plan meets the SLOs at the forecast: lengths as planned, busy
    enough (utilisation >= band_min_utilisation) and one replica fewer would miss; "" when a search is."""
    if _lengths_moved(current, workload, policy.band_length_tolerance) or pred.utilisation < policy.band_min_utilisation:
        return ""
    if _smaller_meets(predict, current, workload) is not None:
        return ""
    single = all(r <= 1 for r in current.top.pool_replicas)
    fewer = "it runs one replica per pool" if single else "one replica fewer would miss"
    return (f"traffic is within the current plan's band: at the forecast {forecast:.2f} req/s "
            f"(+{policy.headroom:.0%} = {workload.effective_rate_per_s:.2f} req/s) the model predicts "
            f"{pred.summary(workload)} and {fewer}{burst_holds}; no search needed")


def _p_slo(plan: Plan) -> float | None:
    b = plan.top.bands
    p = b.get("p_slo") if b else None
    return float(p) if isinstance(p, (int, float)) else None


def _past_runs(tx: Transaction, policy: Policy, now: float, window_s: float) -> list[PastRun]:
    """Earlier runs newest first (read under the lock), covering the streak and the last change."""
    n = max(50, 4 * policy.scale_down_windows)
    records = tx.list(limit=n)
    past = [r.past() for r in records]
    if not any(p.decision == "changed" for p in past):
        last = tx.last_change()
        if last is not None:
            past.append(last.past())
    return past


def watch(step: Callable[[Plan], ReplanResult], current: Plan, interval_s: float, *,
          on_result: Callable[[ReplanResult], None], sleep: Callable[[float], None] = time.sleep,
          iterations: int | None = None) -> ReplanResult | None:
    """Run ``step(current)`` every ``interval_s`` until interrupted (or ``iterations`` runs).

    After a change the adopted plan becomes the current one. Errors are reported and the loop goes on (a cycle
    that raises, e.g. the history database being unreachable, becomes an 'error' result; KeyboardInterrupt ends it).
    """
    last = None
    n = 0
    while iterations is None or n < iterations:
        started = time.monotonic()
        try:
            last = step(current)
        except RecommenderError as e:  # e.g. the history database went away: report, keep watching
            last = ReplanResult("error", keeping(str(e)), current, None, None, e.exit_code, time.time())
        except Exception as e:  # noqa: BLE001 - one failed cycle must not end the loop
            last = ReplanResult("error", keeping(f"run failed ({type(e).__name__}: {bounded(str(e), 200)})"), current,
                                None, None, 2, time.time())
        on_result(last)
        if last.changed and last.proposed is not None:
            current = last.proposed
        n += 1
        if iterations is not None and n >= iterations:
            break
        sleep(max(0.0, interval_s - (time.monotonic() - started)))
    return last
