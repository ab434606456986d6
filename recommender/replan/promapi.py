"""A Prometheus server's HTTP API as a traffic source (it scrapes every vLLM pod; we query sums).

``--traffic prometheus+http://prometheus:9090`` runs, at one evaluation time ``t`` with window ``W``:

* ``sum(rate(vllm:request_success_total[W]))`` and the token counters: rates in requests / tokens per s;
* ``sum(rate(vllm:request_success_total[S]))`` over ``[t - W, t]`` step ``S`` (``/api/v1/query_range``): the
  sub-window rates the forecast uses;
* ``sum by (le) (increase(<histogram>_bucket[W]))`` plus ``_sum`` / ``_count``: the window's histograms;
* ``sum(vllm:num_requests_running)``, ``sum(vllm:num_requests_waiting)``, ``max(vllm:kv_cache_usage_perc)``.

Prometheus handles counter resets itself (``rate``/``increase``). Responses follow the documented
``{"status": "success", "data": {"resultType": "vector"|"matrix", "result": [...]}}`` shape.
"""

from __future__ import annotations

import json
import math
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Callable

from recommender.errors import TrafficSourceError
from recommender.replan.metrics import HISTOGRAMS, Fetch, fetch_url
from recommender.replan.observation import (
    Histogram, InsufficientDataError, LengthObservation, Observation, RatePoint,
)


@dataclass
class PrometheusSource:
    """Queries ``base_url`` (``prometheus+http://host:9090`` or a plain ``http://host:9090``)."""

    base_url: str
    window_s: float = 900.0
    subwindow_s: float = 60.0
    timeout_s: float = 10.0
    min_requests: int = 20
    fetch: Fetch = fetch_url
    clock: Callable[[], float] = time.time

    @property
    def http_base(self) -> str:
        u = self.base_url.split("+", 1)[1] if self.base_url.lower().startswith("prometheus+") else self.base_url
        return u.rstrip("/")

    def _get(self, path: str, params: dict[str, str]) -> Any:
        url = f"{self.http_base}{path}?{urllib.parse.urlencode(params)}"
        text = self.fetch(url, self.timeout_s)
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            raise TrafficSourceError(f"Prometheus at {self.http_base} did not answer JSON for {params.get('query')!r}; "
                                     f"is it a Prometheus server (it should serve /api/v1/query)?") from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            err = doc.get("error", "unknown error") if isinstance(doc, dict) else "not an object"
            raise TrafficSourceError(f"Prometheus at {self.http_base} rejected {params.get('query')!r}: {err}")
        return doc.get("data", {}).get("result", [])

    def _vector(self, query: str, at: float) -> list[tuple[dict[str, str], float]]:
        res = self._get("/api/v1/query", {"query": query, "time": f"{at:.3f}"})
        try:
            return [(dict(r.get("metric", {})), float(r["value"][1])) for r in res]
        except (KeyError, TypeError, ValueError, IndexError):
            raise TrafficSourceError(f"Prometheus at {self.http_base}: malformed vector for {query!r}") from None

    def _scalar(self, query: str, at: float, family: str) -> float:
        v = self._vector(query, at)
        if not v:
            raise TrafficSourceError(f"Prometheus at {self.http_base} has no series {family}; is it scraping the "
                                     f"vLLM pods' /metrics?")
        return sum(x for _, x in v if math.isfinite(x))

    def _histogram(self, name: str, w: str, at: float) -> Histogram:
        res = self._vector(f"sum by (le) (increase({name}_bucket[{w}]))", at)
        if not res:
            raise TrafficSourceError(f"Prometheus at {self.http_base} has no series {name}_bucket; is it scraping "
                                     f"the vLLM pods' /metrics?")
        b: dict[float, float] = {}
        for labels, v in res:
            le = labels.get("le", "")
            edge = math.inf if le in ("+Inf", "Inf") else float(le)
            b[edge] = v if math.isfinite(v) else 0.0
        edges = tuple(sorted(b))
        total = self._scalar(f"sum(increase({name}_sum[{w}]))", at, f"{name}_sum")
        return Histogram(edges, tuple(b[e] for e in edges), total)

    def observe(self) -> Observation:
        now = self.clock()
        w = f"{int(round(self.window_s))}s"
        rate = self._scalar(f"sum(rate(vllm:request_success_total[{w}]))", now, "vllm:request_success_total")
        prompt_rate = self._scalar(f"sum(rate(vllm:prompt_tokens_total[{w}]))", now, "vllm:prompt_tokens_total")
        output_rate = self._scalar(f"sum(rate(vllm:generation_tokens_total[{w}]))", now, "vllm:generation_tokens_total")
        step = max(1, int(round(self.subwindow_s)))
        series = self._get("/api/v1/query_range", {
            "query": f"sum(rate(vllm:request_success_total[{step}s]))", "start": f"{now - self.window_s + step:.3f}",
            "end": f"{now:.3f}", "step": f"{step}"})
        points = []
        for s in series:
            for t, v in s.get("values", []):
                if math.isfinite(float(v)):
                    points.append(RatePoint(float(t), float(step), float(v)))
        hist = {key: self._histogram(name, w, now) for name, key in HISTOGRAMS.items()}
        requests = rate * self.window_s
        if requests < self.min_requests:
            raise InsufficientDataError(
                f"insufficient data: Prometheus saw {requests:.0f} finished request(s) in the last {w}; need at least "
                f"{self.min_requests} ({self.min_requests - requests:.0f} more); keeping the current plan")
        gauges = {"num_requests_running": self._scalar("sum(vllm:num_requests_running)", now, "vllm:num_requests_running"),
                  "num_requests_waiting": self._scalar("sum(vllm:num_requests_waiting)", now, "vllm:num_requests_waiting"),
                  "kv_cache_usage_perc_max": self._scalar("max(vllm:kv_cache_usage_perc)", now, "vllm:kv_cache_usage_perc")}

        def lengths(h: Histogram) -> LengthObservation:
            return LengthObservation(int(round(h.count)), h.mean if h.count > 0 else 0.0, histogram=h)

        return Observation(
            source="prometheus", where=(self.http_base,), end_s=now, window_s=self.window_s, requests=requests,
            arrival_rate_per_s=rate, rate_points=tuple(points) or (RatePoint(now, self.window_s, rate),),
            prompt_tokens=lengths(hist["prompt_tokens"]), output_tokens=lengths(hist["output_tokens"]),
            prompt_tokens_per_s=prompt_rate, output_tokens_per_s=output_rate,
            latency={k: hist[k] for k in ("ttft", "tpot", "e2e", "queue")}, gauges=gauges)
