"""Typed plan -> frozen :class:`DeploySpec`: what to deploy, checked for deployability.

The plan arrives typed and validated (:func:`recommender.plan.load_plan`, the one validator of plan documents:
types, dtypes, engine limits vLLM would not start with, sizes). This module picks the plan of the requested
rank, resolves which checkpoint vLLM loads and with which quantization flag, looks the GPU up in the catalog
and refuses (``DeployError``) what depends on the GPU or the model: a GPU or dtype pair vLLM 0.33 has no
kernel for, TP not dividing the heads, a P/D pair NixlConnector cannot join, unsafe names.

Quantization policy (``recommender.dtypes.resolve_weights``, which ``estimate`` names too), with 16-bit = {bf16, fp16}:

1. a checkpoint repo is given (CLI ``--checkpoint`` > pool ``checkpoint`` > row ``checkpoint``):
   vLLM loads it and reads its quantization config, so no ``--quantization``; it must store
   ``weight_dtype`` weights (``--checkpoint none``: no repo, whatever the plan names; the rules below);
2. ``weight_dtype == checkpoint_dtype``: load ``hf_repo`` as is, no ``--quantization``;
3. both 16-bit but different: load ``hf_repo`` with ``--dtype bfloat16|float16`` (cast at load);
4. ``weight_dtype == fp8`` on a 16-bit checkpoint: ``--quantization fp8`` (vLLM's online dynamic FP8);
5. anything else (int8, int4, fp4, or fp8 from a non-16-bit checkpoint) needs a pre-quantized
   checkpoint; without one the plan is refused and the message says to add ``"checkpoint"`` or
   pass ``--checkpoint REPO``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

from recommender.catalog import default_catalog, k8s_nodes
from recommender.deploy.cluster import ClusterOptions
from recommender.deploy.gpus import GpuFacts, GpuLookup, default_gpu_lookup
from recommender.dtypes import (  # noqa: F401  (the policy lives in dtypes; deploy re-exports it)
    PREQUANTIZED_HINT,
    SIXTEEN_BIT,
    VLLM_DTYPE,
    WeightsChoice,
    resolve_weights,
)
from recommender.errors import DeployError, RecommenderError
from recommender.hf_config import not_a_model_repo
from recommender.perf.memory import weight_bytes
from recommender.plan import KvLinkInfo, Plan, PlanRow, Pool, WorkloadEcho, load_plan
from recommender.plan.rebuild import pool_block_split_error

#: bytes per parameter stored in a checkpoint of that dtype (scales / zero points ignored)
BYTES_PER_PARAM = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5, "fp4": 0.5, "mxfp4": 0.5}
KV_CACHE_DTYPE = {"bf16": "auto", "fp16": "auto", "auto": "auto", "fp8": "fp8"}
#: parameter count assumed when neither the plan nor the model name says (conservative: long startup)
FALLBACK_PARAMS = 70e9


@dataclass(frozen=True)
class PoolSpec:
    """One pool of identical replicas (``role`` both | prefill | decode) with its engine limits."""

    role: str
    gpu: GpuFacts
    tp: int
    replicas: int
    weight_dtype: str
    kv_dtype: str
    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool
    enable_prefix_caching: bool
    cuda_graphs: bool
    gpu_memory_utilization: float
    max_model_len: int
    weights: WeightsChoice
    checkpoint_bytes: float  # bytes vLLM downloads and loads for one replica (whole checkpoint)
    rdma_resource: str = ""  # the offer's RDMA NIC device resource in Kubernetes ("" = not known)
    rdma_per_gpu: float = 0.0  # those devices per GPU
    stage_network: str = ""  # the rented offer's NIC kind (infiniband, roce, efa, ethernet; "" = not known)
    pp: int = 1  # pipeline stages per replica, one node (TP group) each: a multi-node replica
    data_parallel_size: int = 1        # attention ranks per replica (MoE): a replica (pod) runs tp x dp GPUs
    enable_expert_parallel: bool = False
    num_speculative_tokens: int = 0    # MTP draft tokens (0: off)
    #: nodes one engine (tp x dp GPUs) spans inside one NVLink domain (GB200 / GB300 NVL72 trays of 4 GPUs, joined
    #: over NVLink by an IMEX channel); 1 = one node; > 1 only with pp 1
    nodes_per_stage: int = 1

    @property
    def gpus_per_replica(self) -> int:
        """GPUs one pipeline stage of a replica (one vLLM engine) runs: ``tp x data_parallel_size``."""
        return self.tp * self.data_parallel_size

    @property
    def nodes_per_replica(self) -> int:
        """Pods (nodes) of one replica: ``pp`` pipeline stages x ``nodes_per_stage``; > 1 is a Ray cluster."""
        return self.pp * self.nodes_per_stage

    @property
    def gpus_per_pod(self) -> int:
        """GPUs each pod of a replica requests: ``tp x dp / nodes_per_stage``."""
        return self.gpus_per_replica // self.nodes_per_stage


@dataclass(frozen=True)
class DeploySpec:
    """Everything the renderers need; built by :func:`build_spec`."""

    plan_id: str
    rank: int
    plan_count: int
    plan_name: str  # the plan file (or "plan JSON")
    workload_name: str
    workload_source: str
    model_id: str
    hf_repo: str
    checkpoint_dtype: str
    served_model_names: tuple[str, ...]
    name: str  # DNS-1123 base name for Kubernetes objects
    disaggregated: bool
    pools: tuple[PoolSpec, ...]
    summary: str  # one line: modelled latency / throughput / cost
    weights_source: str  # how checkpoint_bytes was obtained
    cluster: ClusterOptions = ClusterOptions()  # namespace, images, scheduling, storage class
    # the modelled operating point, for the autoscaler output (deploy/keda.py); None where the plan has none
    arrival_rate_per_s: float | None = None  # the workload's rate (None: an offline job)
    load_utilisation: float | None = None  # rate / saturation rate of the row
    ttft_mean_s: float | None = None
    e2e_mean_s: float | None = None
    kv_link: KvLinkInfo | None = None  # P/D: the path the plan's KV moves over (RDMA: NICs requested, NIXL backend)

    @property
    def gpus_total(self) -> int:
        """GPUs of all pools: sum of tp x dp x pp x replicas."""
        return sum(p.gpus_per_replica * p.pp * p.replicas for p in self.pools)


# --------------------------------------------------------------------------- checks


def _safe_text(s: str, what: str) -> str:
    if not s or any(ord(c) < 32 or ord(c) == 127 for c in s):
        raise DeployError(f"{what} {s!r} is empty or contains control characters; fix the plan or workload")
    return s


#: a name vLLM serves the model under (``--served-model-name``): HF-id characters plus ':'
SERVED_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}")


def model_repo(s: str, what: str) -> str:
    """``s`` if it is a Hugging Face repo id (``org/name``) or an absolute local path, else DeployError.

    Nothing else may reach ``vllm serve``'s model argument: Kubernetes would expand ``$(VAR)`` in it (e.g.
    ``$(HF_TOKEN)`` from the Secret the manifest mounts) and the shell form would see it as text.
    """
    why = not_a_model_repo(s, what)
    if why:
        raise DeployError(f"{why}; fix the plan or workload")
    return s


def k8s_escape(s: str) -> str:
    """Escape ``$`` as ``$$`` so Kubernetes passes ``$(VAR)`` in container ``args`` / ``env`` values through literally."""
    return s.replace("$", "$$")


def dns_label(text: str, max_len: int = 40) -> str:
    """A Kubernetes DNS-1123 label (lowercase alphanumerics and '-', <= max_len) derived from ``text``."""
    s = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    s = re.sub(r"-{2,}", "-", s) or "plan"
    if len(s) > max_len:
        digest = hashlib.sha256(text.encode()).hexdigest()[:6]
        s = s[: max_len - 7].rstrip("-") + "-" + digest
    return s


# --------------------------------------------------------------------------- policy


def _check_gpu(gpu: GpuFacts, weight_dtype: str, kv_dtype: str, where: str) -> None:
    """Refuse what vLLM 0.33 would not start: an unsupported GPU or a dtype pair the kernel-support
    table (catalogs/kernel-support.yaml) does not list for the GPU's architecture."""
    if not gpu.vllm_supported:
        raise DeployError(f"{where}: vLLM 0.33 does not support GPU {gpu.id!r} (catalog vllm.supported is false); pick a plan on another GPU")
    why = gpu.why_unsupported(weight_dtype, kv_dtype)
    if why:
        raise DeployError(f"{where}: {why}; re-run `recommend` for a plan on a supported combination")


