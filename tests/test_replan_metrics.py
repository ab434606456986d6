"""vLLM /metrics as a traffic source: real exposition, loopback HTTP server, deltas, resets, bad endpoints."""

from __future__ import annotations

import json
import math
import socket

import pytest

from recommender.errors import TrafficSourceError
from recommender.replan.metrics import VllmMetricsSource, fetch_url, parse_exposition
from recommender.replan.observation import Histogram, InsufficientDataError
from test_replan_support import FIXTURE, FakeClock, MetricsServer, VllmState


def source(urls, tmp_path, clock, **kw):
    return VllmMetricsSource(tuple(urls), tmp_path / "state.json", min_interval_s=kw.pop("min_interval_s", 30.0),
                             clock=clock, sleep=clock.sleep, **kw)


def test_fixture_exposition_parses_with_every_family_we_read():
    s = parse_exposition(FIXTURE, "fixture", 0.0)
    assert s.counters == {"vllm:prompt_tokens_total": 0.0, "vllm:generation_tokens_total": 0.0,
                          "vllm:request_success_total": 0.0, "vllm:prefix_cache_queries_total": 0.0,
                          "vllm:prefix_cache_hits_total": 0.0}
    # vLLM 0.33 default TTFT buckets: 22 finite edges 0.001 ... 2560 s, then +Inf (reference README §3)
    ttft = s.histograms["vllm:time_to_first_token_seconds"]
    assert len(ttft.upper_edges) == 23 and ttft.upper_edges[0] == 0.001 and ttft.upper_edges[-2] == 2560.0
    assert math.isinf(ttft.upper_edges[-1])
    assert len(s.histograms["vllm:inter_token_latency_seconds"].upper_edges) == 20  # 0.01 ... 80 s + Inf
    assert s.models == ("my-model",)
    assert s.created_s == pytest.approx(1.7959963517011852e9)  # earliest vllm:request_success_created


def test_histogram_quantile_is_prometheus_linear_interpolation():
    # cumulative 10 in (0, 0.1], 50 in (0.1, 0.25], 40 in (0.25, 0.5], none above
    h = Histogram((0.1, 0.25, 0.5, math.inf), (10.0, 60.0, 100.0, 100.0), 25.0)
    assert h.quantile(0.05) == pytest.approx(0.05)  # rank 5 of 10 in the first bucket, from 0
    assert h.quantile(0.5) == pytest.approx(0.1 + 0.15 * (50 - 10) / 50)  # 0.22
    assert h.quantile(0.99) == pytest.approx(0.25 + 0.25 * (99 - 60) / 40)  # 0.49375
    assert h.mean == pytest.approx(0.25)
    spill = Histogram((0.1, math.inf), (1.0, 4.0), 1.0)
    assert spill.quantile(0.9) == 0.1  # rank in the +Inf bucket: the largest finite edge
    assert math.isnan(Histogram((0.1, math.inf), (0.0, 0.0), 0.0).quantile(0.5))


def test_first_run_waits_then_observes_the_delta_from_a_live_server(tmp_path):
    st = VllmState()
    st.serve(50, prompt=4000, output=10, ttft_s=5.0, itl_s=0.5)  # before the first scrape: must not count

    def traffic(_s):  # what the server serves while the source waits for its second scrape
        st.serve(100, prompt=500, output=100, ttft_s=0.05, itl_s=0.02)
        st.serve(20, prompt=500, output=100, ttft_s=0.3, itl_s=0.02)

    clock = FakeClock(1000.0, on_sleep=traffic)
    with MetricsServer(st.exposition) as srv:
        obs = source([srv.url], tmp_path, clock).observe()
        assert srv.hits == 2
    assert clock.slept == [30.0]
    assert obs.requests == 120 and obs.window_s == 30.0
    assert obs.arrival_rate_per_s == pytest.approx(120 / 30)
    assert obs.prompt_tokens_per_s == pytest.approx(120 * 500 / 30)
    assert obs.output_tokens_per_s == pytest.approx(120 * 100 / 30)
    # TTFT delta: 100 in (0.04, 0.06], 20 in (0.25, 0.5]
    assert obs.latency_s("ttft", "p50") == pytest.approx(0.04 + 0.02 * 60 / 100)
    assert obs.latency_s("ttft", "p99") == pytest.approx(0.25 + 0.25 * (118.8 - 100) / 20)
    assert obs.latency_s("tpot", "p90") == pytest.approx(0.01 + 0.015 * 0.9)  # all ITL in (0.01, 0.025]
    assert obs.prompt_tokens.mean_tokens == pytest.approx(500.0)  # from _sum/_count deltas
    dist = obs.prompt_tokens.to_length_dist()
    assert dist.max_tokens == 500  # trailing empty buckets (1000, 2000, +Inf) trimmed
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["scrapes"][srv.url]["counters"]["vllm:request_success_total"] == 170.0


