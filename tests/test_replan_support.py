"""Shared helpers for the re-planning tests (no tests here).

* ``fake_plan`` / ``FakePlanner``: a typed plan (read from a plan JSON in the ARCHITECTURE.md shape by
  ``recommender.plan.load_plan``) whose replica count is the hand formula ``replicas = ceil(rate /
  PER_REPLICA_REQ_S)`` and cost ``replicas * tp * USD_PER_GPU_HOUR`` (or, rented in whole instances of
  ``gpus_per_instance`` GPUs, ``ceil(replicas * tp / gpus_per_instance) * usd_per_instance_hour``).
* ``VllmState.exposition()``: the real vLLM 0.33 exposition (tests/data/traffic/vllm-metrics-example.txt)
  with the sample values of the families we read rewritten from a simple state, so a test knows exactly
  what the endpoint served, under ``model_name`` (default: fake_plan's model).
* ``MetricsServer``: that text (or anything) served on 127.0.0.1 from a thread (http.server, port 0).
"""

from __future__ import annotations

import http.server
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from recommender.plan import Plan, load_plan

DATA = Path(__file__).parent / "data" / "traffic"
FIXTURE = (DATA / "vllm-metrics-example.txt").read_text()
AZURE = DATA / "azure-llm-2023-conv-first2000.csv"

PER_REPLICA_REQ_S = 1.0
USD_PER_GPU_HOUR = 2.0


def fake_plan(replicas: int, sized_rate: float, *, tp: int = 1, gpu: str = "h100-sxm",
              slo: list[dict[str, Any]] | None = None, name: str = "chat", gpus_per_instance: int | None = None,
              usd_per_instance_hour: float = 0.0) -> Plan:
    """A one-row plan, read from :func:`fake_plan_doc`."""
    return load_plan(fake_plan_doc(replicas, sized_rate, tp=tp, gpu=gpu, slo=slo, name=name,
                                   gpus_per_instance=gpus_per_instance, usd_per_instance_hour=usd_per_instance_hour))


def fake_plan_doc(replicas: int, sized_rate: float, *, tp: int = 1, gpu: str = "h100-sxm",
                  slo: list[dict[str, Any]] | None = None, name: str = "chat", gpus_per_instance: int | None = None,
                  usd_per_instance_hour: float = 0.0) -> dict[str, Any]:
    """A one-row plan document (version 1) in the shape of docs/ARCHITECTURE.md; with ``gpus_per_instance``
    its pool rents whole instances from provider 'cloud'."""
    usd = replicas * tp * USD_PER_GPU_HOUR
    rental: dict[str, Any] = {}
    if gpus_per_instance is not None:
        instances = math.ceil(replicas * tp / gpus_per_instance)
        usd = instances * usd_per_instance_hour
        rental = {"provider": "cloud", "instances": instances, "gpus_per_instance": gpus_per_instance,
                  "usd_per_instance_hour": usd_per_instance_hour, "usd_per_hour": usd}
    return {
        "version": 1,
        "workload": {"name": name, "model": "llama-3.1-8b", "arrival_rate_per_s": sized_rate,
                     "prompt_tokens": {"dist": "lognormal", "mean": 1000.0, "p50": 900, "p90": 2000, "p99": 4000,
                                       "min": 10, "max": 6000},
                     "output_tokens": {"dist": "lognormal", "mean": 250.0, "p50": 220, "p90": 450, "p99": 600,
                                       "min": 1, "max": 1000},
                     "max_model_len": 7000, "shared_prefix_fraction": 0.0, "source": "test"},
        "slo": slo if slo is not None else [{"metric": "ttft", "limit_s": 2.0, "percentile": "p99"},
                                            {"metric": "tpot", "limit_s": 0.05, "percentile": "p90"}],
        "engine": "vllm", "profile": "vllm",
        "plans": [{
            "rank": 1, "id": f"{gpu}-tp{tp}-bf16-bf16-s256-b8192-r{replicas}", "gpu": gpu, "gpus_total": replicas * tp,
            "tp": tp, "replicas": replicas, "weight_dtype": "bf16", "kv_dtype": "bf16", "max_num_seqs": 256,
            "max_num_batched_tokens": 8192, "chunked_prefill": True, "enable_prefix_caching": True,
            "cuda_graphs": True, "gpu_memory_utilization": 0.92, "max_model_len": 7000, "disaggregated": False,
            "pools": [{"role": "both", "gpu": gpu, "tp": tp, "replicas": replicas, "weight_dtype": "bf16",
                       "kv_dtype": "bf16", "max_num_seqs": 256, "max_num_batched_tokens": 8192,
                       "chunked_prefill": True, "gpu_memory_utilization": 0.92, **rental}],
            "ttft_s": 0.3, "tpot_s": 0.02, "e2e_s": 5.0, "percentile": "p90", "output_tokens_per_s": 1000.0 * replicas,
            "utilisation": 0.6, "usd_per_hour": usd, "usd_per_million_output_tokens": 1.0,
            "usd_per_million_tokens": 0.1, "pareto": True, "binding": "tpot", "quality_note": ""}],
    }


@dataclass
class FakePlanner:
    """replicas = ceil(workload rate / PER_REPLICA_REQ_S); records every workload it was asked about."""

    calls: list[Any] = field(default_factory=list)

    def __call__(self, workload: Any, current: Plan | None) -> Plan:
        self.calls.append((workload, current))
        rate = float(workload.arrival_rate_per_s)
        return fake_plan(max(1, math.ceil(rate / PER_REPLICA_REQ_S - 1e-9)), rate)


