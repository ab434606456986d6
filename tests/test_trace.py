"""One request reader: the simulator's traces and the re-planner's request logs read the same files the same way."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from recommender.errors import ConfigError, TrafficSourceError
from recommender.load.trace import parse_requests, parse_timestamp_s, read_trace
from recommender.replan.logs import read_request_log

AZURE = Path(__file__).parent / "data" / "traffic" / "azure-llm-2023-conv-first2000.csv"


def test_trace_and_request_log_agree_on_the_azure_trace() -> None:
    rows = read_trace(AZURE)
    log = read_request_log(AZURE)
    assert len(rows) == len(log) == 2000
    t = np.array([r[0] for r in rows])
    assert np.allclose(t, log.timestamps_s - log.timestamps_s[0], atol=1e-6)
    assert [r[1] for r in rows] == [max(1, int(x)) for x in log.prompt_tokens]
    assert [r[2] for r in rows] == [max(1, int(x)) for x in log.output_tokens]


@pytest.mark.parametrize(("value", "seconds"), [
    ("2023-11-16 18:15:46.6805900", 1700158546.68059),   # Azure: 7 fractional digits, naive = UTC
    ("2023-11-16T18:15:46Z", 1700158546.0),
    ("2023-11-16T19:15:46+01:00", 1700158546.0),
    (1700158546.5, 1700158546.5),
    ("1700158546500", 1700158546.5),                      # epoch milliseconds
    ("12.5", 12.5),                                       # relative seconds
])
def test_timestamp_rules(value: object, seconds: float) -> None:
    assert parse_timestamp_s(value, "t") == pytest.approx(seconds, abs=1e-6)


def test_jsonl_and_csv_give_the_same_requests_and_errors_use_the_callers_type(tmp_path: Path) -> None:
    csv_text = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,100,10\n2023-11-16 18:15:47.5,200,0\n"
    jsonl = ('{"timestamp": "2023-11-16 18:15:46.5", "prompt_tokens": 100, "output_tokens": 10}\n'
             '{"timestamp": "2023-11-16 18:15:47.5", "prompt_tokens": 200, "output_tokens": 0}\n')
    assert parse_requests(csv_text, "a") == parse_requests(jsonl, "b")
    with pytest.raises(ConfigError, match="no prompt tokens column"):
        parse_requests("time,x,output_tokens\n1,2,3\n", "f")
    with pytest.raises(TrafficSourceError, match="not a non-negative token count"):
        parse_requests("time,prompt_tokens,output_tokens\n1,-2,3\n", "f", error=TrafficSourceError)
    path = tmp_path / "t.csv"
    path.write_text(csv_text)
    assert read_trace(path) == [(0.0, 100, 10), (1.0, 200, 1)]  # the simulator needs >= 1 output token
