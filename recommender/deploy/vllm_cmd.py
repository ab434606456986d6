"""The ``vllm serve`` arguments for one pool, and the shell-script (``cmd``) rendering.

``engine_options`` maps a :class:`PoolSpec` to vLLM 0.33 settings one to one:

=========================== ================================================================
plan field                  vllm serve flag
=========================== ================================================================
tp                          ``--tensor-parallel-size``
max_num_seqs                ``--max-num-seqs``
max_num_batched_tokens      ``--max-num-batched-tokens`` (plain integer: vLLM reads 8k as 8000)
chunked_prefill             ``--enable-chunked-prefill`` / ``--disable-chunked-prefill``
enable_prefix_caching       ``--enable-prefix-caching`` / ``--disable-prefix-caching``
gpu_memory_utilization      ``--gpu-memory-utilization``
kv_dtype bf16|fp16 / fp8    ``--kv-cache-dtype auto`` / ``fp8``
max_model_len (workload)    ``--max-model-len``
weights (spec.py policy)    model positional, ``--quantization fp8`` or ``--dtype`` when needed
cuda_graphs on              ``--max-cudagraph-capture-size min(max_num_seqs x q, cap)``, ``q = 1 + k``
                            query tokens per decoding sequence (``k`` MTP draft tokens, else 1): vLLM's
                            capture sizes count tokens, so every decode step the plan allows is captured
                            up to vLLM's default cap (rounded down to a multiple of ``q``, as vLLM
                            rounds its spec-decode capture sizes): ``cap`` 1024 on datacenter Blackwell
                            (B200, B300, GB200, GB300: the catalog's ``blackwell`` architecture), else 512
cuda_graphs off             ``--enforce-eager``
disaggregated role          ``--kv-transfer-config`` NixlConnector, kv_producer / kv_consumer
data_parallel_size > 1      ``--data-parallel-size`` (attention ranks; the engine runs tp x dp GPUs)
enable_expert_parallel      ``--enable-expert-parallel``
num_speculative_tokens k>0  ``--speculative-config '{"method":"mtp","num_speculative_tokens":k}'``
=========================== ================================================================

Every argv is passed through :func:`recommender.deploy.vllm_flags.check_serve_args` before it is
returned, so a flag vLLM 0.33 would reject is never emitted. The cmd form quotes every argument
through :mod:`recommender.deploy.shell` (``shlex.quote``), so no model name can inject shell code, and the
scripts' messages go through the same helper.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from recommender.deploy import shell
from recommender.deploy.spec import KV_CACHE_DTYPE, DeploySpec, PoolSpec, comment_lines, node_layout
from recommender.deploy.vllm_flags import check_serve_args

VLLM_VERSION = "0.33.0"
IMAGE_TAG = f"v{VLLM_VERSION}"
#: official images per GPU vendor (the ROCm build is published as vllm/vllm-openai-rocm)
VLLM_IMAGE = {"nvidia": "vllm/vllm-openai", "amd": "vllm/vllm-openai-rocm"}
HTTP_PORT = 8000
NIXL_SIDE_CHANNEL_PORT = 5600
#: vLLM 0.33's default cap on ``--max-cudagraph-capture-size``: 512, 1024 on datacenter Blackwell (vLLM 0.33 serve flags,
#: ``--max-cudagraph-capture-size N`` "default cap 512, 1024 on datacenter Blackwell": shared/reference/vllm/README.md)
MAX_CUDAGRAPH_CAPTURE_SIZE = 512
MAX_CUDAGRAPH_CAPTURE_SIZE_DATACENTER_BLACKWELL = 1024
#: GPU architectures (catalog ``vllm.arch``) that are datacenter Blackwell: the ``blackwell`` row of
#: catalogs/kernel-support.yaml is compute capability 10.0 / 10.3 (B200, GB200; B300, GB300). RTX Blackwell (12.0)
#: and GB10 (12.1) are not datacenter parts and keep the 512 cap (an entry for them needs its own architecture row).
DATACENTER_BLACKWELL_ARCHS = frozenset({"blackwell"})
KV_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}
#: host ports in the cmd form of a disaggregated plan (as in vLLM's NIXL docs) so both fit on one host
#: the host address vLLM's NixlConnector advertises to the other pool (required in a P/D script)
NIXL_HOST_ENV = "VLLM_NIXL_SIDE_CHANNEL_HOST"
CMD_PORTS = {"both": (HTTP_PORT, None), "prefill": (8100, 5600), "decode": (8200, 5601)}


def image_for(pool: PoolSpec) -> str:
    """``vllm/vllm-openai:v0.33.0`` (NVIDIA) or ``vllm/vllm-openai-rocm:v0.33.0`` (AMD)."""
    return f"{VLLM_IMAGE.get(pool.gpu.vendor, VLLM_IMAGE['nvidia'])}:{IMAGE_TAG}"


def nixl_backend(spec: DeploySpec) -> str:
    """NIXL's transport for the plan's KV path: ``LIBFABRIC`` over AWS EFA (EFA speaks libfabric, not UCX),
    else ``UCX`` (InfiniBand/RoCE verbs, host memory on one instance, TCP otherwise). vLLM 0.33's NixlConnector
    reads ``kv_connector_extra_config.backends`` (default ``["UCX"]``, ``LIBFABRIC`` documented)."""
    return "LIBFABRIC" if spec.kv_link is not None and spec.kv_link.kind == "efa" else "UCX"


def kv_transfer_config(role: str, backend: str = "UCX") -> dict[str, Any] | None:
    """NixlConnector config for a disaggregated pool (None for an aggregated one)."""
    if role not in KV_ROLE:
        return None
    return {"kv_connector": "NixlConnector", "kv_role": KV_ROLE[role], "kv_buffer_device": "cuda",
            "kv_connector_extra_config": {"backends": [backend]}}


@dataclass(frozen=True)
class EngineOptions:
    """The vLLM settings of one pool, before they become flags (helm maps some to chart keys)."""

    model: str
    served_model_names: tuple[str, ...]
    tensor_parallel_size: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    gpu_memory_utilization: float
    kv_cache_dtype: str
    quantization: str | None
    dtype: str | None
    max_cudagraph_capture_size: int | None  # None: CUDA graphs off (--enforce-eager)
    kv_transfer_config: dict[str, Any] | None = field(default=None, hash=False, compare=True)
    pipeline_parallel_size: int = 1  # > 1: stages on other nodes of a Ray cluster (--distributed-executor-backend ray)
    nodes: int = 1  # nodes one replica's engine runs on; > 1: a Ray cluster (--distributed-executor-backend ray)
    #: data-parallel ranks on the node that runs ``vllm serve`` when the ranks span nodes (the rest are launched
    #: on the Ray cluster's other nodes: --data-parallel-size-local, --data-parallel-backend ray); None = all local
    data_parallel_size_local: int | None = None
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    speculative_config: dict[str, Any] | None = field(default=None, hash=False, compare=True)


def max_cudagraph_capture_cap(arch: str) -> int:
    """vLLM 0.33's default cap on the CUDA-graph capture size on a GPU of catalog architecture ``arch``: 1024 on
    datacenter Blackwell (:data:`DATACENTER_BLACKWELL_ARCHS`), 512 elsewhere."""
    return (MAX_CUDAGRAPH_CAPTURE_SIZE_DATACENTER_BLACKWELL if arch in DATACENTER_BLACKWELL_ARCHS
            else MAX_CUDAGRAPH_CAPTURE_SIZE)


def cudagraph_capture_size(pool: PoolSpec) -> int:
    """``--max-cudagraph-capture-size`` that captures the pool's largest decode step: vLLM's capture sizes are
    tokens, and a decode step of ``max_num_seqs`` sequences with ``k`` MTP draft tokens carries ``max_num_seqs x
    (1 + k)`` of them (vLLM's own default is ``min(max_num_seqs x (1 + k) x 2, cap)``). Capped at vLLM's cap for the
    pool's GPU (:func:`max_cudagraph_capture_cap`: 1024 on datacenter Blackwell, else 512) and kept a multiple of
    ``1 + k``, the only sizes a uniform spec-decode step takes."""
    q = 1 + max(pool.num_speculative_tokens, 0)
    return min(pool.max_num_seqs * q, max_cudagraph_capture_cap(pool.gpu.kernels.arch) // q * q)


def engine_options(spec: DeploySpec, pool: PoolSpec) -> EngineOptions:
    """Map the pool's modelled configuration to vLLM settings (table in the module docstring)."""
    return EngineOptions(
        model=pool.weights.model,
        served_model_names=spec.served_model_names,
        tensor_parallel_size=pool.tp,
        max_model_len=pool.max_model_len,
        max_num_seqs=pool.max_num_seqs,
        max_num_batched_tokens=pool.max_num_batched_tokens,
        enable_chunked_prefill=pool.chunked_prefill,
        enable_prefix_caching=pool.enable_prefix_caching,
        gpu_memory_utilization=pool.gpu_memory_utilization,
        kv_cache_dtype=KV_CACHE_DTYPE[pool.kv_dtype],
        quantization=pool.weights.quantization,
        dtype=pool.weights.dtype,
        max_cudagraph_capture_size=cudagraph_capture_size(pool) if pool.cuda_graphs else None,
        kv_transfer_config=kv_transfer_config(pool.role, nixl_backend(spec)),
        pipeline_parallel_size=pool.pp,
        nodes=pool.nodes_per_replica,
        data_parallel_size_local=(pool.gpus_per_pod // pool.tp
                                  if pool.nodes_per_stage > 1 and pool.data_parallel_size > 1 else None),
        data_parallel_size=pool.data_parallel_size,
        enable_expert_parallel=pool.enable_expert_parallel,
        speculative_config=({"method": "mtp", "num_speculative_tokens": pool.num_speculative_tokens}
                            if pool.num_speculative_tokens > 0 else None),
    )


def fmt_float(x: float) -> str:
    """Shortest round-trip decimal: 0.92 -> '0.92' (never scientific for fractions in (0, 1])."""
    return repr(float(x))


def extra_flag_groups(o: EngineOptions) -> list[list[str]]:
    """Flags production-stack's chart has no vllmConfig key for (they go to ``extraArgs``)."""
    groups: list[list[str]] = [
        ["--served-model-name", *o.served_model_names],
        ["--max-num-batched-tokens", str(o.max_num_batched_tokens)],
        ["--kv-cache-dtype", o.kv_cache_dtype],
    ]
    if o.quantization:
        groups.append(["--quantization", o.quantization])
    if o.max_cudagraph_capture_size is None:
        groups.append(["--enforce-eager"])
    else:
        groups.append(["--max-cudagraph-capture-size", str(o.max_cudagraph_capture_size)])
    if o.kv_transfer_config is not None:
        groups.append(["--kv-transfer-config", json.dumps(o.kv_transfer_config, separators=(",", ":"))])
    if o.data_parallel_size > 1:
        groups.append(["--data-parallel-size", str(o.data_parallel_size)])
        if o.data_parallel_size_local is not None:  # ranks over the nodes of a Ray cluster (vLLM's DP deployment docs)
            groups += [["--data-parallel-size-local", str(o.data_parallel_size_local)], ["--data-parallel-backend", "ray"]]
    if o.enable_expert_parallel:
        groups.append(["--enable-expert-parallel"])
    if o.speculative_config is not None:
        groups.append(["--speculative-config", json.dumps(o.speculative_config, separators=(",", ":"))])
    return groups


def serve_groups(o: EngineOptions, host: str = "0.0.0.0", port: int = HTTP_PORT) -> list[list[str]]:
    """``vllm serve`` arguments grouped per flag (first group: the model); unchecked."""
    groups: list[list[str]] = [
        [o.model],
        ["--host", host],
        ["--port", str(port)],
        ["--tensor-parallel-size", str(o.tensor_parallel_size)],
        *([["--pipeline-parallel-size", str(o.pipeline_parallel_size)]] if o.pipeline_parallel_size > 1 else []),
        *([["--distributed-executor-backend", "ray"]] if o.nodes > 1 and o.data_parallel_size_local is None else []),
        ["--max-model-len", str(o.max_model_len)],
        ["--max-num-seqs", str(o.max_num_seqs)],
        ["--enable-chunked-prefill" if o.enable_chunked_prefill else "--disable-chunked-prefill"],
        ["--enable-prefix-caching" if o.enable_prefix_caching else "--disable-prefix-caching"],
        ["--gpu-memory-utilization", fmt_float(o.gpu_memory_utilization)],
    ]
    if o.dtype:
        groups.append(["--dtype", o.dtype])
    return groups + extra_flag_groups(o)


def serve_argv(o: EngineOptions, host: str = "0.0.0.0", port: int = HTTP_PORT) -> list[str]:
    """The checked argument list after ``vllm serve`` (raises VllmFlagError on a bad flag)."""
    argv = [a for g in serve_groups(o, host, port) for a in g]
    check_serve_args(argv)
    return argv


def _script(spec: DeploySpec, pool: PoolSpec) -> str:
    o = engine_options(spec, pool)
    port, side_port = CMD_PORTS[pool.role]
    groups = serve_groups(o, "0.0.0.0", port)
    check_serve_args([a for g in groups for a in g])
    lines = ["#!/bin/sh", *comment_lines(spec)]
    n = pool.nodes_per_replica
    hosts = f"{pool.replicas} host(s)" if n == 1 else f"the first node of each of {pool.replicas} replica(s)"
    lines += ["#", f"# This script starts ONE {pool.role if pool.role != 'both' else 'engine'} replica: "
              f"run it on {hosts}, each with {pool.gpus_per_pod} x {pool.gpu.id} GPU(s)."]
    if n > 1:
        lines += [
            f"# A replica spans {node_layout(pool)} joined in a",
            f"# Ray cluster: on the first node `ray start --head --port={RAY_PORT}`, on each of the other {n - 1}",
            f"# `ray start --address=<first node>:{RAY_PORT} --block`; then run this script on the first node.",
        ]
        if pool.nodes_per_stage > 1:
            lines += ["# The nodes must be trays of one NVLink domain (one rack; GPU Feature Discovery's node label",
                      "# nvidia.com/gpu.clique) with the IMEX daemon running, so that NCCL's all-reduce stays on NVLink."]
    if spec.disaggregated:
        lines += [
            "# Put a P/D proxy in front of the pools: it sends each request to a prefill instance with",
            "# max_tokens=1, then to a decode instance with the returned kv_transfer_params, e.g. vLLM's",
            "#   tests/v1/kv_connector/nixl_integration/toy_proxy_server.py --port 8000 \\",
            "#     --prefiller-hosts <prefill hosts> --prefiller-ports 8100 --decoder-hosts <decode hosts> --decoder-ports 8200",
        ]
    lines += ["set -eu"]
    if side_port is not None:
        lines += shell.require_env(NIXL_HOST_ENV, f"set {NIXL_HOST_ENV} to this host's IP address (the NIXL side "
                                                  f"channel the other pool connects to), e.g. "
                                                  f"{NIXL_HOST_ENV}=10.0.0.5 sh {cmd_file_name(pool)}")
        lines += [shell.export(NIXL_HOST_ENV), shell.export("VLLM_NIXL_SIDE_CHANNEL_PORT", str(side_port))]
    lines += [shell.command_lines(groups, prefix="exec vllm serve")]
    return "\n".join(lines) + "\n"


#: The Ray head's port of a multi-node replica (``ray start --head --port``).
RAY_PORT = 6379


def cmd_file_name(pool: PoolSpec) -> str:
    """``vllm-serve.sh`` for an aggregated pool, ``vllm-serve-<role>.sh`` otherwise."""
    return "vllm-serve.sh" if pool.role == "both" else f"vllm-serve-{pool.role}.sh"


def render_cmd(spec: DeploySpec) -> dict[str, str]:
    """One POSIX shell script per pool: file name -> text."""
    return {cmd_file_name(p): _script(spec, p) for p in spec.pools}
