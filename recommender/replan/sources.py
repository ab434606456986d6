"""Traffic sources for re-planning, chosen from the ``--traffic`` arguments.

* ``http(s)://host:port/metrics``: vLLM's Prometheus exposition, one URL per replica, summed
  (:mod:`recommender.replan.metrics`); state between runs in a JSON file.
* ``prometheus+http(s)://host:9090``: a Prometheus server's HTTP API (``/api/v1/query``) that scrapes the
  vLLM pods (:mod:`recommender.replan.promapi`).
* a path: a request-log file, JSONL or CSV, incl. the Azure trace CSV (:mod:`recommender.replan.logs`);
  several files are merged (one per replica). Any other ``scheme://`` (``ftp://``, ``file://``, ``s3://``) is
  refused in one line naming the schemes there are.

Every source has ``observe() -> Observation`` and raises TrafficSourceError (unreachable, malformed) or
InsufficientDataError (too little data; says how much more is needed).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Mapping, Protocol, Sequence

from recommender.errors import ConfigError
from recommender.httpread import printable
from recommender.replan.history import sqlite_path, storage_url
from recommender.replan.logs import RequestLogSource
from recommender.replan.metrics import VllmMetricsSource
from recommender.replan.observation import Observation
from recommender.replan.plans import ServedModel
from recommender.replan.policy import Policy
from recommender.replan.promapi import PrometheusSource, check_selector

DEFAULT_STATE = "recommender-replan-state.json"
#: a URL's scheme (RFC 3986) before '://'; a Windows drive letter is not followed by '//'
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
SCHEMES = "http(s):// (a vLLM /metrics URL), prometheus+http(s):// (a Prometheus server) or a request-log file path"


class TrafficSource(Protocol):
    def observe(self) -> Observation: ...


def default_state_path(storage: str | None) -> Path:
    """Beside the SQLite history file (``<db>.metrics-state.json``), else ./recommender-replan-state.json."""
    db = sqlite_path(storage_url(storage))
    return db.with_name(db.name + ".metrics-state.json") if db is not None else Path(DEFAULT_STATE)


def kind_of(spec: str) -> str:
    """'prometheus', 'vllm-metrics' or 'request-log' (a path); a URL of any other scheme is a ConfigError."""
    s = spec.strip().lower()
    if s.startswith(("prometheus+http://", "prometheus+https://")):
        return "prometheus"
    if s.startswith(("http://", "https://")):
        return "vllm-metrics"
    scheme = _SCHEME.match(spec.strip())
    if scheme:
        raise ConfigError(f"--traffic '{printable(spec.strip(), 80)}': the scheme '{printable(scheme.group(1), 20)}' is "
                          f"not supported; give {SCHEMES} (for a local file, its path without file://)")
    return "request-log"


def open_source(specs: Sequence[str], policy: Policy, state_path: Path, *, selector: str = "",
                headers: Mapping[str, str] | None = None, notify: Callable[[str], None] | None = None,
                served: ServedModel | None = None) -> TrafficSource:
    """One source for all ``--traffic`` arguments (they must all be of one kind).

    ``selector`` (PromQL label matchers) scopes a Prometheus source; ``headers`` (authentication) go with
    every HTTP request; ``notify`` hears about waits (a /metrics source's first scrape); ``served`` (the plan's
    model) scopes /metrics series by their ``model_name``. A /metrics window needs ``policy.min_requests``
    requests, as a request log's and Prometheus' do."""
    if not specs:
        raise ConfigError("no --traffic source given: pass vLLM /metrics URL(s) or request-log file(s)")
    if any(not s.strip() or not s.isprintable() for s in specs):
        bad = next(s for s in specs if not s.strip() or not s.isprintable())
        raise ConfigError(f"--traffic {bad[:80]!r}: give a /metrics URL, a Prometheus server or a request-log file "
                          f"(one printable line, not blank)")
    specs = list(dict.fromkeys(s.strip() for s in specs))  # the same replica twice would count twice
    kinds = {kind_of(s) for s in specs}
    if len(kinds) > 1:
        raise ConfigError(f"--traffic mixes source kinds ({', '.join(sorted(kinds))}); give either /metrics URLs, "
                          f"a Prometheus server, or request logs")
    kind = kinds.pop()
    if kind == "vllm-metrics":
        if selector:
            raise ConfigError("--selector scopes a Prometheus server's queries; for /metrics URLs list the pods of "
                              "the deployment instead")
        src = VllmMetricsSource(tuple(specs), state_path, min_interval_s=policy.min_scrape_interval_s,
                                max_interval_s=policy.max_scrape_interval_s, wait_for_baseline=policy.wait_for_baseline,
                                timeout_s=policy.scrape_timeout_s, headers=dict(headers or {}),
                                min_requests=policy.min_requests, served=served)
        if notify is not None:
            src.notify = notify
        return src
    if kind == "prometheus":
        if len(specs) > 1:
            raise ConfigError("give one Prometheus server (it already sums every vLLM pod it scrapes)")
        return PrometheusSource(specs[0], window_s=policy.window_s, subwindow_s=policy.subwindow_s,
                                timeout_s=policy.scrape_timeout_s, min_requests=policy.min_requests,
                                selector=check_selector(selector), headers=dict(headers or {}))
    if selector or headers:
        raise ConfigError("--selector and HTTP authentication apply to Prometheus / metrics URLs, not request logs")
    return RequestLogSource(tuple(specs), window_s=policy.window_s, subwindow_s=policy.subwindow_s,
                            min_requests=policy.min_requests, min_span_s=policy.min_span_s,
                            max_samples=policy.max_length_samples)
