"""Re-planning policy: ``policies/replan.yaml`` (pydantic at the edge) and the change decision.

"At risk" is decided before this module is called (``runner``): the current plan, evaluated under the
model at the forecast load with headroom and the observed lengths, misses an SLO or exceeds the
utilisation cap, or an observed latency percentile breaks an SLO. The decision then compares the
current plan with the planner's proposal:

* same deployment (same shape and replicas) -> unchanged;
* at risk -> take the proposal now (no cooldown, no replica-step cap) if the model says it meets the
  forecast: the planner's rank 1 is the cheapest plan it found that does, so an equal or cheaper one always
  qualifies and a dearer one is no dearer than needed. Never keep a plan the model says fails when a
  feasible proposal exists;
* not at risk, proposal costs more -> unchanged (the current plan meets the forecast);
* not at risk, proposal costs less -> switch only if the saving ``(usd_now - usd_new) / usd_now >=
  min_saving``, the last ``scale_down_windows`` windows of NEW data (this one included) all wanted to go
  down, and the cooldown has passed. A window is new data when its observed time range does not overlap
  (by more than ``max(1 s, 2%)`` of the shorter one) a window already counted: a log replayed
  twice, or two runs over the same minutes, count once. The plan adopted is the most expensive of those
  windows' proposals (a stabilisation window, as Kubernetes' HPA does);
* a same-shape change that is not forced by a risk moves each pool by at most ``max_replica_change``
  replicas per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from recommender import units
from recommender.errors import ConfigError, UnitError
from recommender.plan import Plan
from recommender.plan.cost import with_replicas
from recommender.replan import plans
from recommender.yamlfile import validation_message


# ---------------------------------------------------------------------------------------------
# the policy (frozen, SI units)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Policy:
    """All durations in seconds, fractions as 0..1."""

    headroom: float = 0.2  # the search policy's (policies/search.yaml): set once, for plans and re-plans
    window_s: float = 900.0
    forecast_method: str = "mean"  # "mean" | "peak" | "ewma"
    subwindow_s: float = 60.0
    ewma_halflife_s: float = 600.0
    lookback_s: float = 3600.0
    min_saving: float = 0.10
    cooldown_s: float = 1800.0
    max_replica_change: int | None = 4
    scale_down_windows: int = 3
    slo_risk_factor: float = 1.0
    slo_risk_min_requests: int = 50
    slo_risk_confidence: float = 0.5  # at risk when P(all SLOs met) at the forecast is below this (0.5: the point prediction)
    min_scrape_interval_s: float = 30.0
    max_scrape_interval_s: float = 3600.0
    wait_for_baseline: bool = True
    scrape_timeout_s: float = 10.0
    min_requests: int = 20
    min_span_s: float = 60.0
    max_length_samples: int = 2000
    min_rate_per_s: float = 0.01
    band_length_tolerance: float = 0.25
    band_min_utilisation: float = 0.3
    band_false_alarm: float = 0.001


def _dur(v: Any, what: str) -> float:
    try:
        return units.parse_duration_s(v, what)
    except UnitError as e:
        raise ValueError(str(e)) from None


class _Forecast(BaseModel):
    model_config = ConfigDict(extra="forbid")
    method: Literal["mean", "peak", "ewma"] = "mean"
    subwindow: str | float = "1m"
    ewma_halflife: str | float = "10m"
    lookback: str | float = "1h"


class _SloRisk(BaseModel):
    model_config = ConfigDict(extra="forbid")
    factor: float = Field(default=1.0, gt=0)
    min_requests: int = Field(default=50, ge=1)
    confidence: float = Field(default=0.5, ge=0.5, lt=1.0)


class _Metrics(BaseModel):
    model_config = ConfigDict(extra="forbid")
    min_scrape_interval: str | float = "30s"
    max_scrape_interval: str | float = "1h"
    wait_for_baseline: bool = True
    timeout: str | float = "10s"


class _Data(BaseModel):
    model_config = ConfigDict(extra="forbid")
    min_requests: int = Field(default=20, ge=1)
    min_span: str | float = "60s"
    max_length_samples: int = Field(default=2000, ge=10)
    min_rate_per_s: float = Field(default=0.01, gt=0)


class _Band(BaseModel):
    model_config = ConfigDict(extra="forbid")
    length_tolerance: float = Field(default=0.25, ge=0.0, le=10.0)
    min_utilisation: float = Field(default=0.3, ge=0.0, le=1.0)
    false_alarm: float = Field(default=0.001, gt=0.0, lt=0.5)


class PolicySpec(BaseModel):
    """Schema of ``policies/replan.yaml`` (human durations like '5m', '30s')."""

    model_config = ConfigDict(extra="forbid")
    version: Literal[1] = 1
    headroom: float | None = None  # refused: the headroom is set once, in policies/search.yaml
    window: str | float = "15m"
    forecast: _Forecast = _Forecast()
    min_saving: float = Field(default=0.10, ge=0.0, lt=1.0)
    cooldown: str | float = "30m"
    max_replica_change: int | None = Field(default=4, ge=1)
    scale_down_windows: int = Field(default=3, ge=1)
    slo_risk: _SloRisk = _SloRisk()
    metrics: _Metrics = _Metrics()
    data: _Data = _Data()
    band: _Band = _Band()

    @field_validator("window", "cooldown")
    @classmethod
    def _durations(cls, v: Any, info: Any) -> Any:
        _dur(v, info.field_name)
        return v

    def build(self, headroom: float = 0.2) -> Policy:
        """The frozen policy; ``headroom`` is the search policy's (the one sizing basis)."""
        if self.headroom is not None:
            raise ValueError("headroom is set once, in policies/search.yaml (the sizing basis shared by the search and "
                             "replan, docs/sizing-basis.md); remove it from the replan policy")
        f, m, d = self.forecast, self.metrics, self.data
        p = Policy(
            headroom=headroom, window_s=_dur(self.window, "window"), forecast_method=f.method,
            subwindow_s=_dur(f.subwindow, "forecast.subwindow"), ewma_halflife_s=_dur(f.ewma_halflife, "forecast.ewma_halflife"),
            lookback_s=_dur(f.lookback, "forecast.lookback"), min_saving=self.min_saving,
            cooldown_s=_dur(self.cooldown, "cooldown"), max_replica_change=self.max_replica_change,
            scale_down_windows=self.scale_down_windows, slo_risk_factor=self.slo_risk.factor,
            slo_risk_min_requests=self.slo_risk.min_requests, slo_risk_confidence=self.slo_risk.confidence,
            min_scrape_interval_s=_dur(m.min_scrape_interval, "metrics.min_scrape_interval"),
            max_scrape_interval_s=_dur(m.max_scrape_interval, "metrics.max_scrape_interval"),
            wait_for_baseline=m.wait_for_baseline, scrape_timeout_s=_dur(m.timeout, "metrics.timeout"),
            min_requests=d.min_requests, min_span_s=_dur(d.min_span, "data.min_span"),
            max_length_samples=d.max_length_samples, min_rate_per_s=d.min_rate_per_s,
            band_length_tolerance=self.band.length_tolerance, band_min_utilisation=self.band.min_utilisation,
            band_false_alarm=self.band.false_alarm)
        for name in ("window_s", "subwindow_s", "ewma_halflife_s", "lookback_s", "min_scrape_interval_s",
                     "max_scrape_interval_s", "scrape_timeout_s"):
            if getattr(p, name) <= 0:
                raise ValueError(f"{name[:-2]} must be positive")
        if p.subwindow_s > p.window_s:
            raise ValueError("forecast.subwindow must not exceed window")
        if p.max_scrape_interval_s < p.min_scrape_interval_s:
            raise ValueError("metrics.max_scrape_interval must be >= metrics.min_scrape_interval")
        return p


