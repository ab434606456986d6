"""Round 3 of hostile input and faults, end to end through the CLI: credentials that stay home, CronJob options that
cannot inject, reads that cannot hang or fill memory, special files never replaced, every replan run recorded.

Every refusal is the CLI contract: non-zero exit, one line on stderr, no traceback.
"""

from __future__ import annotations

import json
import os
import re
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml
from hostile_http import HostileServer, answer, trickle
from test_hostile_inputs import assert_one_line_error, run
from test_replan_support import FakePlanner, FakePredictor, VllmState, fake_plan_doc

import recommender.cli.replan as cli_replan
from recommender import bounded
from recommender.errors import TrafficSourceError
from recommender.replan import runner
from recommender.replan.history import History
from recommender.replan.runner import ReplanResult, watch

DATA = Path(__file__).parent / "data"
AGG = DATA / "plans" / "agg-llama70b-h100.json"


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    monkeypatch.setattr(cli_replan, "search_planner", lambda **kw: FakePlanner())
    monkeypatch.setattr(runner, "deploy_writer", lambda: None)
    monkeypatch.setattr(runner, "model_predictor", lambda **kw: FakePredictor())
    monkeypatch.setenv("TOK", "s3cret")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(fake_plan_doc(2, 2.4)))
    policy = tmp_path / "policy.yaml"
    policy.write_text("metrics: {min_scrape_interval: 0.2s, timeout: 1s}\ndata: {min_requests: 20, min_span: 10s}\n")
    return {"plan": plan, "policy": policy, "db": tmp_path / "h.db", "tmp": tmp_path}


def replan(env: dict[str, Path], *args: str):
    return run("replan", "--current", str(env["plan"]), "--policy", str(env["policy"]), "--storage", str(env["db"]),
               *args)


# ------------------------------------------------------------------------------------------ credentials


@pytest.mark.parametrize("prefix, auth", [("", ["--bearer-token-env", "TOK"]), ("prometheus+", ["--bearer-token-env", "TOK"]),
                                          ("", ["--basic-auth-user", "u", "--basic-auth-password-env", "TOK"])])
def test_a_redirect_elsewhere_never_carries_the_credentials(env: dict[str, Path], prefix: str, auth: list[str]) -> None:
    with HostileServer(lambda path, port: answer(body=b"stolen")) as other:
        loc = f"http://127.0.0.1:{other.port}/metrics"
        with HostileServer(lambda path, port: answer("302 Found", headers=[f"Location: {loc}"])) as srv:
            r = replan(env, "--traffic", f"{prefix}{srv.base}/redirect-other", *auth)
            assert srv.requests and srv.requests[0][1]["authorization"], r.output  # sent home only
        assert other.requests == []
    line = assert_one_line_error(r, 2)
    assert "another origin" in line and "s3cret" not in r.output
    assert History(str(env["db"])).list()[0].decision == "error"  # the failed run is recorded


def test_a_trickling_metrics_server_ends_at_the_scrape_timeout_and_is_recorded(env: dict[str, Path]) -> None:
    with HostileServer(lambda path, port: trickle(b"HTTP/1.1 200 OK\r\n" * 10, 0.1)) as srv:
        start = time.monotonic()
        r = replan(env, "--traffic", srv.base + "/metrics")
        assert time.monotonic() - start < 5.0
    assert "within 1 s" in assert_one_line_error(r, 2)
    assert History(str(env["db"])).list()[0].decision == "error"


def _with_success(text: str, value: str) -> str:
    return "\n".join(ln.rsplit(" ", 1)[0] + f" {value}" if ln.startswith("vllm:request_success_total") else ln
                     for ln in text.splitlines()) + "\n"


# "30": a restart's counter holds at least data.min_requests (20) finished requests, or the window is "not enough data"
@pytest.mark.parametrize("second, refused", [("30", False), ("-98.7", True), ("1e300", True)])
def test_falling_negative_or_absurd_counters_never_give_a_negative_or_huge_rate(env: dict[str, Path], second: str,
                                                                               refused: bool) -> None:
    st = VllmState()
    st.serve(500, prompt=800, output=100, ttft_s=0.2, itl_s=0.02)
    high = st.exposition()
    bodies = iter([high, _with_success(high, second)])
    with HostileServer(lambda path, port: answer(body=next(bodies).encode())) as srv:
        r = replan(env, "--traffic", srv.base + "/metrics", "--format", "json")
    doc = json.loads(r.stdout)
    if refused:  # -98.7 req/s or 1e300 / 0.2 s would have been acted on
        assert doc["decision"] == "error" and "must be finite, non-negative" in doc["reason"]
        assert History(str(env["db"])).list()[0].decision == "error"
    else:  # a pod restart: the new value is the traffic since the restart
        assert doc["observed"]["arrival_rate_per_s"] >= 0
        assert any("counter reset" in n for n in doc["observed"]["notes"])


