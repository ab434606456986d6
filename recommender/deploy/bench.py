"""``deploy --format bench``: the ``vllm bench serve`` runs that check a deployed plan, and the ``calibrate`` line.

``bench.sh`` (POSIX sh) runs, against the endpoint the user names (``BASE_URL``):

1. **the SLO check**: the plan's workload at the plan's arrival rate through the router (all replicas), with
   ``--percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99``; the plan's predicted TTFT / TPOT
   at its percentile are printed beside it as comments, with the row's p10-p90 band (the model's stated error,
   ``bands``; docs/bands.md) to read a measured value against;
2. **the calibration run** (aggregated plans): ONE replica (``REPLICA_URL``, e.g. a port-forward to one engine
   pod) at ``rate / replicas``, which is what ``recommend calibrate`` fits (its quantities are per replica),
   then the ``recommend calibrate`` command with the plan's engine settings.

Lengths use vLLM's ``random`` dataset: ``--random-input-len`` = the mean and ``--random-range-ratio r``
(uniform on ``[mean (1 - r), mean (1 + r)]``) with ``r`` matched to the distribution's p90:
``p90 = mean (1 + 0.8 r)``, so ``r = (p90 / mean - 1) / 0.8``, clipped to ``[0, 0.95]``. A uniform
stand-in keeps the mean and the p90, not the tail; the plan's workload file is the reference.

Offline plans (no arrival rate) send their requests at once (``--request-rate inf``).
Flag names are vLLM 0.33's (``vllm/benchmarks/serve.py``; ``recommender/data/vllm`` keeps the serve flags).
"""

from __future__ import annotations

import math

from recommender.deploy.shell import quote
from recommender.deploy.spec import DeploySpec, PoolSpec
from recommender.plan import LengthSummary, Plan, PlanRow
from recommender.render.plan import latency_band_cells
from recommender.units import fmt_seconds

#: seconds of traffic the SLO check sends at the plan's rate (enough for stable p90s; bounded below/above)
BENCH_SECONDS = 300.0
MIN_PROMPTS, MAX_PROMPTS = 200, 5000
MAX_RANGE_RATIO = 0.95


def range_ratio(d: LengthSummary | None) -> float:
    """``r`` with ``mean (1 + 0.8 r) = p90`` for a uniform on ``[mean (1 - r), mean (1 + r)]``; 0 when unknown."""
    if d is None or d.p90 is None or d.mean <= 0:
        return 0.0
    return round(min(MAX_RANGE_RATIO, max(0.0, (d.p90 / d.mean - 1.0) / 0.8)), 3)


def num_prompts(rate_per_s: float | None, offline_requests: int | None) -> int:
    """Prompts in the SLO check: ``BENCH_SECONDS`` of traffic at the rate, within [200, 5000]."""
    if rate_per_s is None:
        return max(1, min(MAX_PROMPTS, offline_requests or MIN_PROMPTS))
    return int(min(MAX_PROMPTS, max(MIN_PROMPTS, math.ceil(rate_per_s * BENCH_SECONDS))))


def _length(d: LengthSummary | None, default: int) -> int:
    return max(1, round(d.mean)) if d is not None else default


def bench_args(spec: DeploySpec, plan: Plan, *, base_url_var: str, rate_per_s: float | None, prompts: int,
               result_file: str) -> list[list[str]]:
    """``vllm bench serve`` arguments, grouped per flag (the base URL as a shell variable, not quoted)."""
    w = plan.workload
    p_ratio, o_ratio = range_ratio(w.prompt_tokens), range_ratio(w.output_tokens)
    ratio = f'{{"input":{p_ratio:g},"output":{o_ratio:g}}}' if p_ratio != o_ratio else f"{p_ratio:g}"
    return [
        ["--backend", "vllm"], ["--base-url", f"${{{base_url_var}}}"], ["--model", spec.served_model_names[0]],
        ["--tokenizer", spec.hf_repo], ["--dataset-name", "random"],
        ["--random-input-len", str(_length(w.prompt_tokens, 1024))],
        ["--random-output-len", str(_length(w.output_tokens, 128))], ["--random-range-ratio", ratio],
        ["--ignore-eos"], ["--request-rate", "inf" if rate_per_s is None else f"{rate_per_s:.6g}"],
        ["--num-prompts", str(prompts)], ["--percentile-metrics", "ttft,tpot,itl,e2el"],
        ["--metric-percentiles", "50,90,99"], ["--save-result"], ["--result-dir", "bench-results"],
        ["--result-filename", result_file],
    ]


def _command(head: str, groups: list[list[str]]) -> str:
    def word(a: str) -> str:
        return f'"{a}"' if a.startswith("${") else quote(a)  # our own "${VAR}"s expand; nothing else does

    body = [head] + ["  " + " ".join(word(a) for a in g) for g in groups]
    return " \\\n".join(body)