# ---------------------------------------------------------------------------------------------
# real-format vLLM /metrics with controlled values
# ---------------------------------------------------------------------------------------------
HIST_VALUES = {  # our state key -> vLLM histogram family
    "prompt": "vllm:request_prompt_tokens", "output": "vllm:request_generation_tokens",
    "ttft": "vllm:time_to_first_token_seconds", "itl": "vllm:inter_token_latency_seconds",
    "e2e": "vllm:e2e_request_latency_seconds", "queue": "vllm:request_queue_time_seconds",
}


@dataclass
class VllmState:
    """Cumulative totals since the (fake) process start ``created_s``."""

    created_s: float = 1.7e9
    requests: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    observations: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in HIST_VALUES})
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    drop: tuple[str, ...] = ()  # family names to leave out (missing-family tests)
    model_name: str = "llama-3.1-8b"  # the label vLLM reports (the fixture's 'my-model'); fake_plan's model

    def serve(self, n: int, prompt: int, output: int, ttft_s: float, itl_s: float, e2e_s: float = 5.0,
              queue_s: float = 0.0) -> None:
        """Account ``n`` finished requests with these lengths and latencies (one ITL sample per output token - 1)."""
        self.requests += n
        self.prompt_tokens += n * prompt
        self.generation_tokens += n * output
        o = self.observations
        o["prompt"] += [prompt] * n
        o["output"] += [output] * n
        o["ttft"] += [ttft_s] * n
        o["itl"] += [itl_s] * (n * (output - 1))
        o["e2e"] += [e2e_s] * n
        o["queue"] += [queue_s] * n

    def restart(self, at_s: float) -> None:
        """The pod restarts at ``at_s``: every counter and histogram starts from zero."""
        self.created_s = at_s
        self.requests = self.prompt_tokens = self.generation_tokens = 0
        self.observations = {k: [] for k in HIST_VALUES}

    def _value(self, name: str, labels: str, original: str) -> str | None:
        fam = {v: k for k, v in HIST_VALUES.items()}
        if name == "vllm:request_success_total":
            return str(float(self.requests)) if 'finished_reason="stop"' in labels else "0.0"
        if name == "vllm:prompt_tokens_total":
            return str(float(self.prompt_tokens))
        if name == "vllm:generation_tokens_total":
            return str(float(self.generation_tokens))
        if name.endswith("_created"):
            return repr(self.created_s)
        if name == "vllm:num_requests_running":
            return str(self.running)
        if name == "vllm:num_requests_waiting":
            return str(self.waiting)
        if name == "vllm:kv_cache_usage_perc":
            return str(self.kv_usage)
        for suffix in ("_bucket", "_sum", "_count"):
            base = name[: -len(suffix)]
            if name.endswith(suffix) and base in fam:
                xs = self.observations[fam[base]]
                if suffix == "_sum":
                    return repr(float(sum(xs)))
                if suffix == "_count":
                    return str(float(len(xs)))
                le_txt = labels.split('le="', 1)[1].split('"', 1)[0]
                le = math.inf if le_txt == "+Inf" else float(le_txt)
                return str(float(sum(1 for x in xs if x <= le)))
        return original

    def exposition(self) -> str:
        out = []
        for line in FIXTURE.splitlines():
            if line.startswith("#") or not line.strip():
                if not any(line.split(" ")[2:3] == [d] or line.split(" ")[2:3] == [d + "_total"] for d in self.drop):
                    out.append(line)
                continue
            left, value = line.rsplit(" ", 1)
            name, _, labels = left.partition("{")
            if any(name == d or name.startswith(d + "_") for d in self.drop):
                continue
            out.append(f"{left} {self._value(name, labels, value)}")
        return "\n".join(out).replace('model_name="my-model"', f'model_name="{self.model_name}"') + "\n"


class MetricsServer:
    """Serve ``body()`` on http://127.0.0.1:<port>/metrics from a daemon thread (``with`` block)."""

    def __init__(self, body: Callable[[], str], status: int = 200) -> None:
        self.body = body
        self.status = status
        self.hits = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server API)
                outer.hits += 1
                data = outer.body().encode()
                self.send_response(outer.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"

    def __enter__(self) -> "MetricsServer":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class FakeClock:
    """A clock tests advance by hand; ``sleep`` advances it (and runs an optional hook)."""

    def __init__(self, t: float, on_sleep: Callable[[float], None] | None = None) -> None:
        self.t = t
        self.on_sleep = on_sleep
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        if self.on_sleep is not None:
            self.on_sleep(s)
        self.t += s


@dataclass
class FakePredictor:
    """The fake planner's model: a plan of R replicas meets ``rate`` iff R x PER_REPLICA_REQ_S >= rate."""

    calls: int = 0

    def __call__(self, plan: Plan, workload: Any, replicas: tuple[int, ...] | None = None) -> Any:
        from recommender.replan.predict import Prediction

        self.calls += 1
        r = sum(replicas) if replicas is not None else plan.top.replicas
        rate = float(workload.arrival_rate_per_s)
        util = rate / (r * PER_REPLICA_REQ_S)
        misses = () if util <= 1.0 + 1e-9 else (f"predicted capacity {r * PER_REPLICA_REQ_S:.2f} req/s < {rate:.2f} req/s",)
        return Prediction(rate, util < 1.0, util, 1.0, {}, misses, (r,))