def search_headroom() -> float:
    """The headroom of ``policies/search.yaml``: plans are sized with it, and re-plans size with it too."""
    from recommender.search.policy import load_search_policy

    return load_search_policy().headroom


def policy_from_dict(doc: Mapping[str, Any], where: str = "<policy>", headroom: float | None = None) -> Policy:
    """``doc`` validated; ``headroom`` defaults to the search policy's."""
    try:
        return PolicySpec.model_validate(doc).build(search_headroom() if headroom is None else headroom)
    except ValidationError as e:
        raise ConfigError(validation_message(e, where, model=PolicySpec)) from None
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None


def load_policy(path: str | Path | None) -> Policy:
    """Read a policy YAML file; None gives the defaults (the values in policies/replan.yaml)."""
    if path is None:
        return Policy(headroom=search_headroom())
    from recommender.yamlfile import read_yaml_file

    doc = read_yaml_file(path, "policy", "see policies/replan.yaml")
    return policy_from_dict(doc or {}, str(path))


# ---------------------------------------------------------------------------------------------
# the decision
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PastRun:
    """What the decision needs from an earlier run of the same deployment (from the history DB)."""

    time_s: float
    decision: str  # "changed" | "unchanged" | "error"
    wanted: str  # "up" | "down" | "none" | "" (no decision: error / insufficient data)
    proposed: Plan | None
    window: tuple[float, float] | None = None  # observed time range (unix s); None: unknown (not new data)


