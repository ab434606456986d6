"""A Prometheus server's HTTP API as a traffic source, against a loopback stand-in that answers the
documented response shape (``{"status": "success", "data": {"resultType": ..., "result": [...]}}``)."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.parse

import pytest

from recommender.errors import TrafficSourceError
from recommender.replan.metrics import HISTOGRAMS
from recommender.replan.observation import InsufficientDataError
from recommender.replan.promapi import PrometheusSource

NOW = 1_700_000_000.0


def vector(*samples):
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": labels, "value": [NOW, str(v)]} for labels, v in samples]}}


def answers(rate: float) -> dict[str, dict]:
    a = {
        "sum(rate(vllm:request_success_total[900s]))": vector(({}, rate)),
        "sum(rate(vllm:prompt_tokens_total[900s]))": vector(({}, rate * 800)),
        "sum(rate(vllm:generation_tokens_total[900s]))": vector(({}, rate * 120)),
        "sum(vllm:num_requests_running)": vector(({}, 12)),
        "sum(vllm:num_requests_waiting)": vector(({}, 3)),
        "max(vllm:kv_cache_usage_perc)": vector(({}, 0.7)),
    }
    n = rate * 900
    for name in HISTOGRAMS:
        # half of the window's requests at or below the first edge, the rest in the second bucket
        edges = ("0.1", "0.5", "+Inf") if "seconds" in name else ("500", "1000", "+Inf")
        a[f"sum by (le) (increase({name}_bucket[900s]))"] = vector(*[({"le": e}, c) for e, c in
                                                                      zip(edges, (n / 2, n, n))])
        a[f"sum(increase({name}_sum[900s]))"] = vector(({}, n * (0.2 if "seconds" in name else 700)))
    return a


class Prom:
    def __init__(self, table: dict[str, dict], series: list[float]):
        self.queries: list[str] = []
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                u = urllib.parse.urlparse(self.path)
                q = urllib.parse.parse_qs(u.query)
                outer.queries.append(q["query"][0])
                if u.path == "/api/v1/query_range":
                    body = {"status": "success", "data": {"resultType": "matrix", "result": [
                        {"metric": {}, "values": [[NOW - 60 * (len(series) - 1 - i), str(v)] for i, v in enumerate(series)]}]}}
                elif q["query"][0] in table:
                    body = table[q["query"][0]]
                else:
                    body = {"status": "error", "errorType": "bad_data", "error": f"unknown query {q['query'][0]}"}
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        self.url = f"prometheus+http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def prom():
    servers = []

    def make(table, series):
        s = Prom(table, series)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()


def test_prometheus_api_observation(prom):
    p = prom(answers(4.0), [3.0, 4.0, 6.0, 4.0])
    obs = PrometheusSource(p.url, window_s=900.0, subwindow_s=60.0, clock=lambda: NOW).observe()
    assert obs.arrival_rate_per_s == 4.0 and obs.requests == pytest.approx(3600)
    assert obs.prompt_tokens_per_s == 3200.0 and obs.output_tokens_per_s == 480.0
    assert [pt.rate_per_s for pt in obs.rate_points] == [3.0, 4.0, 6.0, 4.0]
    # TTFT window histogram: 1800 in (0, 0.1], 1800 in (0.1, 0.5]: p99 = 0.1 + 0.4 x (3564 - 1800) / 1800
    assert obs.latency_s("ttft", "p99") == pytest.approx(0.1 + 0.4 * (0.99 * 3600 - 1800) / 1800)
    assert obs.prompt_tokens.mean_tokens == pytest.approx(700.0)
    assert obs.gauges == {"num_requests_running": 12, "num_requests_waiting": 3, "kv_cache_usage_perc_max": 0.7}
    assert "sum by (le) (increase(vllm:inter_token_latency_seconds_bucket[900s]))" in p.queries


def test_prometheus_missing_series_error_and_too_little_traffic(prom):
    table = answers(4.0)
    table["sum(rate(vllm:request_success_total[900s]))"] = vector()
    with pytest.raises(TrafficSourceError, match="no series vllm:request_success_total"):
        PrometheusSource(prom(table, []).url, clock=lambda: NOW).observe()
    table = answers(4.0)
    del table["max(vllm:kv_cache_usage_perc)"]
    with pytest.raises(TrafficSourceError, match="rejected 'max\\(vllm:kv_cache_usage_perc\\)': unknown query"):
        PrometheusSource(prom(table, [4.0]).url, clock=lambda: NOW).observe()
    with pytest.raises(InsufficientDataError, match=r"saw 9 finished request\(s\).*11 more"):
        PrometheusSource(prom(answers(0.01), [0.01]).url, clock=lambda: NOW).observe()
