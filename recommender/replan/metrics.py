"""vLLM ``/metrics`` as a traffic source: scrape, diff against the previous scrape, observe.

The exposition is parsed with ``prometheus_client.parser.text_string_to_metric_families`` (the
reference parser). Samples are matched by their exposed names (vLLM 0.33, prometheus_client text
format): counters ``<name>_total`` (+ ``<name>_created``), histograms ``<name>_bucket{le=...}``,
``_sum``, ``_count`` (+ ``_created``), gauges by name. Every label set (``engine``, ``model_name``,
``finished_reason``) of a sample name is summed, so one URL = one replica with any number of engines. Given the
plan's :class:`~recommender.replan.plans.ServedModel`, a series whose ``model_name`` is another model is left out
(with a note); an endpoint that serves only other models is refused in one line.

A window counts only with at least ``min_requests`` finished requests of the plan's model (over all URLs), as a
request log's does; with fewer the run ends "not enough data" (exit 11) and keeps its baseline, so the next run
diffs against the same scrapes over a longer window (up to ``max_interval_s``).

The prefix-cache counters (``vllm:prefix_cache_queries_total`` / ``_hits_total``, in tokens) give the
observed prefix share ``hits / queries`` of the window when every endpoint exposes them.

Rates come from counter deltas: ``rate = (c(t1) - c(t0)) / (t1 - t0)`` per URL, summed over URLs.
A restarted pod (its ``_created`` timestamp moved, or a counter went down) is a reset: the new value
is the delta since the restart and the window is ``t1 - created`` (``t1 - t0`` if no ``_created``).
The previous scrape of every URL is kept between runs in a small JSON state file written atomically; runs
sharing the file merge their URLs into it under an exclusive lock (:mod:`recommender.replan.filelock`).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from prometheus_client.parser import text_string_to_metric_families

from recommender.atomic import atomic_write_text
from recommender.bounded import fetch_url_bytes, load_json_text, read_file_text
from recommender.errors import ConfigError, RecommenderError, TrafficSourceError
from recommender.httpread import HttpStatusError, printable
from recommender.replan.filelock import locked
from recommender.replan.plans import ServedModel
from recommender.units import MAX_UNIX_S
from recommender.replan.observation import (
    EMPTY_HISTOGRAM, MAX_GAUGE_REQUESTS, Histogram, InsufficientDataError, LengthObservation, Observation, RatePoint,
    check_histogram, check_number,
)

COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total")
# optional: prompt tokens looked up in / served from the prefix cache (observed prefix share = hits / queries)
PREFIX_COUNTERS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")
HISTOGRAMS = {
    "vllm:request_prompt_tokens": "prompt_tokens",
    "vllm:request_generation_tokens": "output_tokens",
    "vllm:time_to_first_token_seconds": "ttft",
    "vllm:inter_token_latency_seconds": "tpot",
    "vllm:e2e_request_latency_seconds": "e2e",
    "vllm:request_queue_time_seconds": "queue",
}
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
STATE_VERSION = 1
#: largest counter value read (tokens served since a pod started): 1e18 is ~30 years at 1e9 tokens/s
MAX_COUNTER = 1e18
#: the state holds one scrape per URL (a few kB each)
MAX_STATE_BYTES = 16 * 1024**2

Fetch = Callable[..., str]  # (url, timeout_s[, headers]) -> body


@dataclass(frozen=True)
class Scrape:
    """One URL's metrics at ``time_s`` (unix), every label set summed per sample name."""

    url: str
    time_s: float
    counters: Mapping[str, float]
    histograms: Mapping[str, Histogram]
    gauges: Mapping[str, float]  # running/waiting summed over engines; kv_cache_usage_perc: max
    created_s: float | None = None  # process start as the earliest ``_created`` of the request counter
    models: tuple[str, ...] = ()
    other_models: tuple[str, ...] = ()  # model_name values left out (not the plan's model); not saved

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "time_s": self.time_s, "counters": dict(self.counters),
                "histograms": {k: h.to_json() for k, h in self.histograms.items()},
                "gauges": dict(self.gauges), "created_s": self.created_s, "models": list(self.models)}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> "Scrape":
        """A saved scrape, held to the same physics as a fresh one (a hand-edited state cannot fake traffic)."""
        url = str(d["url"])
        what = f"saved scrape of {url[:80]}"
        time_s = check_number(d["time_s"], f"{what}: time_s", limit=MAX_UNIX_S, unit=" s")
        counters = {str(k): check_number(v, f"{what}: counter {k}", limit=MAX_COUNTER) for k, v in d["counters"].items()}
        missing = [n for n in COUNTERS if n not in counters]
        if missing or any(n not in d["histograms"] for n in HISTOGRAMS):
            raise KeyError(f"{what} lacks {', '.join(missing) or 'a histogram'}")
        hist = {str(k): check_histogram(Histogram.from_json(h), f"{what}: histogram {k}")
                for k, h in d["histograms"].items()}
        gauges = {str(k): check_number(v, f"{what}: gauge {k}", limit=MAX_GAUGE_REQUESTS) for k, v in d["gauges"].items()}
        created = d.get("created_s")
        return Scrape(url, time_s, counters, hist, gauges,
                      None if created is None else check_number(created, f"{what}: created_s", limit=MAX_UNIX_S),
                      tuple(str(m) for m in d.get("models", ())))