@dataclass(frozen=True)
class Decision:
    changed: bool
    wanted: str  # what the planner's proposal asked for: "up" | "down" | "none"
    reason: str
    plan: Plan  # the plan adopted (changed) or the one that would have been (unchanged)


def _fmt_dur(s: float) -> str:
    return f"{s / 60:.0f} min" if s >= 120 else f"{s:.0f} s"


def _fmt_window(w: tuple[float, float]) -> str:
    a, b = (datetime.fromtimestamp(x, tz=timezone.utc) for x in w)
    fmt = "%H:%M:%S" if a.date() == b.date() else "%Y-%m-%d %H:%M:%S"
    return f"{a.strftime('%Y-%m-%d %H:%M:%S')}-{b.strftime(fmt)}"


def overlaps(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """True when two time ranges share more than ``max(1 s, 2%)`` of the shorter one."""
    shared = min(a[1], b[1]) - max(a[0], b[0])
    shorter = min(a[1] - a[0], b[1] - b[0])
    return shared > max(1.0, 0.02 * shorter)


def _cap(current: Plan, target: Plan, max_change: int | None) -> tuple[Plan, str]:
    """Limit a same-shape change to ``max_change`` replicas per pool; returns (plan, note). The capped plan is
    ``target`` resized by :func:`recommender.plan.cost.with_replicas` (whole instances re-rented)."""
    cur_row, new_row = current.top, target.top
    if max_change is None or not plans.same_shape(cur_row, new_row):
        return target, ""
    old, new = cur_row.pool_replicas, new_row.pool_replicas
    capped = tuple(o + max(-max_change, min(max_change, n - o)) for o, n in zip(old, new))
    if capped == new:
        return target, ""
    note = (f"capped at {max_change} replica(s) per step: {'+'.join(map(str, old))} -> {'+'.join(map(str, capped))} "
            f"(planner asked for {'+'.join(map(str, new))}; the next runs continue)")
    return with_replicas(target, capped, note), note


def agreeing_windows(past: Sequence[PastRun], window: tuple[float, float] | None) -> tuple[list[PastRun], int]:
    """Earlier runs since the last change, newest first, that wanted to go down on NEW data.

    Returns (agreeing runs, runs skipped because their window overlaps one already counted, this run's
    included). Runs without a decision (error / insufficient data) neither count nor break the streak;
    a run over new data that did not want to go down ends it.
    """
    counted = [window] if window is not None else []
    out: list[PastRun] = []
    repeated = 0
    for r in past:
        if r.decision == "changed":
            break
        if r.wanted in ("", "error"):
            continue
        if r.window is None or any(overlaps(r.window, w) for w in counted):
            repeated += 1
            continue
        if r.wanted != "down":
            break
        out.append(r)
        counted.append(r.window)
    return out, repeated


def decide(policy: Policy, *, current: Plan, proposed: Plan, risks: Sequence[str],
           past: Sequence[PastRun], now_s: float, window: tuple[float, float] | None = None,
           proposal_meets: str | None = "") -> Decision:
    """Apply the policy (see the module docstring).

    ``past``: earlier runs of this deployment, newest first. ``window``: this run's observed time range.
    ``proposal_meets``: the model's verdict on the proposal at the forecast ("" = not evaluated; None =
    it misses; else a summary such as 'tpot p90 25 ms, utilisation 0.61').
    """
    cur_usd, new_usd = plans.usd_per_hour(current), plans.usd_per_hour(proposed)
    cur_desc, new_desc = plans.describe(current), plans.describe(proposed)
    risk_txt = "; ".join(risks)
    last_change = next((r for r in past if r.decision == "changed"), None)
    cooldown_left = (policy.cooldown_s - (now_s - last_change.time_s)) if last_change else 0.0
    prop = proposed
    if plans.same_deployment(current.top, proposed.top):
        why = f"SLO at risk ({risk_txt}) but the planner finds no better plan than the current one; investigate the engine" \
            if risks else "the planner proposes the current deployment"
        return Decision(False, "none", f"{why}: {cur_desc}", prop)
    direction = "up" if new_usd > cur_usd else ("down" if new_usd < cur_usd else "none")
    if risks:
        if proposal_meets is None:
            return Decision(False, direction, f"SLO at risk ({risk_txt}), but the proposed {new_desc} misses the "
                            f"forecast too under the model; keeping {cur_desc}", prop)
        plan, note = (prop, "") if direction == "up" else _cap(current, prop, policy.max_replica_change)
        meets = f" (predicted at the forecast: {proposal_meets})" if proposal_meets else ""
        return Decision(True, direction, f"SLO at risk: {risk_txt}; acting now: {plans.describe_change(current, plan)}"
                        f"{meets}" + (f" ({note})" if note else ""), plan)
    if new_usd > cur_usd:
        return Decision(False, "none", f"the current plan meets the forecast under the model; not switching to the "
                        f"dearer {new_desc}", prop)
    saving = (cur_usd - new_usd) / cur_usd if cur_usd > 0 else 0.0
    if saving < policy.min_saving:
        return Decision(False, "none", f"{new_desc} would save {saving:.1%} of ${cur_usd:.2f}/h, below the "
                        f"{policy.min_saving:.0%} minimum to switch; keeping {cur_desc}", prop)
    streak, repeated = agreeing_windows(past, window)
    agreeing = len(streak) + 1
    seen = f" ({repeated} earlier run(s) over the same data not counted)" if repeated else ""
    if agreeing < policy.scale_down_windows:
        return Decision(False, "down", f"{new_desc} would save {saving:.1%}; {agreeing} of {policy.scale_down_windows} "
                        f"windows of new data agree so far{seen}, waiting for {policy.scale_down_windows - agreeing} "
                        f"more", prop)
    if cooldown_left > 0 and last_change is not None:
        return Decision(False, "down", f"{new_desc} would save {saving:.1%}, but the last change was "
                        f"{_fmt_dur(now_s - last_change.time_s)} ago ({_fmt_dur(cooldown_left)} of cooldown left)", prop)
    used = streak[: policy.scale_down_windows - 1]
    target = max([prop] + [r.proposed for r in used if r.proposed is not None], key=plans.usd_per_hour)
    stabilised = target is not prop
    t_usd = plans.usd_per_hour(target)
    t_saving = (cur_usd - t_usd) / cur_usd if cur_usd > 0 else 0.0
    if t_saving < policy.min_saving:
        return Decision(False, "down", f"this window's {new_desc} would save {saving:.1%}, but the largest plan of the "
                        f"last {policy.scale_down_windows} windows saves only {t_saving:.1%}; keeping {cur_desc}", prop)
    plan, note = _cap(current, target, policy.max_replica_change)
    wins = [w for w in [window] + [r.window for r in used] if w is not None]
    which = f" ({', '.join(_fmt_window(w) for w in sorted(wins))} UTC)" if wins else ""
    extra = f"; largest plan of the last {policy.scale_down_windows} windows" if stabilised else ""
    return Decision(True, "down", f"{policy.scale_down_windows} windows of new data agree{which}: "
                    f"{plans.describe_change(current, plan)} saves {(cur_usd - plans.usd_per_hour(plan)) / cur_usd:.1%}{extra}"
                    + (f" ({note})" if note else ""), plan)