def _check_pd_pair(p: PoolSpec, d: PoolSpec, where: str) -> None:
    """What vLLM 0.33's NixlConnector needs of a prefill -> decode pair (see search.space.pd_pair_valid):
    one vendor, the connector on both architectures, and TP sizes that divide each other."""
    if p.gpu.vendor != d.gpu.vendor:
        raise DeployError(f"{where}: prefill on {p.gpu.vendor} and decode on {d.gpu.vendor}; NIXL KV transfer needs one vendor's stack")
    for g in (p.gpu, d.gpu):
        if "nixl_connector" not in g.kernels.features:
            raise DeployError(f"{where}: vLLM 0.33's NixlConnector is not listed for {g.id} ({g.kernels.arch}) in kernel-support.yaml")
    if max(p.tp, d.tp) % min(p.tp, d.tp):
        raise DeployError(f"{where}: NixlConnector needs one TP size to divide the other (prefill TP{p.tp}, decode TP{d.tp})")


def _check_model_tp(p: PoolSpec, where: str, num_heads: int | None = None) -> None:
    """TP must divide the model's attention heads (vLLM refuses to start otherwise); a model outside the catalog
    (heads unknown) needs a power of two. The plan's own limits and sizes are :func:`recommender.plan.load_plan`'s
    to check (every plan this module gets was read by it or built by the search)."""
    if num_heads is not None and num_heads % p.tp:
        raise DeployError(f"{where}: vLLM needs tp ({p.tp}) to divide the model's {num_heads} attention heads; "
                          f"regenerate the plan")
    if num_heads is None and p.tp & (p.tp - 1):
        raise DeployError(f"{where}: tp {p.tp} is not a power of two and the model's head count is unknown; "
                          f"regenerate the plan")