def test_a_state_file_that_is_a_fifo_is_refused_without_hanging(env: dict[str, Path]) -> None:
    fifo = env["tmp"] / "state.json"
    os.mkfifo(fifo)
    with HostileServer(lambda path, port: answer(body=b"x")) as srv:
        r = replan(env, "--traffic", srv.base + "/metrics", "--state", str(fifo))
    assert "not a regular file" in assert_one_line_error(r, 2) or "FIFO" in r.stderr
    assert History(str(env["db"])).list()[0].decision == "error"


def test_a_failure_before_the_source_opens_is_still_a_history_row(env: dict[str, Path]) -> None:
    r = replan(env, "--traffic", "http://x/metrics", "--bearer-token-env", "UNSET_VARIABLE_FOR_TEST")
    assert "UNSET_VARIABLE_FOR_TEST" in assert_one_line_error(r, 2)
    rows = History(str(env["db"])).list()
    assert [x.decision for x in rows] == ["error"] and "UNSET_VARIABLE_FOR_TEST" in rows[0].reason


def test_watch_records_a_failed_cycle_and_keeps_going() -> None:
    calls: list[int] = []
    seen: list[ReplanResult] = []

    def step(plan: object) -> ReplanResult:
        calls.append(1)
        if len(calls) == 2:
            raise TrafficSourceError("the history database went away")
        if len(calls) == 3:
            raise KeyError("bug")
        return ReplanResult("unchanged", "ok", plan, None, None, 0, 0.0)  # type: ignore[arg-type]

    watch(step, object(), 0.0, on_result=seen.append, sleep=lambda s: None, iterations=4)  # type: ignore[arg-type]
    assert [r.decision for r in seen] == ["unchanged", "error", "error", "unchanged"]
    assert "went away" in seen[1].reason and "KeyError" in seen[2].reason


@pytest.mark.parametrize("name", ["a\x1b]0;pwned\x07", "x\x00y", "z" * 201, "  ", "r\u202eevil"])
def test_deployment_names_are_one_printable_line(env: dict[str, Path], name: str) -> None:
    r = replan(env, "--traffic", "http://127.0.0.1:9/metrics", "--deployment", name)
    line = assert_one_line_error(r, 2)
    assert "--deployment" in line and all(ch.isprintable() for ch in line)


# ------------------------------------------------------------------------------------------ CronJob options