#: characters of a server's text (a parser error's line, a label) a message quotes
EXCERPT_CHARS = 120


def _plan_model(label: str, served: ServedModel | None, seen: dict[str, bool]) -> bool:
    """Whether a sample's ``model_name`` is the plan's model (every name is, without ``served``); memoised in
    ``seen``."""
    if served is None:
        return True
    if label not in seen:
        seen[label] = served.matches(label)
    return seen[label]


def _other_model_error(url: str, others: set[str], served: ServedModel) -> TrafficSourceError:
    names = ", ".join(printable(m, EXCERPT_CHARS) for m in sorted(others)[:3]) + (", ..." if len(others) > 3 else "")
    return TrafficSourceError(f"metrics endpoint {url} serves only model_name {names}, not the plan's model "
                              f"({served.describe()}); point --traffic at the plan's pods, or pass --served-model-name "
                              f"where it is served under a name of its own")


def parse_exposition(text: str, url: str, time_s: float, *, served: ServedModel | None = None) -> Scrape:
    """Parse Prometheus text exposition into a :class:`Scrape`; names every missing family. With ``served``, the
    series of other models (their ``model_name`` label) are left out, and an endpoint serving only those is refused;
    a parser error quotes at most ``EXCERPT_CHARS`` of the page."""
    if not text.strip():
        raise TrafficSourceError(f"metrics endpoint {url} returned an empty page; is it a vLLM server's /metrics?")
    sums: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    created: list[float] = []
    models: set[str] = set()
    others: set[str] = set()
    seen: dict[str, bool] = {}
    kv_usage: list[float] = []
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name.startswith("vllm:") and not math.isfinite(float(s.value)):
                    raise TrafficSourceError(f"metrics endpoint {url}: sample {printable(s.name, EXCERPT_CHARS)} has "
                                             f"the non-finite value {s.value}; is the server healthy?")
                label = s.labels.get("model_name")
                if label and not _plan_model(label, served, seen):
                    others.add(label)
                    continue
                if label:
                    models.add(label)
                if s.name.endswith("_bucket") and "le" in s.labels:
                    le = math.inf if s.labels["le"] in ("+Inf", "Inf", "inf") else float(s.labels["le"])
                    b = buckets.setdefault(s.name[: -len("_bucket")], {})
                    b[le] = b.get(le, 0.0) + float(s.value)
                elif s.name == "vllm:request_success_created":
                    created.append(float(s.value))
                elif s.name == "vllm:kv_cache_usage_perc":
                    kv_usage.append(float(s.value))
                else:
                    sums[s.name] = sums.get(s.name, 0.0) + float(s.value)
    except ValueError as e:
        raise TrafficSourceError(f"metrics endpoint {url} is not valid Prometheus text exposition: "
                                 f"{printable(str(e), EXCERPT_CHARS)}") from None
    if served is not None and others and not any(n in sums for n in COUNTERS):
        raise _other_model_error(url, others, served)
    missing = [n for n in COUNTERS if n not in sums]
    missing += [n for n in HISTOGRAMS if n not in buckets or f"{n}_sum" not in sums or f"{n}_count" not in sums]
    missing += [n for n in GAUGES if n not in sums and not (n == "vllm:kv_cache_usage_perc" and kv_usage)]
    if missing:
        raise TrafficSourceError(
            f"metrics endpoint {url} lacks the vLLM families {', '.join(missing)}; point --traffic at a vLLM "
            f"(>= 0.10, V1 engine) server's /metrics, not a router or another exporter")
    histograms: dict[str, Histogram] = {}
    for name in HISTOGRAMS:
        edges = tuple(sorted(buckets[name]))
        if not edges or not math.isinf(edges[-1]):
            raise TrafficSourceError(f"metrics endpoint {url}: histogram {name} has no le=\"+Inf\" bucket")
        h = check_histogram(Histogram(edges, tuple(buckets[name][e] for e in edges), sums[f"{name}_sum"]),
                            f"metrics endpoint {url}: histogram {name}")
        if abs(h.count - sums[f"{name}_count"]) > 1e-6 * max(1.0, h.count):
            raise TrafficSourceError(f"metrics endpoint {url}: histogram {name} counts {h.count:g} in its +Inf bucket "
                                     f"but {sums[f'{name}_count']:g} in {name}_count; they must agree")
        histograms[name] = h
    for n in (*COUNTERS, *PREFIX_COUNTERS, *(f"{h}_count" for h in HISTOGRAMS)):
        if n in sums:
            check_number(sums[n], f"metrics endpoint {url}: counter {n}", limit=MAX_COUNTER)
    for n in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
        check_number(sums[n], f"metrics endpoint {url}: gauge {n}", limit=MAX_GAUGE_REQUESTS)
    for v in kv_usage or [sums["vllm:kv_cache_usage_perc"]]:
        check_number(v, f"metrics endpoint {url}: gauge vllm:kv_cache_usage_perc", limit=1.0 + 1e-9)
    gauges = {"vllm:num_requests_running": sums["vllm:num_requests_running"],
              "vllm:num_requests_waiting": sums["vllm:num_requests_waiting"],
              "vllm:kv_cache_usage_perc": max(kv_usage) if kv_usage else sums["vllm:kv_cache_usage_perc"]}
    counters = {n: sums[n] for n in COUNTERS}
    if all(n in sums for n in PREFIX_COUNTERS):
        counters.update({n: sums[n] for n in PREFIX_COUNTERS})
    return Scrape(url, time_s, counters, histograms, gauges, min(created) if created else None,
                  tuple(sorted(models)), tuple(printable(m, EXCERPT_CHARS) for m in sorted(others)))