def _check_weight_blocks(raw: Pool, model_id: str, checkpoint: str | None, where: str) -> None:
    """Refuse a pool whose layout splits the blocks of the block-quantized checkpoint it loads (``checkpoint``, else
    the model's own repo at its own dtype; ``Catalog.weight_block_for``): vLLM stops at load ("output_size of gate's
    and up's weight = 192 is not divisible by weight quantization block_n = 128", ``recommender.perf.blocks``), as a
    plan written before the search knew it would (Qwen3-235B-A22B-FP8 at TP 8); the check ``simulate --plan`` makes
    (``recommender.plan.rebuild.pool_block_split_error``). A model or checkpoint outside the catalog is not checked
    (its blocks are unknown)."""
    try:
        cat = default_catalog()
        model = cat.model(model_id) if model_id else None
    except (RecommenderError, KeyError, OSError, ValueError):
        return
    if model is None:
        return
    why = pool_block_split_error(raw, model=model, catalog=cat, checkpoint=checkpoint or "")
    if why:
        raise DeployError(f"{where}: {why}")


# --------------------------------------------------------------------------- weights size


def params_from_name(*names: str) -> float | None:
    """Parameter count read from a model name: 'llama-3.1-70b' -> 7e10, 'Qwen3-0.6B' -> 6e8, '8x7B' -> 5.6e10."""
    best: float | None = None
    for name in names:
        for m in re.finditer(r"(?<![A-Za-z0-9.])(?:(\d+)x)?(\d+(?:\.\d+)?)\s*([bBmM])(?![A-Za-z])", name):
            experts = int(m.group(1)) if m.group(1) else 1
            scale = 1e9 if m.group(3) in "bB" else 1e6
            value = experts * float(m.group(2)) * scale
            best = value if best is None else max(best, value)
    return best


def _catalog_weight_bytes(model_id: str, dtype: str) -> float | None:
    """Exact checkpoint bytes from the model catalog (perf.memory.weight_bytes), None if unknown."""
    try:
        return float(weight_bytes(default_catalog().model(model_id), dtype))
    except (RecommenderError, KeyError, OSError, ValueError):
        return None