@pytest.mark.parametrize("flag, value, match", [
    ("--traffic", "prometheus+http://p:9090\napiVersion: v1\nkind: Secret\nmetadata: {name: hf-token}\n"
                  "stringData: {token: attacker} #", "--traffic"),
    ("--traffic", "file:///etc/passwd", "HTTP only"), ("--traffic", "   ", "blank"),
    ("--traffic", "http://u:p@host/metrics", "credentials"),
    ("--replan-image", "recommender:latest\n- --privileged", "image reference"),
    ("--replan-image", "$(HF_TOKEN) --privileged", "image reference"),
    ("--schedule", "*/5 * * * *\nkind: Secret", "cron"),
])
def test_cronjob_options_cannot_inject(flag: str, value: str, match: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = run("deploy", str(AGG), "--format", "replan-cronjob", flag, value, "--out", str(out))
    assert match in assert_one_line_error(r, 2)
    assert not out.exists()


def test_a_valid_cronjob_has_its_six_objects_and_a_comment_only_header(tmp_path: Path) -> None:
    r = run("deploy", str(AGG), "--format", "replan-cronjob", "--traffic", "prometheus+http://p.mon.svc:9090",
            "--replan-image", "ghcr.io/org/recommender:v1", "--out", str(tmp_path / "o"))
    assert r.exit_code == 0, r.output
    text = (tmp_path / "o" / "replan-cronjob.yaml").read_text()
    assert [d["kind"] for d in yaml.safe_load_all(text) if d] == ["ServiceAccount", "Role", "RoleBinding", "ConfigMap",
                                                                  "PersistentVolumeClaim", "CronJob"]
    assert all(line.startswith("#") for line in text.split("\n---\n", 1)[0].splitlines())


# ------------------------------------------------------------------------------------------ bounds and special files


def test_request_counts_are_bounded_before_any_work() -> None:
    start = time.monotonic()
    line = assert_one_line_error(run("simulate", "--model", "llama-3.1-8b", "--requests", "1000000000"), 2)
    assert "2,000,000" in line and bounded.MAX_REQUESTS_ENV in line
    line = assert_one_line_error(run("estimate", "--model", "llama-3.1-8b", "--gpu", "h100", "--bench",
                                     "--num-prompts", "1000000000"), 2)
    assert "--num-prompts" in line and time.monotonic() - start < 20


def test_a_raised_read_limit_is_not_allocated_up_front(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    small = tmp_path / "small.txt"
    small.write_text("x" * 300)
    monkeypatch.setenv(bounded.MAX_READ_ENV, "10GB")
    tracemalloc.start()
    try:
        assert len(bounded.read_file_bytes(small)) == 300
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000  # read(limit + 1) would have asked for 10 GB


def test_calibration_token_counts_are_bounded(tmp_path: Path) -> None:
    doc = {"model_id": "meta-llama/Llama-3.1-8B-Instruct", "completed": 100, "total_input_tokens": 1e14,
           "total_output_tokens": 10_000, "output_throughput": 1500.0, "median_ttft_ms": 120.0, "median_tpot_ms": 12.0,
           "gpu": "h100-sxm", "tp": 1}
    res = tmp_path / "r.json"
    res.write_text(json.dumps(doc))
    start = time.monotonic()
    line = assert_one_line_error(run("calibrate", str(res), "--out", str(tmp_path / "p.yaml")), 2)
    assert "10,000,000-token" in line and time.monotonic() - start < 20


@pytest.mark.parametrize("kind", ["fifo", "devnull-link", "dir"])
@pytest.mark.parametrize("argv", [["simulate", "--model", "llama-3.1-8b", "--requests", "50", "--timeseries"],
                                  ["calibrate", "RESULT", "--out"]])
def test_outputs_that_are_special_files_are_refused_not_replaced(kind: str, argv: list[str], tmp_path: Path) -> None:
    target = tmp_path / "target"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "devnull-link":
        target.symlink_to("/dev/null")
    else:
        target.mkdir()
    before = os.lstat(target).st_mode
    res = tmp_path / "r.json"
    res.write_text("{}")
    r = run(*[str(res) if a == "RESULT" else a for a in argv], str(target))
    assert_one_line_error(r, 2)
    assert os.lstat(target).st_mode == before


def test_the_atomic_writer_never_replaces_a_device_node(tmp_path: Path) -> None:
    node = tmp_path / "null"
    try:
        os.mknod(node, 0o666 | 0o020000, os.makedev(1, 3))  # a character device like /dev/null (root only)
    except PermissionError:
        pytest.skip("making a device node needs root")
    from recommender.atomic import atomic_write_text

    with pytest.raises(bounded.NotAFileError, match="device node"):
        atomic_write_text(node, "x")
    assert os.stat(node).st_rdev == os.makedev(1, 3)


def test_a_storage_fifo_and_a_garbage_journal_are_one_line(tmp_path: Path) -> None:
    fifo = tmp_path / "study.db"
    os.mkfifo(fifo)
    quick = ["--model", "llama-3.1-8b", "--rate", "2", "--prompt-tokens", "500", "--output-tokens", "100",
             "--trials", "4", "--verify", "0"]
    assert "not a regular file" in assert_one_line_error(run(*quick, "--storage", str(fifo)), 2)
    journal = tmp_path / "study.log"
    journal.write_text(json.dumps({"op_code": 0, "worker_id": "w"}) + "\ngarbage{\n")
    line = assert_one_line_error(run(*quick, "--storage", str(journal)), 2)
    assert str(journal) in line and "line 2" in line


def test_a_log_with_absurd_timestamps_is_refused_and_history_still_lists(env: dict[str, Path]) -> None:
    log = env["tmp"] / "log.jsonl"
    log.write_text("".join(json.dumps({"timestamp": -5e11 + i, "prompt_tokens": 10, "output_tokens": 5}) + "\n"
                           for i in range(30)))
    assert "1970 to 2100" in assert_one_line_error(replan(env, "--traffic", str(log)), 2)
    r = run("history", "--storage", str(env["db"]))
    assert r.exit_code == 0, r.output


def test_the_same_log_named_twice_counts_once(env: dict[str, Path]) -> None:
    log = env["tmp"] / "log.jsonl"
    now = time.time()
    log.write_text("".join(json.dumps({"timestamp": now - 60 + i, "prompt_tokens": 10, "output_tokens": 5}) + "\n"
                           for i in range(60)))
    once = json.loads(replan(env, "--traffic", str(log), "--format", "json").stdout)
    twice = json.loads(replan(env, "--traffic", str(log), f"{env['tmp']}/../{env['tmp'].name}/log.jsonl",
                              "--format", "json").stdout)
    assert twice["observed"]["requests"] == once["observed"]["requests"] == 60


# ------------------------------------------------------------------------------------------ nonsense from the probes

QWEN = json.loads((DATA / "hf_configs" / "Qwen3-8B" / "config.json").read_text())
DSV3 = json.loads((DATA / "hf_configs" / "DeepSeek-V3" / "config.json").read_text())


@pytest.mark.parametrize("base, patch, field", [
    (QWEN, {"layer_types": ["sliding_attention"] * 40, "sliding_window": 4096}, "layer_types"),  # 36 layers
    (QWEN, {"layer_types": ["sliding_attention"] * 36, "sliding_window": None}, "sliding_window"),
    (DSV3, {"q_lora_rank": -100000}, "q_lora_rank"), (DSV3, {"q_lora_rank": 1.5}, "q_lora_rank"),
    (DSV3, {"kv_lora_rank": 0}, "kv_lora_rank"), (DSV3, {"v_head_dim": 0}, "v_head_dim"),
    (QWEN, {"sliding_window": 4096.5, "use_sliding_window": True}, "sliding_window"),
    (QWEN, {"intermediate_size": 12288.5}, "intermediate_size"),
    (QWEN, {"tie_word_embeddings": "false"}, "tie_word_embeddings"),
    (QWEN, {"quantization_config": {"quant_method": "gptq", "bits": 3}}, "bits"),
    (QWEN, {"max_position_embeddings": 1}, "max_position_embeddings"),
    (QWEN, {"torch_dtype": "int3"}, "torch_dtype"),
])
def test_config_json_nonsense_is_refused_naming_the_field(base: dict, patch: dict, field: str) -> None:
    from recommender.errors import UnsupportedArchitectureError
    from recommender.hf_config import arch_from_config

    with pytest.raises(UnsupportedArchitectureError, match=field) as e:
        arch_from_config({**base, **patch}, model_id="probe")
    assert "\n" not in str(e.value)


WL = {"model": "llama-3.1-8b", "traffic": {"arrival_rate": 2}, "prompt_tokens": {"dist": "constant", "value": 500},
      "output_tokens": {"dist": "constant", "value": 100}}


@pytest.mark.parametrize("patch, match", [
    ({"slo": ["tpot=30ms", "tpot=50ms@p99"]}, "two limits on tpot"),
    ({"prompt_tokens": {"dist": "normal", "mean": 10, "std": 0, "min": 100}}, "above the distribution's upper end"),
    ({"prompt_tokens": {"dist": "histogram", "edges": [100, 200], "counts": [1, 1], "max": 150}}, "not max"),
    ({"prompt_tokens": {"dist": "constant", "value": 500, "min": 600, "max": 700}}, "it would be ignored"),
    ({"prompt_tokens": {"dist": "histogram", "edges": [100, 200], "counts": [9e18, 9e18]}}, "counts must be between"),
    ({"prices": {"h100": 2.0, "h100-sxm": 3.0}}, "different prices"),
    ({"checkpoints": {"int3": "org/m-int3"}}, "not a weight dtype"),
    ({"traffic": {"arrival_rate": True}}, "boolean"),
    ({"prompt_tokens": {"dist": "histogram", "edges": [300, 100, 200], "counts": [1, 1, 1]}}, "strictly ascending"),
    ({"gpus": []}, "at least 1"),
    ({"name": "chat\x1b]0;pwned\x07"}, "printable"),
])
def test_workload_nonsense_is_refused_naming_the_field(patch: dict, match: str) -> None:
    from recommender.errors import RecommenderError
    from recommender.workload import workload_from_dict

    with pytest.raises(RecommenderError, match=match) as e:
        workload_from_dict({**WL, **patch}, "w.yaml")
    assert "\n" not in str(e.value) and all(ch.isprintable() for ch in str(e.value))


def test_duplicate_yaml_keys_are_refused(tmp_path: Path) -> None:
    wl = tmp_path / "w.yaml"
    wl.write_text("model: llama-3.1-8b\nmodel: qwen3-8b\ntraffic: {arrival_rate: 2}\n")
    assert "duplicate key 'model' at line 2" in assert_one_line_error(run("--workload", str(wl)), 2)


@pytest.mark.parametrize("link, message", [
    ({"handoff_s": -1.0}, "kv_link_model.handoff_s must be between 0 and 60, got -1"),
    ({"handoff_s": 1e308}, "kv_link_model.handoff_s must be between 0 and 60"),
    ({"latency_s": 61.0}, "kv_link_model.latency_s must be between 0 and 60"),
    ({"nic_bytes_per_s": 0.0}, "nic_bytes_per_s above 0"),
    ({"prefill_tp": 0.0}, "TPs of at least 1"),
    ({"evil": 1.0}, "kv_link_model has unknown field(s) evil"),
])
def test_a_pd_rows_kv_link_is_bounded_on_read(link: dict[str, float], message: str) -> None:
    # the KV link a P/D row was sized with is rebuilt by simulate --plan, replan and the report: a hand-edited one is
    # refused with one line naming the field, before the load model sees it
    from recommender.errors import ConfigError
    from recommender.plan import load_plan

    doc = json.loads((Path(__file__).parent / "data" / "plans" / "pd-rag-tpot30.plan.json").read_text())
    doc["plans"][0]["kv_link_model"].update(link)
    with pytest.raises(ConfigError, match=re.escape(message)) as e:
        load_plan(doc)
    assert "\n" not in str(e.value)


def test_a_pd_rows_kv_link_names_its_bytes_and_nic() -> None:
    from recommender.errors import ConfigError
    from recommender.plan import load_plan

    doc = json.loads((Path(__file__).parent / "data" / "plans" / "pd-rag-tpot30.plan.json").read_text())
    del doc["plans"][0]["kv_link_model"]["bytes_per_token"]
    with pytest.raises(ConfigError, match="kv_link_model lacks bytes_per_token"):
        load_plan(doc)


def test_the_plan_readers_kv_link_bounds_cover_exactly_the_links_fields() -> None:
    # a field KvLink gains must be bounded on read too (and nothing else accepted): the two lists are one contract
    import dataclasses

    from recommender.load.link import KvLink
    from recommender.plan.io import KV_LINK_LIMITS

    assert set(KV_LINK_LIMITS) == {f.name for f in dataclasses.fields(KvLink)}


@pytest.mark.parametrize("patch, message", [
    ({"arrival_rate_per_s": -4.0}, "workload.arrival_rate_per_s must be above 0 and at most 1e+06, got -4"),
    ({"arrival_rate_per_s": 1e300}, "workload.arrival_rate_per_s must be above 0 and at most 1e+06, got 1e+300"),
    ({"arrival_rate_per_s": 0.0}, "workload.arrival_rate_per_s must be above 0"),
    ({"shared_prefix_fraction": 1.0}, "workload.shared_prefix_fraction must be in [0, 1), got 1"),
    ({"prompt_tokens": {"dist": "constant", "mean": -5.0}}, "workload.prompt_tokens.mean must be between 0 and"),
    ({"output_tokens": {"dist": "empirical", "mean": 10.0, "samples": [10, -3], "weights": [1.0, 1.0]}},
     "workload.output_tokens.samples must be above 0"),
    ({"deadline_s": -1.0}, "workload.deadline_s must be above 0"),
])
def test_a_plans_workload_figures_are_bounded_on_read(patch: dict[str, object], message: str, tmp_path: Path) -> None:
    """They reach vllm bench serve's --request-rate and KEDA's threshold: a hand-edited rate of -4 req/s was written
    into bench.sh and keda.yaml. Refused with one line, no file written, as a workload file's would be."""
    doc = json.loads((Path(__file__).parent.parent / "examples" / "plans" / "rag.plan.json").read_text())
    doc["workload"].update(patch)
    plan = tmp_path / "edited.json"
    plan.write_text(json.dumps(doc))
    out = tmp_path / "out"
    err = assert_one_line_error(run("deploy", str(plan), "--format", "bench,keda", "-o", str(out)), 2)
    assert message in err and not out.exists()
