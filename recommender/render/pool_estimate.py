"""A plan pool as one ``recommend estimate`` configuration: the request that reproduces it and its command line.

Every engine setting of the pool goes into the request (GPU, TP, pipeline stages and the NIC they were priced
over, DP attention, EP, MTP, dtypes, the checkpoint it loads, limits, ``max_model_len``), so the walkthrough of a plan's pool explains the
engine the plan deploys, not a plain-TP engine of the same GPUs (which for DeepSeek-R1 on H100 does not fit).
"""

from __future__ import annotations

import json
import shlex

from recommender.catalog import default_catalog
from recommender.errors import RecommenderError
from recommender.estimator import EstimateRequest, checkpoint_flag
from recommender.plan import Plan, PlanRow, Pool

__all__ = ["estimate_command", "pool_request"]


def pool_request(plan: Plan, row: PlanRow, pool: Pool, *, prompt_tokens: int, output_tokens: int,
                 concurrency: str | None = "max", batch: int | None = None, replicas: int | None = None,
                 usd_per_gpu_hour: float | None = None) -> EstimateRequest:
    """``pool`` of ``row`` as an :class:`EstimateRequest` at a load (``concurrency``, or a static ``batch``) of
    ``prompt_tokens`` + ``output_tokens`` requests, on ``replicas`` (default the pool's), with the workload's shared
    prefix served by the prefix cache where the pool enables it (as the search priced it)."""
    k = pool.num_speculative_tokens
    spec = json.dumps({"method": "mtp", "num_speculative_tokens": k}, separators=(",", ":")) if k else None
    return EstimateRequest(
        model=_model_name(plan), gpu=pool.gpu, tp=pool.tp, replicas=pool.replicas if replicas is None else replicas,
        weight_dtype=pool.weight_dtype, kv_dtype=pool.kv_dtype, batch=batch,
        concurrency=None if batch is not None else concurrency, prompt_tokens=prompt_tokens,
        output_tokens=output_tokens, engine=plan.engine, usd_per_gpu_hour=usd_per_gpu_hour,
        gpu_memory_utilization=pool.gpu_memory_utilization, cuda_graphs=pool.cuda_graphs,
        max_num_seqs=pool.max_num_seqs, max_num_batched_tokens=pool.max_num_batched_tokens,
        chunked_prefill=pool.chunked_prefill, max_model_len=row.max_model_len or None,
        dp=pool.data_parallel_size, ep=pool.enable_expert_parallel, speculative_config=spec, pp=pool.pp,
        stage_nic_bytes_per_s_per_gpu=pool.stage_nic_bytes_per_s_per_gpu if pool.pp > 1 else None,
        shared_prefix_fraction=plan.workload.shared_prefix_fraction if pool.enable_prefix_caching else 0.0,
        checkpoint=pool.checkpoint or row.checkpoint or "")


def _model_name(plan: Plan) -> str:
    """The checkpoint the plan serves where the catalog knows it as the plan's model (``deepseek-ai/DeepSeek-R1``
    for ``deepseek-v3``: the walkthrough's ``vllm serve`` line names it), else the plan's model."""
    w = plan.workload
    if w.hf_repo and w.hf_repo != w.model:
        try:
            if default_catalog().model(w.hf_repo).id == w.model:
                return w.hf_repo
        except RecommenderError:
            pass
    return w.model


def estimate_command(req: EstimateRequest) -> str:
    """The ``recommend estimate`` command line of ``req`` (shell-quoted; flags at their defaults left out, the
    checkpoint too where ``estimate`` picks the same one without ``--checkpoint``)."""
    args = ["recommend", "estimate", "--model", req.model, "--gpu", req.gpu, "--tp", str(req.tp)]
    for flag, value, default in (("--pipeline-parallel-size", req.pp, 1), ("--data-parallel-size", req.dp, 1),
                                 ("--replicas", req.replicas, None)):
        if value != default:
            args += [flag, str(value)]
    if req.ep:
        args.append("--enable-expert-parallel")
    if req.speculative_config:
        args += ["--speculative-config", req.speculative_config]
    args += ["--weight-dtype", str(req.weight_dtype), "--kv-dtype", req.kv_dtype]
    checkpoint = checkpoint_flag(req)  # the pool's checkpoint where estimate's default is another (online fp8, ...)
    if checkpoint is not None:
        args += ["--checkpoint", checkpoint]
    args += ["--batch", str(req.batch)] if req.batch is not None else (
        ["--concurrency", req.concurrency] if req.concurrency is not None else [])
    args += (["--context", str(req.context_tokens)] if req.context_tokens is not None
             else ["--prompt-tokens", str(req.prompt_tokens), "--output-tokens", str(req.output_tokens)])
    for flag, opt in (("--max-num-seqs", req.max_num_seqs), ("--max-num-batched-tokens", req.max_num_batched_tokens),
                      ("--max-model-len", req.max_model_len)):
        if opt is not None:
            args += [flag, str(opt)]
    if not req.chunked_prefill:
        args.append("--no-chunked-prefill")
    if req.gpu_memory_utilization != 0.92:
        args += ["--gpu-memory-utilization", f"{req.gpu_memory_utilization:g}"]
    if req.engine != "vllm":
        args += ["--engine", req.engine]
    if req.usd_per_gpu_hour is not None:
        args += ["--price", f"{req.usd_per_gpu_hour:g}"]
    if req.shared_prefix_fraction:
        args += ["--shared-prefix-fraction", f"{req.shared_prefix_fraction:g}"]
    return " ".join(shlex.quote(a) for a in args)