def _checkpoint_bytes(row: PlanRow, pool: Pool, workload: WorkloadEcho,
                      weight_dtype: str, stored_dtype: str) -> tuple[float, str]:
    """Bytes of the checkpoint vLLM downloads and loads (stored in ``stored_dtype``), and the source.

    In order: the model catalog (``perf.memory.weight_bytes`` of the workload's model at
    ``stored_dtype``); the plan's ``weights_bytes`` (modelled, at ``weight_dtype``; pool before row)
    rescaled by BYTES_PER_PARAM; the workload's ``params``; the count in the model name;
    else 70e9 parameters. Parameter counts become bytes as params x BYTES_PER_PARAM[stored_dtype].
    """
    model_id = workload.model
    exact = _catalog_weight_bytes(model_id, stored_dtype) if model_id else None
    if exact:
        return exact, f"model catalog {model_id} at {stored_dtype}"
    for wb in (pool.weights_bytes, row.weights_bytes):
        if wb is not None and wb > 0:
            params = float(wb) / BYTES_PER_PARAM[weight_dtype]
            return params * BYTES_PER_PARAM[stored_dtype], "plan weights_bytes"
    if workload.params is not None and workload.params > 0:
        return workload.params * BYTES_PER_PARAM[stored_dtype], "workload params"
    named = params_from_name(model_id, workload.hf_repo or "")
    if named:
        return named * BYTES_PER_PARAM[stored_dtype], f"{named / 1e9:g}B parameters read from the model name"
    return FALLBACK_PARAMS * BYTES_PER_PARAM[stored_dtype], "70B parameters assumed (model size unknown)"


# --------------------------------------------------------------------------- build


def _summary(row: PlanRow) -> str:
    parts = []
    for value, label in ((row.ttft_s, "TTFT"), (row.tpot_s, "TPOT"), (row.e2e_s, "E2E")):
        if value is not None and math.isfinite(value):
            parts.append(f"{row.percentile} {label} {value * 1e3:.1f} ms")
    if row.output_tokens_per_s is not None:
        parts.append(f"{row.output_tokens_per_s:,.0f} output tok/s")
    if row.usd_per_hour is not None:
        parts.append(f"${row.usd_per_hour:,.2f}/h")
    if row.usd_per_million_output_tokens is not None:
        parts.append(f"${row.usd_per_million_output_tokens:,.3f}/M output tokens")
    return ", ".join(parts) or "no modelled figures in the plan"


def _num_heads(model_id: str) -> int | None:
    """Attention heads of the workload's catalog model (None when it is not in the catalog)."""
    try:
        return default_catalog().model(model_id).num_heads if model_id else None
    except (RecommenderError, KeyError, OSError, ValueError):
        return None


def _context_tokens(model_id: str) -> int | None:
    """The workload's catalog model's context (``max_position_embeddings``; None outside the catalog)."""
    try:
        return default_catalog().model(model_id).max_position_embeddings if model_id else None
    except (RecommenderError, KeyError, OSError, ValueError):
        return None


def _with_catalog_defaults(workload: WorkloadEcho) -> tuple[str, str]:
    """(hf_repo, checkpoint_dtype); one the plan leaves out (None) comes from the model catalog entry of
    ``model``. An empty string stays empty (and is refused by the caller)."""
    hf_repo, dtype = workload.hf_repo, workload.checkpoint_dtype
    if hf_repo is not None and dtype is not None:
        return hf_repo, dtype
    try:
        arch = default_catalog().model(workload.model)
    except (RecommenderError, KeyError, OSError, ValueError):
        return hf_repo or "", dtype or ""
    return (arch.hf_repo or "") if hf_repo is None else hf_repo, arch.checkpoint_dtype if dtype is None else dtype