def fetch_url(url: str, timeout_s: float, headers: Mapping[str, str] | None = None) -> str:
    """GET ``url`` (with ``headers``, e.g. Authorization) and return its body; any network/HTTP failure is
    a TrafficSourceError (the message never repeats the headers)."""
    try:
        body = fetch_url_bytes(url, timeout_s, "metrics endpoint", headers=headers)
    except HttpStatusError as e:
        hint = ("check the credentials (--bearer-token-file / --bearer-token-env / --basic-auth-user)"
                if e.code in (401, 403) else "check the URL (vLLM serves /metrics on its API port)")
        raise TrafficSourceError(f"{e}; {hint}") from None
    except ConfigError as e:  # deadline, size limit, malformed answer, redirect elsewhere, unreachable
        raise TrafficSourceError(str(e)) from None
    except (OSError, ValueError) as e:  # not expected from http_get; never a traceback in a --watch loop
        raise TrafficSourceError(f"metrics endpoint {printable(url)} could not be read ({e})") from None
    text: str = body.decode("utf-8", errors="replace")
    return text


# ---------------------------------------------------------------------------------------------
# state between runs
# ---------------------------------------------------------------------------------------------
def load_state(path: Path) -> dict[str, Scrape]:
    """Previous scrape per URL; a missing file is an empty state, a corrupt one is an error."""
    try:
        if not path.exists():
            return {}
        doc = load_json_text(read_file_text(path, "replan state file", limit=MAX_STATE_BYTES), str(path))
    except (OSError, ValueError, RecommenderError) as e:
        raise TrafficSourceError(f"replan state file {path} is unreadable ({e}); delete it to start a fresh "
                                 f"baseline") from None
    try:
        return {str(url): Scrape.from_json(s) for url, s in doc.get("scrapes", {}).items()}
    except (KeyError, TypeError, ValueError, AttributeError, RecommenderError) as e:
        raise TrafficSourceError(f"replan state file {path} is malformed ({e}); delete it to start a fresh "
                                 f"baseline") from None


