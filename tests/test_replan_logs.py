"""Request logs (JSONL / CSV / the Azure trace CSV) as a traffic source."""

from __future__ import annotations

import csv
import json
from datetime import datetime, timezone

import pytest

from recommender.errors import TrafficSourceError
from recommender.replan.logs import RequestLog, observe_log, parse_request_log, read_request_log
from recommender.replan.observation import InsufficientDataError
from test_replan_support import AZURE


def observe(log, **kw):
    args = dict(window_s=900.0, subwindow_s=60.0, min_requests=20, min_span_s=60.0, max_samples=2000)
    args.update(kw)
    return observe_log(log, **args)


def test_azure_slice_request_count_and_rate():
    """The first 2,000 requests of the Azure conversation trace (Splitwise, ISCA 2024).

    First row 2023-11-16 18:15:46.6805900, last row 18:22:50.9400470 (tests/data/traffic): the span is
    7 min 4.259457 s = 424.259457 s, so the rate over the whole slice is 2000 / 424.259457 = 4.7141 req/s.
    """
    log = read_request_log(AZURE)
    assert len(log) == 2000
    obs = observe(log, window_s=3600.0)  # window longer than the slice: the whole slice
    assert obs.requests == 2000
    assert obs.window_s == pytest.approx(424.259457, abs=1e-6)
    assert obs.arrival_rate_per_s == pytest.approx(2000 / 424.259457, rel=1e-6)
    assert obs.arrival_rate_per_s == pytest.approx(4.7141, abs=1e-4)
    assert len(obs.rate_points) == 7  # floor(424.26 / 60) equal sub-windows
    with open(AZURE) as f:  # independent means straight from the CSV
        rows = list(csv.DictReader(f))
    assert obs.prompt_tokens.mean_tokens == pytest.approx(sum(int(r["ContextTokens"]) for r in rows) / 2000)
    assert obs.output_tokens.mean_tokens == pytest.approx(sum(int(r["GeneratedTokens"]) for r in rows) / 2000)
    assert obs.prompt_tokens.samples == tuple(sorted(int(r["ContextTokens"]) for r in rows))  # 2000 <= max


def test_azure_slice_last_five_minutes():
    log = read_request_log(AZURE)
    with open(AZURE) as f:
        ts = [datetime.fromisoformat(r["TIMESTAMP"]) for r in csv.DictReader(f)]
    start = ts[-1].timestamp() - 300
    expected = sum(1 for t in ts if t.replace(tzinfo=timezone.utc).timestamp() >= start)
    obs = observe(log, window_s=300.0)
    assert obs.requests == expected
    assert obs.arrival_rate_per_s == pytest.approx(expected / 300.0)
    assert len(obs.rate_points) == 5


def test_jsonl_timestamps_iso_epoch_seconds_and_milliseconds_agree():
    t0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=timezone.utc).timestamp()  # 1714564800
    lines = [
        {"timestamp": "2024-05-01T12:00:00Z", "prompt_tokens": 100, "output_tokens": 10},
        {"timestamp": "2024-05-01 12:00:01", "prompt_tokens": 200, "output_tokens": 20},
        {"timestamp": t0 + 2, "prompt_tokens": 300, "output_tokens": 30},
        {"timestamp": (t0 + 3) * 1000, "prompt_tokens": 400, "output_tokens": 40},
        {"timestamp": str(t0 + 4), "prompt_tokens": 500, "output_tokens": 50},
    ]
    log = parse_request_log("\n".join(json.dumps(x) for x in lines) + "\n\n", "x.jsonl")
    assert list(log.timestamps_s) == [t0, t0 + 1, t0 + 2, t0 + 3, t0 + 4]
    assert list(log.prompt_tokens) == [100, 200, 300, 400, 500]


def test_a_half_written_last_line_is_left_for_the_next_run():
    text = '{"timestamp": 1, "prompt_tokens": 2, "output_tokens": 3}\n{"timestamp": 2, "prompt_tok'
    assert len(parse_request_log(text, "live.jsonl")) == 1
    assert len(parse_request_log("ts,prompt_tokens,output_tokens\n1,2,3\n2,3", "live.csv")) == 1
    assert len(parse_request_log("ts,prompt_tokens,output_tokens\n1,2,3\n2,3,4", "no-newline.csv")) == 2
    with pytest.raises(TrafficSourceError):
        parse_request_log("ts,prompt_tokens,output_tokens\n1,x,3\n2,3,4", "bad.csv")  # not the last line


def test_csv_with_generic_columns_is_sorted_by_time():
    text = "ts,prompt_tokens,output_tokens,user\n30,5,6,a\n10,1,2,b\n20,3,4,c\n"
    log = parse_request_log(text, "x.csv")
    assert list(log.timestamps_s) == [10, 20, 30] and list(log.output_tokens) == [2, 4, 6]


@pytest.mark.parametrize("text,match", [
    ("when,prompt_tokens,output_tokens\n1,2,3\n", "no timestamp column"),
    ("timestamp,prompt_tokens,output_tokens\nyesterday,2,3\n", r"x:2: cannot read timestamp"),
    ("timestamp,prompt_tokens,output_tokens\n1,-2,3\n", "not a non-negative token count"),
    ('{"timestamp": 1, "prompt_tokens": 2}\n', "no output tokens column"),
    ('{"timestamp": 1, "prompt_tokens": 2, "output_tokens": 3}\nnot json\n', r"x:2: not a JSON object"),
])
def test_malformed_logs_name_the_line_and_field(text, match):
    with pytest.raises(TrafficSourceError, match=match):
        parse_request_log(text, "x")