def _pool_spec(raw: Pool, row: PlanRow, workload: WorkloadEcho, *, hf_repo: str, ckpt_dtype: str,
               checkpoint: str | None, lookup: GpuLookup, where: str) -> tuple[PoolSpec, str]:
    pw = f"{where} pool {raw.role.value}"
    gpu = lookup(raw.gpu)
    _check_gpu(gpu, raw.weight_dtype, raw.kv_dtype, where=pw)
    # checkpoint "" (--checkpoint none): the model's own repo, whatever the pool and the row name
    ckpt = (checkpoint if checkpoint is not None else raw.checkpoint or row.checkpoint) or None
    if ckpt is not None:
        ckpt = model_repo(_safe_text(ckpt, "checkpoint"), "checkpoint")
    weights = resolve_weights(raw.weight_dtype, ckpt_dtype, hf_repo, ckpt)
    if weights.model.startswith("-"):
        raise DeployError(f"{pw}: model {weights.model!r} starts with '-', which vllm serve would read as a flag")
    stored = raw.weight_dtype if ckpt else ckpt_dtype if ckpt_dtype in BYTES_PER_PARAM else raw.weight_dtype
    nbytes, weights_source = _checkpoint_bytes(row, raw, workload, raw.weight_dtype, stored)
    pool = PoolSpec(
        role=raw.role.value, gpu=gpu, tp=raw.tp, replicas=raw.replicas, weight_dtype=raw.weight_dtype,
        kv_dtype=raw.kv_dtype, max_num_seqs=raw.max_num_seqs, max_num_batched_tokens=raw.max_num_batched_tokens,
        chunked_prefill=raw.chunked_prefill, enable_prefix_caching=raw.enable_prefix_caching,
        cuda_graphs=raw.cuda_graphs, gpu_memory_utilization=raw.gpu_memory_utilization,
        max_model_len=workload.max_model_len if workload.max_model_len is not None else row.max_model_len,
        weights=weights, checkpoint_bytes=nbytes,
        rdma_resource=raw.rental.rdma_resource if raw.rental else "",
        rdma_per_gpu=raw.rental.rdma_per_gpu if raw.rental else 0.0, pp=raw.pp,
        stage_network=_network_kind(raw.rental.network if raw.rental else ""),
        data_parallel_size=raw.data_parallel_size,
        enable_expert_parallel=raw.enable_expert_parallel, num_speculative_tokens=raw.num_speculative_tokens,
    )
    _check_model_tp(pool, pw, _num_heads(workload.model))
    _check_weight_blocks(raw, workload.model, ckpt, pw)
    pool = dataclasses.replace(pool, nodes_per_stage=_nodes_per_stage(raw, gpu, pw))
    context = _context_tokens(workload.model)
    if context is not None and pool.max_model_len > context:
        raise DeployError(f"{pw}: max_model_len {pool.max_model_len:,} is above {workload.model}'s context of "
                          f"{context:,} tokens (vLLM refuses to start); re-plan with prompts + outputs within it")
    return pool, weights_source


def _nodes_per_stage(raw: Pool, gpu: GpuFacts, where: str) -> int:
    """Nodes one engine (``tp x data_parallel_size`` GPUs) of the pool spans: 1, or on a GPU whose Kubernetes node holds
    fewer GPUs than its NVLink domain (a GB200 / GB300 NVL72 compute tray of 4, ``k8s.gpus_per_node``), the trays a
    wider engine takes in one rack: the search prices a TP 8 engine there as two trays, and the renderers run it as
    a LeaderWorkerSet group over an IMEX ComputeDomain (data-parallel ranks whole on a node each, as vLLM's Ray
    data-parallel backend places them). Elsewhere an engine wider than one rented instance is refused in one line:
    every other output runs it in one pod, which would not schedule on a node."""
    gpus = raw.tp * raw.data_parallel_size
    nodes = k8s_nodes(gpus, gpu.node_gpus)
    if nodes > 1:
        if raw.data_parallel_size > 1 and (raw.tp > gpu.node_gpus or gpu.node_gpus % raw.tp):
            raise DeployError(f"{where}: a data-parallel rank of TP {raw.tp} does not fit whole on the {gpu.node_gpus}-GPU "
                              f"nodes of {raw.gpu} (vLLM places each rank on one node of its Ray cluster); deploy "
                              "another --rank")
        if raw.pp == 1 and gpus <= gpu.nvlink_domain_gpus and gpus % gpu.node_gpus == 0:
            return nodes
        raise DeployError(f"{where}: one engine of {gpus} GPUs (TP {raw.tp} x DP {raw.data_parallel_size}"
                          f"{f' x PP {raw.pp}' if raw.pp > 1 else ''}) on {raw.gpu} is not a whole number of "
                          f"{gpu.node_gpus}-GPU nodes of one {gpu.nvlink_domain_gpus}-GPU NVLink domain in one pipeline "
                          "stage; deploy another --rank")
    r = raw.rental
    if r is None or r.offer.per_gpu_billing or r.gpus_per_instance <= 0 or gpus <= r.gpus_per_instance:
        return 1
    raise DeployError(f"{where}: one engine of {gpus} GPUs (TP {raw.tp} x DP {raw.data_parallel_size}) spans "
                      f"{-(-gpus // r.gpus_per_instance)} {r.gpus_per_instance}-GPU {raw.gpu} instances, and the rendered "
                      "pod would not schedule on one node (engines across nodes outside one NVLink domain are not "
                      f"rendered); deploy another --rank, or re-plan with tensor_parallel up to {r.gpus_per_instance} in "
                      "the search policy")