def save_state(path: Path, scrapes: Mapping[str, Scrape]) -> None:
    """Write the state atomically (``recommender.atomic``); keeps other URLs.

    The read-merge-write runs under the state file's lock (:mod:`recommender.replan.filelock`), so
    concurrent runs sharing one state file each add their URLs and none is lost."""
    try:
        with locked(path):
            old: Any = {}
            try:
                old = load_json_text(read_file_text(path, "replan state file", limit=MAX_STATE_BYTES),
                                     str(path)).get("scrapes", {})
            except (OSError, ValueError, AttributeError):
                old = {}
            if not isinstance(old, dict):
                old = {}
            old.update({url: s.to_json() for url, s in scrapes.items()})
            atomic_write_text(path, json.dumps({"version": STATE_VERSION, "scrapes": old}, indent=1),
                              what="replan state file")
    except ConfigError as e:
        raise TrafficSourceError(f"replan state file {path} cannot be updated: {e}") from None


# ---------------------------------------------------------------------------------------------
# deltas
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Delta:
    """What one URL served between two scrapes: counter and histogram increments over ``window_s``."""

    url: str
    window_s: float
    counters: Mapping[str, float]
    histograms: Mapping[str, Histogram]
    notes: tuple[str, ...] = field(default=())


def _fell(prev: Histogram, cur: Histogram) -> bool:
    """Any bucket or the sum of ``cur`` below ``prev`` (a reset; the difference would be negative)."""
    if prev.upper_edges != cur.upper_edges:
        return False  # minus() names the changed edges
    return cur.sum_value < prev.sum_value or any(c < p for c, p in zip(cur.cumulative_counts, prev.cumulative_counts))


def diff(prev: Scrape, cur: Scrape) -> Delta:
    """``cur - prev``; a restart (``_created`` moved or a counter decreased) uses ``cur`` as the delta."""
    restarted_at = None
    if cur.created_s is not None and prev.created_s is not None and cur.created_s > prev.created_s + 1e-6:
        restarted_at = cur.created_s
    went_down = [n for n in COUNTERS if cur.counters[n] < prev.counters[n]]
    went_down += [n for n in HISTOGRAMS if _fell(prev.histograms[n], cur.histograms[n])]
    if restarted_at is not None or went_down:
        start = restarted_at if restarted_at is not None and prev.time_s < restarted_at < cur.time_s else prev.time_s
        why = f"counters went down ({', '.join(went_down)})" if went_down else "its _created timestamp moved"
        note = (f"{cur.url}: counter reset (pod restarted: {why}); counted the new values as the traffic since "
                f"the restart, over {cur.time_s - start:.0f} s")
        return Delta(cur.url, cur.time_s - start, dict(cur.counters), dict(cur.histograms), (note,))
    counters = {n: cur.counters[n] - prev.counters[n] for n in COUNTERS}
    if all(n in cur.counters and n in prev.counters and cur.counters[n] >= prev.counters[n] for n in PREFIX_COUNTERS):
        counters.update({n: cur.counters[n] - prev.counters[n] for n in PREFIX_COUNTERS})
    hist = {n: check_histogram(cur.histograms[n].minus(prev.histograms[n]), f"{cur.url}: {n} increase", tolerant=True)
            for n in HISTOGRAMS}
    return Delta(cur.url, cur.time_s - prev.time_s, counters, hist)