def test_without_waiting_it_says_how_long_until_enough_data(tmp_path):
    st = VllmState()
    clock = FakeClock(1000.0)
    with MetricsServer(st.exposition) as srv:
        src = source([srv.url], tmp_path, clock, wait_for_baseline=False)
        with pytest.raises(InsufficientDataError, match=r"need one more scrape in 30 s") as e:
            src.observe()
        assert e.value.exit_code == 11
        clock.t += 10
        with pytest.raises(InsufficientDataError, match=r"need one more scrape in 20 s"):
            src.observe()  # keeps the 1000 s baseline, does not restart the wait
        st.serve(90, prompt=100, output=10, ttft_s=0.1, itl_s=0.02)
        clock.t += 20
        obs = src.observe()
    assert obs.arrival_rate_per_s == pytest.approx(90 / 30)


def test_two_replicas_are_summed(tmp_path):
    a, b = VllmState(), VllmState()

    def traffic(_s):
        a.serve(60, prompt=100, output=10, ttft_s=0.1, itl_s=0.02)
        b.serve(90, prompt=300, output=10, ttft_s=0.1, itl_s=0.02)

    clock = FakeClock(1000.0, on_sleep=traffic)
    with MetricsServer(a.exposition) as sa, MetricsServer(b.exposition) as sb:
        obs = source([sa.url, sb.url], tmp_path, clock).observe()
    assert obs.requests == 150
    assert obs.arrival_rate_per_s == pytest.approx((60 + 90) / 30)
    assert obs.prompt_tokens.mean_tokens == pytest.approx((60 * 100 + 90 * 300) / 150)


def test_restarted_pod_counts_new_values_since_its_restart(tmp_path):
    st = VllmState(created_s=900.0)
    st.serve(500, prompt=100, output=10, ttft_s=0.1, itl_s=0.02)
    clock = FakeClock(1000.0)
    with MetricsServer(st.exposition) as srv:
        src = source([srv.url], tmp_path, clock, wait_for_baseline=False)
        with pytest.raises(InsufficientDataError):
            src.observe()  # baseline at 1000 s: 500 requests
        st.restart(at_s=1010.0)
        st.serve(40, prompt=100, output=10, ttft_s=0.1, itl_s=0.02)
        clock.t = 1030.0
        obs = src.observe()
    # 40 requests since the restart at 1010 s, seen at 1030 s: 40 / 20 s
    assert obs.requests == 40 and obs.window_s == 20.0
    assert obs.arrival_rate_per_s == pytest.approx(2.0)
    assert any("restart" in n for n in obs.notes)


def test_negative_counter_delta_without_created_is_a_reset_over_the_scrape_interval(tmp_path):
    st = VllmState(created_s=900.0)
    st.serve(500, prompt=100, output=10, ttft_s=0.1, itl_s=0.02)
    clock = FakeClock(1000.0)
    with MetricsServer(st.exposition) as srv:
        src = source([srv.url], tmp_path, clock, wait_for_baseline=False)
        with pytest.raises(InsufficientDataError):
            src.observe()
        st.restart(at_s=900.0)  # counters went down, but _created did not move
        st.serve(40, prompt=100, output=10, ttft_s=0.1, itl_s=0.02)
        clock.t = 1030.0
        obs = src.observe()
    assert obs.requests == 40 and obs.arrival_rate_per_s == pytest.approx(40 / 30)
    assert any("counters went down" in n for n in obs.notes)