#: the outputs that run a replica across nodes (a Ray leader and workers): named in the refusal of the others
MULTINODE_FORMATS = "--format k8s or disaggregatedset (a LeaderWorkerSet of a Ray leader and workers) or cmd"


def node_layout(pool: PoolSpec) -> str:
    """How one replica of ``pool`` spans nodes, in words (for messages and file headers)."""
    if pool.pp > 1:
        return f"{pool.pp} nodes (pipeline parallel, TP {pool.tp} per node)"
    return (f"{pool.nodes_per_stage} {pool.gpus_per_pod}-GPU {pool.gpu.id} nodes of one NVLink domain "
            f"(TP {pool.tp}{f' x DP {pool.data_parallel_size}' if pool.data_parallel_size > 1 else ''})")


def refuse_multinode(spec: DeploySpec, target: str) -> None:
    """Refuse, in one line, a plan with a replica over several nodes (pipeline stages, or one engine over the trays
    of a GB200 / GB300 rack) in an output that runs one pod per replica (Helm, KServe, llm-d, Dynamo): its pod would
    ask for one node's GPUs while ``vllm serve`` waits for the others, and never start."""
    multi = [p for p in spec.pools if p.nodes_per_replica > 1]
    if multi:
        p = multi[0]
        which = "a replica" if p.role == "both" else f"a {p.role} replica"
        raise DeployError(f"{target}: {which} of plan {spec.plan_id} spans {node_layout(p)} and {target} runs one "
                          f"pod per replica here; use {MULTINODE_FORMATS}")


def _network_kind(label: str) -> str:
    """The NIC kind of a rental's network label ('infiniband 400 Gb/s per GPU' -> 'infiniband'); "" when the label
    names none of the kinds the catalog knows."""
    from recommender.offers import NETWORK_KINDS

    kind = label.split(" ", 1)[0].lower() if label else ""
    return kind if kind in NETWORK_KINDS else ""


def build_spec(plan: Plan | Mapping[str, Any], rank: int = 1, checkpoint: str | None = None, *,
               plan_name: str | None = None, gpus: GpuLookup | None = None) -> DeploySpec:
    """Pick row ``rank`` of ``plan`` and turn it into a checked :class:`DeploySpec` (a plan document is read
    with :func:`recommender.plan.load_plan`, the one reader). ``checkpoint`` (``--checkpoint``) replaces the plan's
    pools' checkpoint repo; ``none`` (any case): none, the model's own repo (quantized or cast at load where the
    pool's weight dtype is not its own), as ``estimate --checkpoint none`` reads it. An empty one is refused (an unset
    variable in a deploy script, more likely than a choice)."""
    from recommender.estimator import CHECKPOINT_NONE

    if not isinstance(plan, Plan):
        plan = load_plan(plan)
    if checkpoint is not None and checkpoint.lower() == CHECKPOINT_NONE:
        checkpoint = ""  # _pool_spec: no repo, whatever the plan names
    elif checkpoint is not None:
        model_repo(_safe_text(checkpoint, "--checkpoint"), "--checkpoint")
    if not plan.rows:
        raise DeployError("the plan holds no plans (the search found nothing feasible); nothing to deploy")
    row = plan.row(rank)
    if row is None:
        raise DeployError(f"no plan with rank {rank}; the plan has ranks {sorted(r.rank for r in plan.rows)}")
    plan_id = _safe_text(row.id or f"rank{rank}", "plan id")
    where = f"plan {plan_id}"
    workload = plan.workload
    hf_repo, ckpt_dtype = _with_catalog_defaults(workload)
    if (not hf_repo and workload.hf_repo is None) or not ckpt_dtype:
        missing = "hf_repo" if not hf_repo and workload.hf_repo is None else "checkpoint_dtype"
        raise DeployError(f"workload: missing field {missing!r} and model {workload.model!r} is not in the catalog; "
                          f"regenerate the plan with `recommend --format json`")
    hf_repo = _safe_text(hf_repo, "workload hf_repo")
    if hf_repo.startswith("-"):
        raise DeployError(f"workload hf_repo {hf_repo!r} starts with '-', which vllm serve would read as a flag")
    model_repo(hf_repo, "workload hf_repo")
    model_id = _safe_text(workload.model or hf_repo, "workload model")
    lookup = gpus or default_gpu_lookup()
    pools: list[PoolSpec] = []
    weights_source = ""
    for raw in row.pools:
        pool, weights_source = _pool_spec(raw, row, workload, hf_repo=hf_repo, ckpt_dtype=ckpt_dtype,
                                          checkpoint=checkpoint, lookup=lookup, where=where)
        pools.append(pool)
    if row.disaggregated:
        _check_pd_pair(pools[0], pools[1], where)
    # the catalog id is served as a second name only when it is a plain name (a config.json path is not)
    served = tuple(dict.fromkeys([hf_repo] + ([model_id] if SERVED_NAME.fullmatch(model_id) else [])))
    workload_name = _safe_text(workload.name or model_id, "workload name")
    return DeploySpec(
        plan_id=plan_id, rank=rank, plan_count=len(plan.rows),
        plan_name=_safe_text(plan_name, "plan name") if plan_name else "plan JSON",
        workload_name=workload_name,
        workload_source=workload.source or "unknown",
        model_id=model_id, hf_repo=hf_repo, checkpoint_dtype=ckpt_dtype,
        served_model_names=served,
        name=dns_label(f"vllm-{workload_name}"),
        disaggregated=row.disaggregated, pools=tuple(pools),
        summary=_summary(row), weights_source=weights_source, kv_link=row.kv_link if row.disaggregated else None,
        arrival_rate_per_s=_finite_or_none(workload.arrival_rate_per_s),
        load_utilisation=_finite_or_none(row.load_utilisation),
        ttft_mean_s=_finite_or_none((row.latency_percentiles.get("ttft") or {}).get("mean")),
        e2e_mean_s=_finite_or_none((row.latency_percentiles.get("e2e") or {}).get("mean")),
    )