def observe_deltas(deltas: Sequence[Delta], scrapes: Sequence[Scrape], end_s: float) -> Observation:
    """Sum per-URL rates (``delta / window`` each) and histogram increments into one Observation."""
    requests = sum(d.counters["vllm:request_success_total"] for d in deltas)
    rate = sum(d.counters["vllm:request_success_total"] / d.window_s for d in deltas)
    prompt_rate = sum(d.counters["vllm:prompt_tokens_total"] / d.window_s for d in deltas)
    output_rate = sum(d.counters["vllm:generation_tokens_total"] / d.window_s for d in deltas)
    hist: dict[str, Histogram] = {}
    for name, key in HISTOGRAMS.items():
        h = EMPTY_HISTOGRAM
        for d in deltas:
            h = h.plus(d.histograms[name])
        hist[key] = h
    window_s = max(d.window_s for d in deltas)

    def lengths(h: Histogram, tokens: float) -> LengthObservation:
        n = int(round(h.count))
        return LengthObservation(n, (h.sum_value / h.count) if h.count > 0 else (tokens / requests if requests else 0.0),
                                 histogram=h)

    gauges = {"num_requests_running": sum(s.gauges["vllm:num_requests_running"] for s in scrapes),
              "num_requests_waiting": sum(s.gauges["vllm:num_requests_waiting"] for s in scrapes),
              "kv_cache_usage_perc_max": max(s.gauges["vllm:kv_cache_usage_perc"] for s in scrapes)}
    notes = tuple(n for d in deltas for n in d.notes)
    models = sorted({printable(m, EXCERPT_CHARS) for s in scrapes for m in s.models})
    if len(models) > 1:
        notes += (f"the endpoints report several model names ({', '.join(models[:5])}); their traffic was summed",)
    notes += tuple(f"{s.url}: left out the series of model_name {', '.join(s.other_models[:5])} (not the plan's "
                   f"model)" for s in scrapes if s.other_models)
    return Observation(
        source="vllm-metrics", where=tuple(d.url for d in deltas), end_s=end_s, window_s=window_s,
        requests=requests, arrival_rate_per_s=rate, rate_points=(RatePoint(end_s, window_s, rate),),
        prompt_tokens=lengths(hist["prompt_tokens"], sum(d.counters["vllm:prompt_tokens_total"] for d in deltas)),
        output_tokens=lengths(hist["output_tokens"], sum(d.counters["vllm:generation_tokens_total"] for d in deltas)),
        prompt_tokens_per_s=prompt_rate, output_tokens_per_s=output_rate,
        latency={k: hist[k] for k in ("ttft", "tpot", "e2e", "queue")}, gauges=gauges, notes=notes,
        prefix_share=_prefix_share(deltas))


def _prefix_share(deltas: Sequence[Delta]) -> float | None:
    """Cached / queried prompt tokens over the window (all URLs), None when an endpoint lacks the counters
    or nothing was queried."""
    if not all(all(n in d.counters for n in PREFIX_COUNTERS) for d in deltas):
        return None
    queries = sum(d.counters["vllm:prefix_cache_queries_total"] for d in deltas)
    hits = sum(d.counters["vllm:prefix_cache_hits_total"] for d in deltas)
    return hits / queries if queries > 0 else None