def calibrate_args(spec: DeploySpec, plan: Plan) -> list[list[str]]:
    """``recommend calibrate`` on the calibration run, with the pool's engine settings spelled out."""
    p = spec.pools[0]
    return [["bench-results/replica.json"], ["--engine", plan.engine], ["--model", spec.model_id],
            ["--gpu", p.gpu.id], ["--tp", str(p.tp)], ["--weight-dtype", p.weight_dtype], ["--kv-dtype", p.kv_dtype],
            ["--max-num-seqs", str(p.max_num_seqs)], ["--max-num-batched-tokens", str(p.max_num_batched_tokens)],
            ["--out", "my-profile.yaml"]]


def _predicted(row: PlanRow) -> str:
    """'TTFT 100.4 ms, TPOT 20.00 ms, e2e 7.64 s' (a hand-written plan may leave a latency out)."""
    parts = [f"{name} {fmt_seconds(v)}" for name, v in (("TTFT", row.ttft_s), ("TPOT", row.tpot_s), ("e2e", row.e2e_s))
             if v is not None and math.isfinite(v)]
    return ", ".join(parts) or "no latencies in the plan"


def _band(row: PlanRow) -> str | None:
    """'the model's stated error (p10-p90, class vllm/hopper/bf16/dense, 10 rows): TTFT 49.0 ms - 152 ms, ...' from the
    row's ``bands`` (search/bands.py; docs/bands.md); None without bands. An upper end of null: the pools saturate."""
    b = row.bands or {}
    parts = latency_band_cells(b)
    if not parts:
        return None
    return (f"the model's stated error (p10-p90, class {b.get('class', '?')}, {b.get('class_rows', 0)} rows): "
            + ", ".join(parts))


def render_bench(spec: DeploySpec, plan: Plan) -> dict[str, str]:
    """``bench.sh``: the SLO check, the per-replica calibration run and the ``calibrate`` command."""
    w = plan.workload
    row = next(r for r in plan.rows if r.rank == spec.rank)
    rate = w.arrival_rate_per_s
    lines = ["#!/bin/sh", f"# vllm bench serve runs that check plan rank {spec.rank} ({spec.plan_id}) of {spec.plan_name}",
             f"# workload {spec.workload_name}: what the plan predicts at {row.percentile}: {_predicted(row)}",
             *([f"# {band}"] if (band := _band(row)) else []),
             "# Lengths: vLLM's random dataset, uniform around the mean with the workload's p90 (see"
             " recommender/deploy/bench.py).",
             "# BASE_URL: the deployment's endpoint (router / service), e.g. kubectl port-forward svc/<router> 8000:80",
             "set -eu", ': "${BASE_URL:=http://127.0.0.1:8000}"', "mkdir -p bench-results", "",
             "# 1. SLO check: the plan's traffic through the router"]
    lines.append(_command("vllm bench serve", bench_args(spec, plan, base_url_var="BASE_URL", rate_per_s=rate,
                                                         prompts=num_prompts(rate, w.offline_requests),
                                                         result_file="deployment.json")))
    pool = spec.pools[0]
    if spec.disaggregated:
        lines += ["", "# 2. Calibration: recommend calibrate fits aggregated engines; a P/D plan is checked by run 1",
                  "#    only (calibrate each pool's engine on an aggregated test deployment of the same shape)."]
    else:
        per_replica = None if rate is None else rate / pool.replicas
        lines += ["", f"# 2. Calibration: ONE engine replica (REPLICA_URL, e.g. kubectl port-forward pod/<engine pod>"
                      f" 8001:8000) at rate / {pool.replicas} replica(s)",
                  ': "${REPLICA_URL:=http://127.0.0.1:8001}"']
        lines.append(_command("vllm bench serve", bench_args(
            spec, plan, base_url_var="REPLICA_URL", rate_per_s=per_replica,
            prompts=num_prompts(per_replica, None if w.offline_requests is None
                                else math.ceil(w.offline_requests / pool.replicas)),
            result_file="replica.json")))
        beyond = calibrate_cannot_describe(pool)
        if beyond:
            lines += ["", f"# 3. Not fed back: recommend calibrate fits TP engines, and this replica runs {beyond}; a",
                      "#    profile fitted to it would describe another engine. Run 2's result is the replica's measured"
                      " figures against the plan's."]
        else:
            lines += ["", "# 3. Feed the replica's result back: a profile fitted to your cluster, for --profile",
                      _command("recommend calibrate", calibrate_args(spec, plan))]
    return {"bench.sh": "\n".join(lines) + "\n"}


def calibrate_cannot_describe(pool: PoolSpec) -> str:
    """What of a pool's engine ``recommend calibrate`` cannot state (its results carry TP, dtypes and limits, not
    pipeline stages, DP attention, EP or MTP: ``calibrate.readers.FIELD_KEYS``), as words; "" when it can."""
    parts = [f"{pool.pp} pipeline stages" if pool.pp > 1 else "",
             f"data-parallel attention over {pool.data_parallel_size} ranks" if pool.data_parallel_size > 1 else "",
             "expert parallelism" if pool.enable_expert_parallel else "",
             (f"MTP with {pool.num_speculative_tokens} draft token{'s' if pool.num_speculative_tokens > 1 else ''}"
              if pool.num_speculative_tokens else "")]
    return ", ".join(x for x in parts if x)