def _finite_or_none(x: float | None) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


# --------------------------------------------------------------------------- header


def _printable(s: str) -> str:
    """Escape anything that could end a comment line (newlines, control characters)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in s)


def _gpus(n: int) -> str:
    """'1 GPU', '8 GPUs'."""
    return f"{n} GPU" + ("" if n == 1 else "s")


def header_lines(spec: DeploySpec) -> list[str]:
    """The header every emitted file starts with (plain text lines, no comment markers)."""
    lines = [
        "Generated by recommender (`recommend deploy`) for vLLM 0.33.0; regenerate instead of editing.",
        f"Plan: {spec.plan_id} (rank {spec.rank} of {spec.plan_count}) from {spec.plan_name}",
        f"Workload: {spec.workload_name} ({spec.workload_source}); model {spec.model_id} = {spec.hf_repo} "
        f"({spec.checkpoint_dtype} checkpoint)",
    ]
    for p in spec.pools:
        on = {True: "on", False: "off"}
        lines.append(
            f"Pool {p.role}: {p.replicas} x {p.gpu.id} TP{p.tp}{f' x DP{p.data_parallel_size}' if p.data_parallel_size > 1 else ''}"
            f"{f' x PP{p.pp}' if p.pp > 1 else ''}{f', a replica over {node_layout(p)}' if p.nodes_per_replica > 1 else ''} "
            f"({_gpus(p.replicas * p.gpus_per_replica * p.pp)}); "
            f"{'expert parallel; ' if p.enable_expert_parallel else ''}"
            f"{f'MTP {p.num_speculative_tokens} draft tokens; ' if p.num_speculative_tokens > 0 else ''}"
            f"weights {p.weight_dtype}, "
            f"KV cache {p.kv_dtype}; max_num_seqs {p.max_num_seqs}, max_num_batched_tokens {p.max_num_batched_tokens}, "
            f"chunked prefill {on[p.chunked_prefill]}, prefix caching {on[p.enable_prefix_caching]}, "
            f"CUDA graphs {on[p.cuda_graphs]}, gpu_memory_utilization {p.gpu_memory_utilization:g}, "
            f"max_model_len {p.max_model_len}"
        )
        lines.append(f"Weights ({p.role}): {p.weights.note}")
    lines.append(f"Modelled: {spec.summary}")
    size = max(p.checkpoint_bytes for p in spec.pools)
    lines.append(f"Checkpoint size for probes and cache: {size / 1e9:.1f} GB ({spec.weights_source})")
    return [_printable(line) for line in lines]


def comment_lines(spec: DeploySpec) -> list[str]:
    """:func:`header_lines` as ``# `` comment lines (valid in shell and YAML)."""
    return ["# " + line for line in header_lines(spec)]