# ---------------------------------------------------------------------------------------------
# the source
# ---------------------------------------------------------------------------------------------
@dataclass
class VllmMetricsSource:
    """One or more vLLM ``/metrics`` URLs (one per replica), observed as deltas against the saved state.

    ``min_interval_s``: shortest span between two scrapes that counts as a window. Without a baseline
    (first run, new URL, or a baseline older than ``max_interval_s``) the source either waits
    ``min_interval_s`` and scrapes again (``wait_for_baseline``) or raises InsufficientDataError saying
    when the next scrape will have enough data. A window of fewer than ``min_requests`` finished requests raises
    InsufficientDataError too, keeping the baseline. ``served``: the plan's model (other models' series are left out).
    """

    urls: tuple[str, ...]
    state_path: Path
    min_interval_s: float = 30.0
    max_interval_s: float = 3600.0
    wait_for_baseline: bool = True
    timeout_s: float = 10.0
    fetch: Fetch = fetch_url
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    notify: Callable[[str], None] = lambda message: None  # noqa: E731 - e.g. a line on stderr
    headers: Mapping[str, str] = field(default_factory=dict)
    min_requests: int = 0
    served: ServedModel | None = None

    def scrape_all(self) -> dict[str, Scrape]:
        """One scrape of every URL (parsed, the plan's model only)."""
        out = {}
        for url in self.urls:
            t = self.clock()
            body = self.fetch(url, self.timeout_s, self.headers) if self.headers else self.fetch(url, self.timeout_s)
            out[url] = parse_exposition(body, url, t, served=self.served)
        return out

    def _enough(self, deltas: Sequence[Delta], base: Mapping[str, Scrape]) -> None:
        """InsufficientDataError, the baseline saved again (the next run diffs over a longer window), when the
        window holds fewer than ``min_requests`` finished requests."""
        requests = sum(d.counters["vllm:request_success_total"] for d in deltas)
        if requests >= self.min_requests:
            return
        save_state(self.state_path, base)
        window_s = max(d.window_s for d in deltas)
        model = f" of {self.served.describe()}" if self.served is not None else ""
        raise InsufficientDataError(
            f"insufficient data: {len(deltas)} metrics endpoint(s) finished {requests:.0f} request(s){model} in "
            f"{window_s:.0f} s; need at least {self.min_requests} ({self.min_requests - requests:.0f} more); the "
            f"next run counts from the same scrape (up to {self.max_interval_s:.0f} s old); keeping the current plan")

    def observe(self) -> Observation:
        """Scrape every URL, diff against the baseline, save the new baseline, return the Observation."""
        state = load_state(self.state_path)
        cur = self.scrape_all()
        now = max(s.time_s for s in cur.values())
        base = {u: state[u] for u in self.urls
                if u in state and self.min_interval_s <= cur[u].time_s - state[u].time_s <= self.max_interval_s}
        too_recent = {u: self.min_interval_s - (cur[u].time_s - state[u].time_s) for u in self.urls
                      if u in state and cur[u].time_s - state[u].time_s < self.min_interval_s}
        missing = [u for u in self.urls if u not in base]
        if missing:
            need_s = max(too_recent.get(u, self.min_interval_s) for u in missing)
            if not self.wait_for_baseline:
                # keep a recent baseline (it becomes usable soon); replace absent or stale ones
                save_state(self.state_path, {u: cur[u] for u in missing if u not in too_recent})
                raise InsufficientDataError(
                    f"insufficient data: {len(missing)} of {len(self.urls)} metrics endpoint(s) have no earlier "
                    f"scrape between {self.min_interval_s:.0f} s and {self.max_interval_s:.0f} s old to diff "
                    f"against; need one more scrape in {max(0.0, need_s):.0f} s (run again then); keeping the "
                    f"current plan")
            for u in missing:
                base[u] = state[u] if u in too_recent else cur[u]
            self.notify(f"no earlier scrape of {len(missing)} of {len(self.urls)} /metrics endpoint(s) to diff "
                        f"against: waiting {max(0.0, need_s):.0f} s for a second scrape (counter rates need two; "
                        f"metrics.min_scrape_interval in the policy; wait_for_baseline: false exits 11 instead)")
            self.sleep(max(0.0, need_s))
            cur = self.scrape_all()
            now = max(s.time_s for s in cur.values())
        deltas = []
        for u in self.urls:
            d = diff(base[u], cur[u])
            if d.window_s <= 0:
                raise InsufficientDataError(f"insufficient data: {u} was scraped twice at the same instant; "
                                            f"need one more scrape in {self.min_interval_s:.0f} s")
            deltas.append(d)
        self._enough(deltas, base)
        save_state(self.state_path, cur)
        return observe_deltas(deltas, list(cur.values()), now)
