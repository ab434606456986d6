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


def answers(rate: float, sel: str = "") -> dict[str, dict]:
    """The queries PrometheusSource sends (series names carry ``{sel}`` when a selector is given)."""
    def m(name: str) -> str:
        return f"{name}{{{sel}}}" if sel else name

    a = {
        f"sum(rate({m('vllm:request_success_total')}[900s]))": vector(({}, rate)),
        f"sum(rate({m('vllm:prompt_tokens_total')}[900s]))": vector(({}, rate * 800)),
        f"sum(rate({m('vllm:generation_tokens_total')}[900s]))": vector(({}, rate * 120)),
        f"sum({m('vllm:num_requests_running')})": vector(({}, 12)),
        f"sum({m('vllm:num_requests_waiting')})": vector(({}, 3)),
        f"max({m('vllm:kv_cache_usage_perc')})": vector(({}, 0.7)),
    }
    n = rate * 900
    for name in HISTOGRAMS:
        # half of the window's requests at or below the first edge, the rest in the second bucket
        edges = ("0.1", "0.5", "+Inf") if "seconds" in name else ("500", "1000", "+Inf")
        a[f"sum by (le) (increase({m(name + '_bucket')}[900s]))"] = vector(*[({"le": e}, c) for e, c in
                                                                             zip(edges, (n / 2, n, n))])
        a[f"sum(increase({m(name + '_sum')}[900s]))"] = vector(({}, n * (0.2 if "seconds" in name else 700)))
    return a


class Prom:
    def __init__(self, table: dict[str, dict], series: list[float]):
        self.queries: list[str] = []
        self.auth: list[str | None] = []
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                u = urllib.parse.urlparse(self.path)
                q = urllib.parse.parse_qs(u.query)
                outer.queries.append(q["query"][0])
                outer.auth.append(self.headers.get("Authorization"))
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


SEL = 'model_name="meta-llama/Llama-3.1-8B",namespace="prod"'


@pytest.mark.parametrize("auth, expected", [
    ({"bearer_token_file": "token"}, "Bearer s3cr3t-token"),
    ({"bearer_token_env": "PROM_TOKEN"}, "Bearer from-env"),
    ({"basic_user": "ops", "basic_password_file": "password"}, "Basic b3BzOmh1bnRlcjI="),  # base64("ops:hunter2")
])
def test_selector_and_auth_headers_reach_prometheus(prom, tmp_path, monkeypatch, auth, expected):
    from recommender.replan.policy import Policy
    from recommender.replan.promapi import auth_headers
    from recommender.replan.sources import open_source

    (tmp_path / "token").write_text("s3cr3t-token\n")
    (tmp_path / "password").write_text("hunter2")
    monkeypatch.setenv("PROM_TOKEN", "from-env")
    kw = {k: (str(tmp_path / v) if k.endswith("_file") else v) for k, v in auth.items()}
    p = prom(answers(4.0, SEL), [4.0])  # answers only the selector-scoped queries
    src = open_source([p.url], Policy(), tmp_path / "state.json", selector="{" + SEL + "}", headers=auth_headers(**kw))
    src.clock = lambda: NOW
    obs = src.observe()
    assert obs.arrival_rate_per_s == 4.0
    # 3 rates, 1 range query, 6 histograms x (buckets, sum), 3 gauges = 19 queries, every one scoped
    assert len(p.queries) == 19 and all(SEL in q for q in p.queries)
    assert f"sum(rate(vllm:request_success_total{{{SEL}}}[900s]))" in p.queries
    assert set(p.auth) == {expected}


def test_selector_and_auth_mistakes_are_one_line_config_errors(tmp_path, monkeypatch):
    from recommender.errors import ConfigError
    from recommender.replan.policy import Policy
    from recommender.replan.promapi import auth_headers, check_selector
    from recommender.replan.sources import open_source

    for bad in ('model_name=llama', 'a="b"}) or vector(1', 'a="b",,c="d"'):
        with pytest.raises(ConfigError, match="not a list of PromQL label matchers"):
            check_selector(bad)
    assert check_selector('pod=~"vllm-.*", namespace!="dev",') == 'pod=~"vllm-.*", namespace!="dev"'
    monkeypatch.delenv("NOPE", raising=False)
    with pytest.raises(ConfigError, match="NOPE is not set"):
        auth_headers(bearer_token_env="NOPE")
    with pytest.raises(ConfigError, match="needs --basic-auth-password"):
        auth_headers(basic_user="ops")
    with pytest.raises(ConfigError, match="not request logs"):
        open_source(["x.jsonl"], Policy(), tmp_path / "s.json", selector='a="b"')