def test_missing_families_are_named(tmp_path):
    st = VllmState(drop=("vllm:inter_token_latency_seconds", "vllm:num_requests_waiting"))
    with MetricsServer(st.exposition) as srv:
        with pytest.raises(TrafficSourceError) as e:
            source([srv.url], tmp_path, FakeClock(0.0)).observe()
    msg = str(e.value)
    assert "vllm:inter_token_latency_seconds" in msg and "vllm:num_requests_waiting" in msg
    assert "vllm:time_to_first_token_seconds" not in msg


@pytest.mark.parametrize("body,status,match", [
    ("<html><body>Not the metrics</body></html>", 200, "not valid Prometheus text"),
    ("vllm:num_requests_running{engine=\"0\"} not-a-number\n", 200, "not valid Prometheus text"),
    ("", 200, "empty page"),
    ("oops", 500, "HTTP 500"),
])
def test_malformed_or_failing_endpoints_are_traffic_source_errors(tmp_path, body, status, match):
    with MetricsServer(lambda: body, status=status) as srv:
        with pytest.raises(TrafficSourceError, match=match):
            source([srv.url], tmp_path, FakeClock(0.0)).observe()
    assert not (tmp_path / "state.json").exists()  # nothing recorded from a bad scrape


def test_unreachable_endpoint():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    with pytest.raises(TrafficSourceError, match="unreachable"):
        fetch_url(f"http://127.0.0.1:{port}/metrics", 2.0)


def test_stale_baseline_is_discarded_and_corrupt_state_is_an_error(tmp_path):
    st = VllmState()

    def traffic(_s):
        st.serve(30, prompt=100, output=10, ttft_s=0.1, itl_s=0.02)

    clock = FakeClock(1000.0, on_sleep=traffic)
    with MetricsServer(st.exposition) as srv:
        src = source([srv.url], tmp_path, clock, max_interval_s=3600.0)
        src.observe()  # baseline at 1030 s
        clock.t += 2 * 3600  # two hours later: the old scrape would average over hours
        obs = src.observe()
        assert clock.slept == [30.0, 30.0]  # waited for a fresh pair again
        assert obs.arrival_rate_per_s == pytest.approx(30 / 30)
        (tmp_path / "state.json").write_text("{not json")
        with pytest.raises(TrafficSourceError, match="delete it"):
            src.observe()


def test_prefix_cache_counters_give_the_observed_prefix_share_and_reach_the_workload():
    """Two replicas: (queries, hits) deltas (8000, 2000) and (2000, 500) tokens -> share 2500 / 10000 = 0.25;
    the planned workload takes it instead of the plan's shared_prefix_fraction."""
    from recommender.replan.metrics import diff, observe_deltas, parse_exposition
    from recommender.replan.observe import base_workload_from_plan, observed_workload
    from recommender.replan.policy import Policy
    from test_replan_support import fake_plan

    def text(queries: float, hits: float) -> str:
        st = VllmState(model_name="my-model")
        st.serve(30, prompt=800, output=100, ttft_s=0.2, itl_s=0.02)
        return (st.exposition()
                .replace('vllm:prefix_cache_queries_total{engine="0",model_name="my-model"} 0.0',
                         f'vllm:prefix_cache_queries_total{{engine="0",model_name="my-model"}} {queries}')
                .replace('vllm:prefix_cache_hits_total{engine="0",model_name="my-model"} 0.0',
                         f'vllm:prefix_cache_hits_total{{engine="0",model_name="my-model"}} {hits}'))

    deltas = [diff(parse_exposition(text(1000.0, 100.0), "a", 0.0), parse_exposition(text(9000.0, 2100.0), "a", 60.0)),
              diff(parse_exposition(text(0.0, 0.0), "b", 0.0), parse_exposition(text(2000.0, 500.0), "b", 60.0))]
    scrapes = [parse_exposition(text(9000.0, 2100.0), "a", 60.0), parse_exposition(text(2000.0, 500.0), "b", 60.0)]
    obs = observe_deltas(deltas, scrapes, 60.0)
    assert obs.prefix_share == pytest.approx(2500 / 10000)
    cur = fake_plan(2, 2.4)  # shared_prefix_fraction 0.0
    wl, notes = observed_workload(obs, base_workload_from_plan(cur), cur, Policy(min_requests=1), 2.0)
    assert wl.shared_prefix_fraction == pytest.approx(0.25)
    assert "observed prefix-cache share 0.25 (the plan assumed 0.00)" in notes
