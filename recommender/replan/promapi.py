"""A Prometheus server's HTTP API as a traffic source (it scrapes every vLLM pod; we query sums).

``--traffic prometheus+http://prometheus:9090`` runs, at one evaluation time ``t`` with window ``W``:

* ``sum(rate(vllm:request_success_total[W]))`` and the token counters: rates in requests / tokens per s;
* ``sum(rate(vllm:request_success_total[S]))`` over ``[t - W, t]`` step ``S`` (``/api/v1/query_range``): the
  sub-window rates the forecast uses;
* ``sum by (le) (increase(<histogram>_bucket[W]))`` plus ``_sum`` / ``_count``: the window's histograms;
* ``sum(vllm:num_requests_running)``, ``sum(vllm:num_requests_waiting)``, ``max(vllm:kv_cache_usage_perc)``.

With ``selector`` (``--selector 'model_name="llama",namespace="prod"'``) every series reference carries
those label matchers (``vllm:request_success_total{model_name="llama",namespace="prod"}``), so only the
deployment's pods are summed. ``headers`` go with every request (``Authorization: Bearer ...`` or
``Basic ...``; see :func:`auth_headers`).

Prometheus handles counter resets itself (``rate``/``increase``). Responses are read by a typed reader: the
documented ``{"status": "success", "data": {"resultType": "vector"|"matrix", "result": [...]}}`` shape, values
as strings of finite, non-negative numbers under the physics limits of ``observation.py`` (1e6 req/s, 1e10
tokens/s), histogram edges ascending and non-negative, cumulative buckets that do not fall (by more than
Prometheus' own extrapolation noise); anything else is one TrafficSourceError line, never acted on.
"""

from __future__ import annotations

import base64
import math
import os
import re
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from recommender.bounded import load_json_text, read_file_text
from recommender.errors import ConfigError, TrafficSourceError
from recommender.replan.metrics import HISTOGRAMS, Fetch, fetch_url
from recommender.replan.observation import (
    MAX_GAUGE_REQUESTS, MAX_OBSERVATIONS, MAX_REQUESTS_PER_S, MAX_TOKENS_PER_S, Histogram, InsufficientDataError,
    LengthObservation, Observation, RatePoint, check_histogram, check_number, check_observation,
)
from recommender.units import MAX_UNIX_S

#: most series (or points of one series) an answer may hold; a sum over pods has one
MAX_SERIES = 100_000


_MATCHER = r'\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=|!=|=~|!~)\s*"(?:[^"\\\n]|\\.)*"\s*'
_SELECTOR = re.compile(rf"^{_MATCHER}(,{_MATCHER})*,?\s*$")


def check_selector(selector: str) -> str:
    """The label matchers inside ``{...}`` (braces optional), validated; '' for none."""
    sel = selector.strip()
    if sel.startswith("{") and sel.endswith("}"):
        sel = sel[1:-1].strip()
    if sel and not _SELECTOR.match(sel):
        raise ConfigError(f"--selector {selector!r} is not a list of PromQL label matchers; use e.g. "
                          f"'model_name=\"meta-llama/Llama-3.1-8B\",namespace=\"prod\"' (=, !=, =~, !~; values in "
                          f"double quotes)")
    return sel.rstrip(", ")


def _read_secret(path: str | None, env: str | None, what: str) -> str | None:
    if path:
        text = read_file_text(path, f"{what} file", limit=65536).strip()  # a regular file of at most 64 KiB
        if not text:
            raise ConfigError(f"{what} file {path} is empty")
        return text
    if env:
        v = os.environ.get(env, "").strip()
        if not v:
            raise ConfigError(f"{what}: environment variable {env} is not set or empty")
        return v
    return None