def test_too_few_requests_says_how_many_more():
    log = RequestLog.of([0, 10, 20, 30, 100], [1] * 5, [1] * 5)
    with pytest.raises(InsufficientDataError, match=r"hold 5 request\(s\) over 100 s.*15 more request\(s\)"):
        observe(log)
    short = RequestLog.of([i * 0.5 for i in range(40)], [1] * 40, [1] * 40)  # 40 requests over 19.5 s
    with pytest.raises(InsufficientDataError, match=r"40 s more of log"):
        observe(short)
    with pytest.raises(InsufficientDataError, match="holds no requests"):
        observe(RequestLog.of([], [], []))


def test_live_log_window_ends_now_so_silence_counts():
    # 60 requests at 0, 1, ..., 59 s, then nothing; at 120 s the rate is 60 / (120 - 0) s
    log = RequestLog.of([float(i) for i in range(60)], [100] * 60, [10] * 60)
    obs = observe(log, now_s=120.0)
    assert obs.end_s == 120.0 and obs.arrival_rate_per_s == pytest.approx(60 / 120)
    assert [p.rate_per_s for p in obs.rate_points] == [1.0, 0.0]
    future = RequestLog.of([i + 0.5 for i in range(200)], [1] * 200, [1] * 200)
    assert observe(future, now_s=100.0).requests == 100  # requests after "now" are not seen yet
    old = observe(log, now_s=10_000.0, min_span_s=30.0)  # a log older than the window is replayed from its end
    assert old.end_s == 59.0 and any("replay" in n for n in old.notes)


def test_length_samples_are_bounded_order_statistics():
    log = RequestLog.of(list(range(1000)), list(range(1, 1001)), [7] * 1000)
    obs = observe(log, window_s=5000.0, max_samples=11)
    assert obs.prompt_tokens.samples == (1, 101, 201, 301, 401, 501, 600, 700, 800, 900, 1000)


def test_openai_usage_jsonl_and_batch_output_lines_are_read_with_the_cached_share():
    """The OpenAI chat-completion response shape (``created`` unix seconds, ``usage.prompt_tokens``,
    ``usage.completion_tokens``, ``usage.prompt_tokens_details.cached_tokens``) and the same body wrapped
    as a Batch API output line."""
    t0 = 1_714_564_800
    resp = [{"id": f"chatcmpl-{i}", "object": "chat.completion", "created": t0 + i, "model": "m",
             "usage": {"prompt_tokens": 1000, "completion_tokens": 100 + i, "total_tokens": 1100 + i,
                       "prompt_tokens_details": {"cached_tokens": 250}}} for i in range(30)]
    lines = [json.dumps(r) for r in resp[:15]]
    lines += [json.dumps({"id": f"batch_req_{i}", "custom_id": f"c{i}", "response": {"status_code": 200, "body": r}})
              for i, r in enumerate(resp[15:])]
    log = parse_request_log("\n".join(lines) + "\n", "usage.jsonl")
    assert list(log.timestamps_s) == [float(t0 + i) for i in range(30)]
    assert list(log.output_tokens) == [100 + i for i in range(30)] and set(log.prompt_tokens) == {1000}
    o = observe(log, min_span_s=10.0)
    assert o.requests == 30 and o.prefix_share == pytest.approx(250 / 1000)  # cached / prompt tokens
    # a log without cached tokens reports no share (the plan's shared_prefix_fraction stays)
    plain = parse_request_log("\n".join(json.dumps({"created": t0 + i, "usage": {"prompt_tokens": 5,
                              "completion_tokens": 7}}) for i in range(30)) + "\n", "plain.jsonl")
    assert observe(plain, min_span_s=10.0).prefix_share is None and list(plain.output_tokens) == [7] * 30


def test_the_replay_trace_and_the_request_log_are_one_reader():
    """`recommend autoscale`/`simulate --trace` and `replan --request-log` read a file the same way: the
    Azure slice's arrivals (relative to its first, 2023-11-16 18:15:46.6805900) and lengths agree row by row,
    and a malformed line is refused by both with the same line number."""
    from recommender.errors import ConfigError
    from recommender.load.trace import read_trace

    log = read_request_log(AZURE)
    rows = read_trace(AZURE)
    assert len(rows) == len(log) == 2000
    t0 = float(log.timestamps_s[0])
    assert [r[0] for r in rows] == pytest.approx([float(t) - t0 for t in log.timestamps_s], abs=1e-6)
    assert [r[1] for r in rows] == [max(1, int(n)) for n in log.prompt_tokens]
    assert [r[2] for r in rows] == [max(1, int(n)) for n in log.output_tokens]
    bad = "timestamp,prompt_tokens,output_tokens\n1700000000,10,5\n1700000001,-3,5\n1700000002,10,5\n"
    with pytest.raises(TrafficSourceError, match=r"log:3: prompt_tokens '-3'"):
        parse_request_log(bad, "log")
    from recommender.load.trace import parse_requests
    with pytest.raises(ConfigError, match=r"log:3: prompt_tokens '-3'"):
        parse_requests(bad, "log")