def auth_headers(*, bearer_token_file: str | None = None, bearer_token_env: str | None = None,
                 basic_user: str | None = None, basic_password_file: str | None = None,
                 basic_password_env: str | None = None) -> dict[str, str]:
    """HTTP headers for a bearer token (from a file or an environment variable) or basic auth."""
    token = _read_secret(bearer_token_file, bearer_token_env, "bearer token")
    if token and basic_user:
        raise ConfigError("give either a bearer token or basic auth, not both")
    if token:
        if any(c in token for c in "\r\n"):
            raise ConfigError("the bearer token contains a line break; store the token alone in the file")
        return {"Authorization": f"Bearer {token}"}
    if basic_user:
        pw = _read_secret(basic_password_file, basic_password_env, "basic-auth password")
        if pw is None:
            raise ConfigError("--basic-auth-user needs --basic-auth-password-file or --basic-auth-password-env")
        cred = base64.b64encode(f"{basic_user}:{pw}".encode()).decode("ascii")
        return {"Authorization": f"Basic {cred}"}
    if basic_password_file or basic_password_env:
        raise ConfigError("a basic-auth password needs --basic-auth-user")
    return {}


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
    selector: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)

    def m(self, name: str) -> str:
        """``name`` with the selector's label matchers."""
        return f"{name}{{{self.selector}}}" if self.selector else name

    @property
    def http_base(self) -> str:
        u = self.base_url.split("+", 1)[1] if self.base_url.lower().startswith("prometheus+") else self.base_url
        return u.rstrip("/")

    def _get(self, path: str, params: dict[str, str], result_type: str) -> list[Any]:
        """The ``data.result`` list of a documented success answer of ``result_type``; else one line."""
        url = f"{self.http_base}{path}?{urllib.parse.urlencode(params)}"
        text = self.fetch(url, self.timeout_s, self.headers) if self.headers else self.fetch(url, self.timeout_s)
        q = params.get("query", "")[:120]
        try:
            doc = load_json_text(text, f"Prometheus at {self.http_base}")
        except ValueError:
            raise TrafficSourceError(f"Prometheus at {self.http_base} did not answer JSON for {q!r}; "
                                     f"is it a Prometheus server (it should serve /api/v1/query)?") from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            err = doc.get("error", "unknown error") if isinstance(doc, dict) else "not an object"
            raise TrafficSourceError(f"Prometheus at {self.http_base} rejected {q!r}: {str(err)[:200]}")
        data = doc.get("data")
        if not isinstance(data, dict) or not isinstance(data.get("result"), list):
            raise TrafficSourceError(f"Prometheus at {self.http_base}: the answer to {q!r} has no data.result list "
                                     f"(shape {{\"data\": {{\"resultType\": ..., \"result\": [...]}}}})")
        if data.get("resultType") != result_type:
            raise TrafficSourceError(f"Prometheus at {self.http_base}: the answer to {q!r} is of resultType "
                                     f"{str(data.get('resultType'))[:20]!r}, not {result_type!r}")
        result: list[Any] = data["result"]
        if len(result) > MAX_SERIES:
            raise TrafficSourceError(f"Prometheus at {self.http_base}: {len(result)} series for {q!r}, above the "
                                     f"{MAX_SERIES:,}-series limit; narrow --selector")
        return result

    def _vector(self, query: str, at: float, limit: float) -> list[tuple[dict[str, str], float]]:
        """``[(labels, value)]`` of an instant vector; every value finite, non-negative and at most ``limit``."""
        out = []
        what = f"Prometheus at {self.http_base}: {query[:100]!r}"
        for r in self._get("/api/v1/query", {"query": query, "time": f"{at:.3f}"}, "vector"):
            metric = r.get("metric", {}) if isinstance(r, dict) else None
            value = r.get("value") if isinstance(r, dict) else None
            if (not isinstance(metric, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in metric.items())
                    or not isinstance(value, list) or len(value) != 2 or not isinstance(value[1], str)):
                raise TrafficSourceError(f"{what}: a sample is not {{\"metric\": {{label: string}}, \"value\": "
                                         f"[time, \"number\"]}}")
            out.append((dict(metric), check_number(value[1], what, limit=limit)))
        return out

    def _scalar(self, query: str, at: float, family: str, limit: float) -> float:
        v = self._vector(query, at, limit)
        if not v:
            sel = f" matching {{{self.selector}}}" if self.selector else ""
            raise TrafficSourceError(f"Prometheus at {self.http_base} has no series {family}{sel}; is it scraping the "
                                     f"vLLM pods' /metrics" + (" and does --selector match their labels?" if sel else "?"))
        return check_number(sum(x for _, x in v), f"Prometheus at {self.http_base}: {query[:100]!r} (summed)",
                            limit=limit)

    def _histogram(self, name: str, w: str, at: float) -> Histogram:
        res = self._vector(f"sum by (le) (increase({self.m(name + '_bucket')}[{w}]))", at, MAX_OBSERVATIONS)
        if not res:
            raise TrafficSourceError(f"Prometheus at {self.http_base} has no series {name}_bucket; is it scraping "
                                     f"the vLLM pods' /metrics?")
        b: dict[float, float] = {}
        for labels, v in res:
            le = labels.get("le", "")
            try:
                edge = math.inf if le in ("+Inf", "Inf") else float(le)
            except ValueError:
                raise TrafficSourceError(f"Prometheus at {self.http_base}: {name}_bucket has the label le={le[:20]!r}, "
                                         f"not a number") from None
            if edge in b:
                raise TrafficSourceError(f"Prometheus at {self.http_base}: {name}_bucket has le={le[:20]!r} twice")
            b[edge] = v
        edges = tuple(sorted(b))
        total = self._scalar(f"sum(increase({self.m(name + '_sum')}[{w}]))", at, f"{name}_sum", 1e300)
        # increase() extrapolates every bucket on its own: tiny falls are evened out as histogram_quantile does
        return check_histogram(Histogram(edges, tuple(b[e] for e in edges), total),
                               f"Prometheus at {self.http_base}: {name}", tolerant=True)

    def observe(self) -> Observation:
        now = self.clock()
        w = f"{int(round(self.window_s))}s"
        m = self.m
        rate = self._scalar(f"sum(rate({m('vllm:request_success_total')}[{w}]))", now, "vllm:request_success_total",
                            MAX_REQUESTS_PER_S)
        prompt_rate = self._scalar(f"sum(rate({m('vllm:prompt_tokens_total')}[{w}]))", now, "vllm:prompt_tokens_total",
                                   MAX_TOKENS_PER_S)
        output_rate = self._scalar(f"sum(rate({m('vllm:generation_tokens_total')}[{w}]))", now,
                                   "vllm:generation_tokens_total", MAX_TOKENS_PER_S)
        step = max(1, int(round(self.subwindow_s)))
        query = f"sum(rate({m('vllm:request_success_total')}[{step}s]))"
        series = self._get("/api/v1/query_range", {
            "query": query, "start": f"{now - self.window_s + step:.3f}", "end": f"{now:.3f}", "step": f"{step}"},
            "matrix")
        points = []
        what = f"Prometheus at {self.http_base}: {query[:100]!r}"
        for s in series:
            values = s.get("values") if isinstance(s, dict) else None
            if not isinstance(values, list) or len(values) > MAX_SERIES:
                raise TrafficSourceError(f"{what}: a series has no values list of at most {MAX_SERIES:,} points")
            for pair in values:
                if not isinstance(pair, list) or len(pair) != 2 or not isinstance(pair[1], str):
                    raise TrafficSourceError(f"{what}: a point is not [time, \"number\"]")
                t = check_number(pair[0], f"{what}: point time", limit=MAX_UNIX_S, unit=" s")
                points.append(RatePoint(t, float(step), check_number(pair[1], what, limit=MAX_REQUESTS_PER_S)))
        hist = {key: self._histogram(name, w, now) for name, key in HISTOGRAMS.items()}
        requests = rate * self.window_s
        if requests < self.min_requests:
            raise InsufficientDataError(
                f"insufficient data: Prometheus saw {requests:.0f} finished request(s) in the last {w}; need at least "
                f"{self.min_requests} ({self.min_requests - requests:.0f} more); keeping the current plan")
        gauges = {"num_requests_running": self._scalar(f"sum({m('vllm:num_requests_running')})", now,
                                                       "vllm:num_requests_running", MAX_GAUGE_REQUESTS),
                  "num_requests_waiting": self._scalar(f"sum({m('vllm:num_requests_waiting')})", now,
                                                       "vllm:num_requests_waiting", MAX_GAUGE_REQUESTS),
                  "kv_cache_usage_perc_max": self._scalar(f"max({m('vllm:kv_cache_usage_perc')})", now,
                                                          "vllm:kv_cache_usage_perc", 1.0 + 1e-9)}

        def lengths(h: Histogram) -> LengthObservation:
            return LengthObservation(int(round(h.count)), h.mean if h.count > 0 else 0.0, histogram=h)

        return check_observation(Observation(
            source="prometheus", where=(self.http_base,), end_s=now, window_s=self.window_s, requests=requests,
            arrival_rate_per_s=rate, rate_points=tuple(points) or (RatePoint(now, self.window_s, rate),),
            prompt_tokens=lengths(hist["prompt_tokens"]), output_tokens=lengths(hist["output_tokens"]),
            prompt_tokens_per_s=prompt_rate, output_tokens_per_s=output_rate,
            latency={k: hist[k] for k in ("ttft", "tpot", "e2e", "queue")}, gauges=gauges))
