"""The plan file edge: :func:`load_plan` / :func:`dump_plan` (pydantic lives here and nowhere else in ``plan``).

File format (JSON; ``recommend --format json`` writes it, docs/ARCHITECTURE.md shows one): an object with
``version``, ``workload``, ``slo``, ``engine``, ``profile``, ``why``, ``search`` and ``plans`` (the
rows). Version 2 (written now) keeps every engine setting per pool; each row also repeats its main
pool's ``gpu``/``tp``/``replicas``/dtypes/limits and ``gpus_total`` for scripts (``jq .plans[0].gpu``);
those summary keys are derived, so the reader ignores them. Version 1 files (row-level settings that
pools may override, ``utilisation`` for the load utilisation) are still read. Anything else is refused
with one line naming the file. Files are read through ``recommender.bounded`` (size limit, regular files only,
finite numbers). :func:`load_plan` is the one validator of plan documents: besides the types it refuses
unknown dtypes, engine limits vLLM 0.33 would not start with and absurd sizes, so ``deploy``, ``simulate --plan``
and ``replan --current`` read only plans that can run.
"""

from __future__ import annotations

import functools
import json
import math
import re
from pathlib import Path
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from recommender.bounded import load_json_text, read_file_text
from recommender.errors import ConfigError
from recommender.dtypes import KV_DTYPES, WEIGHT_DTYPES
from recommender.offers import MAX_NIC_GBPS, NETWORK_KINDS, Network
from recommender.plan.cost import job_of
from recommender.plan.types import Plan, PlanRow, Pool, WorkloadEcho
from recommender.yamlfile import validation_message

PLAN_VERSION = 2
READABLE_VERSIONS = (1, 2)
#: row keys written for scripts, derived from the pools (ignored when reading)
SUMMARY_KEYS = ("gpu", "gpus_total", "tp", "replicas", "weight_dtype", "kv_dtype", "max_num_seqs",
                "max_num_batched_tokens", "chunked_prefill", "enable_prefix_caching", "cuda_graphs",
                "gpu_memory_utilization", "disaggregated", "providers", "instances", "job")
#: version-1 pool keys of the rented offer (flat), nested under ``rental`` in version 2
_V1_RENTAL = ("provider", "instances", "gpus_per_instance", "usd_per_instance_hour", "usd_per_hour", "offer")
_HINT = "regenerate it with `recommend --workload FILE --format json`"


class _Document(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    plan: Plan


@functools.cache
def _plan_adapter() -> TypeAdapter[Plan]:
    """Built once: building a TypeAdapter for :class:`Plan` takes ~7 ms, dumping a plan with it ~0.01 ms."""
    return TypeAdapter(Plan)


def _clean(x: Any) -> Any:
    """JSON-safe: inf/nan -> None."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def _row_summary(row: PlanRow, workload: WorkloadEcho) -> dict[str, Any]:
    m, first = row.main_pool, row.pools[0]
    out = {"gpu": m.gpu, "gpus_total": row.gpus_total, "tp": m.tp, "replicas": m.replicas,
           "weight_dtype": m.weight_dtype, "kv_dtype": m.kv_dtype, "max_num_seqs": m.max_num_seqs,
           "max_num_batched_tokens": first.max_num_batched_tokens, "chunked_prefill": first.chunked_prefill,
           "enable_prefix_caching": any(p.enable_prefix_caching for p in row.pools),
           "cuda_graphs": all(p.cuda_graphs for p in row.pools), "gpu_memory_utilization": m.gpu_memory_utilization,
           "disaggregated": row.disaggregated, "providers": list(row.providers), "instances": row.instances}
    job = job_of(row, workload)
    if job is not None:  # an offline job: when it ends and what it costs (recommender.plan.cost.job_of)
        out["job"] = {"finish_s": job.finish_s, "margin_s": job.margin_s, "usd": job.usd}
    return out


def plan_document(plan: Plan) -> dict[str, Any]:
    """The plan as a JSON-ready dict (version 2); what JSON, YAML and CSV render from."""
    raw: dict[str, Any] = _plan_adapter().dump_python(plan, mode="json", exclude={"evaluations"})
    rows = []
    for d in raw["rows"]:  # the MoE layout fields appear only where they differ from plain TP
        for pool in d.get("pools", []):
            for k, v in LAYOUT_DEFAULTS.items():
                if pool.get(k) == v:
                    pool.pop(k)
    if not raw["workload"].get("prices"):  # the user's own prices appear only where given
        raw["workload"].pop("prices", None)
    for row, d in zip(plan.rows, raw["rows"]):
        head = {"rank": d.pop("rank"), "id": d.pop("id")}
        rows.append({**head, **_row_summary(row, plan.workload), **d})
    known = {"version": PLAN_VERSION, "workload": raw["workload"], "slo": raw["slos"], "engine": raw["engine"],
             "profile": raw["profile"], "why": raw["why"], "search": raw["search"], "plans": rows}
    # plan-level fields added later (e.g. the re-planner's stamp) follow, when set
    extra = {k: v for k, v in raw.items() if k not in ("workload", "slos", "engine", "profile", "why", "search", "rows")
             and v is not None}
    doc: dict[str, Any] = _clean({**known, **extra})
    return doc


#: pool fields written only when set (a plain-TP plan file is what it was before MoE layouts existed)
LAYOUT_DEFAULTS: dict[str, Any] = {"data_parallel_size": 1, "enable_expert_parallel": False, "num_speculative_tokens": 0,
                                   "stage_nic_bytes_per_s_per_gpu": None}


def dump_plan(plan: Plan) -> str:
    """The plan file text (JSON, version 2, newline-terminated). Raises :class:`ConfigError` for anything but a
    :class:`Plan` (a dict, e.g. a plan file's parsed JSON, is not one: ``load_plan`` reads a file into a Plan)."""
    if not isinstance(plan, Plan):
        raise ConfigError(f"dump_plan(plan): takes a Plan (from recommend() or load_plan('plan.json')), not "
                          f"{type(plan).__name__}")
    return json.dumps(plan_document(plan), indent=2) + "\n"


# --------------------------------------------------------------------------- reading


def _parse(text: str, where: str) -> Any:
    try:
        return load_json_text(text, where)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where} is not valid JSON (line {e.lineno}: {e.msg}); {_HINT}") from None
    except ValueError as e:
        raise ConfigError(f"{e}; {_HINT}") from None


def _v1_pool(pool: Mapping[str, Any], row: Mapping[str, Any], workload: Mapping[str, Any]) -> dict[str, Any]:
    """A version-1 pool: settings the pool leaves out come from its row; the rented offer's flat keys nest."""
    out = {k: v for k, v in pool.items() if v is not None and k not in _V1_RENTAL}
    if pool.get("provider") is not None:
        out["rental"] = {k: pool[k] for k in _V1_RENTAL if pool.get(k) is not None}
    for key in ("gpu", "tp", "replicas", "weight_dtype", "kv_dtype", "max_num_seqs", "max_num_batched_tokens",
                "chunked_prefill", "cuda_graphs", "gpu_memory_utilization"):
        if key not in out and row.get(key) is not None:
            out[key] = row[key]
    if "enable_prefix_caching" not in out:
        out["enable_prefix_caching"] = row.get("enable_prefix_caching",
                                               float(workload.get("shared_prefix_fraction") or 0.0) > 0.0)
    return out


_ROLE_ORDER = {"prefill": 0, "both": 1, "decode": 2}


def _in_order(pools: list[Any]) -> list[Any]:
    """Prefill pool first, decode pool last (what :attr:`PlanRow.main_pool` relies on)."""
    return sorted(pools, key=lambda p: _ROLE_ORDER.get(str(p.get("role")), 1) if isinstance(p, dict) else 1)


def _v1_row(row: Any, workload: Mapping[str, Any]) -> Any:
    if not isinstance(row, dict):
        return row
    d = {k: v for k, v in row.items() if k not in SUMMARY_KEYS and v is not None}
    if "utilisation" in d:
        d["load_utilisation"] = d.pop("utilisation")
    raw_pools = row.get("pools") or [{"role": "both"}]
    d["pools"] = _in_order([_v1_pool(p, row, workload) if isinstance(p, dict) else p for p in raw_pools])
    if "max_model_len" not in d and workload.get("max_model_len") is not None:
        d["max_model_len"] = workload["max_model_len"]
    return d


def _v2_row(row: Any) -> Any:
    if not isinstance(row, dict):
        return row
    d = {k: v for k, v in row.items() if k not in SUMMARY_KEYS}
    if isinstance(d.get("pools"), list):
        d["pools"] = _in_order(d["pools"])
    return d


def _check_summary(rows: list[Any], where: str) -> None:
    """A row's gpu/tp/replicas describe its main (decode or only) pool; a file where they disagree was edited
    by hand or is corrupt, and guessing which one is meant could deploy the wrong size."""
    for row in rows:
        if not isinstance(row, dict) or not isinstance(row.get("pools"), list):
            continue
        main = next((p for p in reversed(row["pools"]) if isinstance(p, dict) and p.get("role") in ("both", "decode")), None)
        for key in ("gpu", "tp", "replicas"):
            if main is not None and key in row and key in main and row[key] != main[key]:
                raise ConfigError(f"{where}: plan {row.get('id')!r} says {key} {row[key]!r} but its {main['role']} pool "
                                  f"says {main[key]!r}; the plan file is inconsistent, {_HINT}")


def _fields(doc: Mapping[str, Any], version: int) -> dict[str, Any]:
    """File keys -> :class:`Plan` field names (and version-1 rows -> version-2 rows)."""
    workload = doc.get("workload")
    wl = workload if isinstance(workload, dict) else {}
    rows = doc.get("plans")
    if isinstance(rows, list):
        rows = [_v1_row(r, wl) if version == 1 else _v2_row(r) for r in rows]
    out = {k: v for k, v in doc.items() if k not in ("version", "slo", "plans")}
    out["rows"] = rows
    if "slo" in doc:
        out["slos"] = doc["slo"]
    if version == 1:
        out = {k: v for k, v in out.items() if v is not None}
        if isinstance(workload, dict):
            out["workload"] = {k: v for k, v in workload.items() if v is not None}
        if isinstance(out.get("search"), dict):
            out["search"] = {k: v for k, v in out["search"].items() if v is not None}
    return out


def load_plan(source: str | Path | Mapping[str, Any]) -> Plan:
    """Read a plan: a file path, JSON text (a string starting with ``{``) or an already parsed document.

    Raises :class:`ConfigError` (one line: which file, what is wrong, what to do) for unreadable,
    non-JSON, foreign (not a plan), future-version or invalid input.
    """
    if isinstance(source, Mapping):
        where, doc = "plan JSON", source
    elif isinstance(source, str) and source.lstrip().startswith("{"):
        where, doc = "plan JSON", _parse(source, "plan JSON")
    else:
        path = Path(source)
        where = f"plan file {path}"
        doc = _parse(read_file_text(path, "plan file", encoding="utf-8"), where)
    if not isinstance(doc, Mapping) or "plans" not in doc or "workload" not in doc:
        raise ConfigError(f"{where} is not a plan (expected a JSON object with 'workload' and 'plans'); {_HINT}")
    version = doc.get("version", 1)
    if version not in READABLE_VERSIONS or isinstance(version, bool):
        raise ConfigError(f"{where} has plan version {version!r}; this recommender reads versions "
                          f"{', '.join(map(str, READABLE_VERSIONS))}: upgrade recommender or {_HINT}")
    if isinstance(doc.get("plans"), list):
        _check_summary(doc["plans"], where)
    try:
        plan = _Document.model_validate_json(json.dumps({"plan": _fields(doc, int(version))})).plan
    except ValidationError as e:
        raise ConfigError(validation_message(e, where).replace("field 'plan.", "field '").replace(
            "field 'rows.", "field 'plans.") + f"; {_HINT}") from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where} cannot be read as a plan ({e}); {_HINT}") from None
    _check(plan, where)
    return plan


#: sizes no deployment has (a plan with more is corrupt or hostile): replicas per pool, GPUs per replica,
#: sequences per engine, tokens per step / sequence
MAX_REPLICAS = 100_000
MAX_TP = 1024
#: a Kubernetes extended resource name (a DNS subdomain prefix, '/', a name): what a pod requests RDMA NICs by
K8S_EXTENDED_RESOURCE = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
MAX_PP = 256  # pipeline stages: at most one per layer (the catalog's deepest model has 126)
MAX_NIC_BYTES_PER_S = 1e13  # 80 Tb/s per GPU, above any NIC or NVLink
MAX_ENGINE_SEQS = 1_000_000
MAX_ENGINE_TOKENS = 100_000_000
#: prices: a GPU-hour above $1,000 or a deployment above $10M/h is a corrupt plan; the engine's memory share
#: below 5% of a GPU cannot hold any model's weights
MAX_USD_PER_GPU_HOUR = 1000.0
MAX_USD_PER_HOUR = 1e7
MIN_GPU_MEMORY_UTILIZATION = 0.05
#: an offline job's deadline beyond ten years, or a model above 10^15 parameters, is a corrupt plan
MAX_DEADLINE_S = 10 * 365 * 86400.0
MAX_PARAMS = 1e15


def _check(plan: Plan, where: str) -> None:
    """What types cannot say: pool roles match the layout, ranks are unique, and every pool is an engine vLLM 0.33
    would start (:func:`_check_pool`). Every reader of plan files (deploy, simulate, replan) relies on this."""
    for row in plan.rows:
        roles = sorted(p.role.value for p in row.pools)
        if roles not in (["both"], ["decode", "prefill"]):
            raise ConfigError(f"{where}: plan {row.id!r} has pools {roles}; a plan has one 'both' pool or "
                              f"a 'prefill' and a 'decode' pool")
        for pool in row.pools:
            max_model_len = plan.workload.max_model_len if plan.workload.max_model_len is not None else row.max_model_len
            _check_pool(pool, max_model_len, f"{where}: plan {row.id!r} pool {pool.role.value}")
    ranks = [r.rank for r in plan.rows]
    if len(set(ranks)) != len(ranks):
        raise ConfigError(f"{where}: duplicate plan ranks {sorted(ranks)}")
    for key in ("name", "model"):  # they reach the terminal and the history key (source and hf_repo: deploy escapes)
        text = getattr(plan.workload, key, None)
        if isinstance(text, str) and (not text.isprintable() or len(text) > 4096):
            raise ConfigError(f"{where}: workload.{key} must be one printable line (no control or invisible "
                              f"characters) of at most 4096 characters; {_HINT}")
    for owned in plan.workload.inventory:  # the re-planner rents them: their NIC reaches its plans' pods
        _check_network(owned.network, f"{where}: workload.inventory {owned.gpu}")
    for gp in plan.workload.prices:  # they price the re-planner's searches
        if not (isinstance(gp.gpu, str) and gp.gpu.isprintable() and 0 < len(gp.gpu) <= 200):
            raise ConfigError(f"{where}: workload.prices names a GPU that is not one printable name; {_HINT}")
        _nonneg(gp.usd_per_gpu_hour, f"workload.prices {gp.gpu}", where, MAX_USD_PER_GPU_HOUR)
        if gp.usd_per_gpu_hour <= 0:
            raise ConfigError(f"{where}: workload.prices {gp.gpu} must be above $0 per GPU-hour; {_HINT}")
    _check_workload_figures(plan.workload, where)
    cd = plan.workload.checkpoint_dtype
    if cd is not None and cd not in WEIGHT_DTYPES:
        raise ConfigError(f"{where}: workload.checkpoint_dtype {cd!r} is not one of {', '.join(WEIGHT_DTYPES)}; {_HINT}")
    for row in plan.rows:
        _check_row(row, f"{where}: plan {row.id!r}")


def _positive(value: float | None, name: str, where: str, limit: float) -> None:
    if value is not None and not (math.isfinite(value) and 0 < value <= limit):
        raise ConfigError(f"{where}: {name} must be above 0 and at most {limit:g}, got {value:g}; {_HINT}")


def _check_workload_figures(w: WorkloadEcho, where: str) -> None:
    """The workload's numbers within the bounds a workload file takes (``recommender.workload``): they reach
    ``vllm bench serve``'s ``--request-rate``, KEDA thresholds and the re-planner's searches (a rate of -4 req/s
    was written into bench.sh and keda.yaml)."""
    from recommender.workload import MAX_DIST_POINTS, MAX_OFFLINE_REQUESTS, MAX_RATE_PER_S, MAX_TOKENS

    _positive(w.arrival_rate_per_s, "workload.arrival_rate_per_s", where, MAX_RATE_PER_S)
    _positive(w.offline_requests, "workload.offline_requests", where, MAX_OFFLINE_REQUESTS)
    _positive(w.deadline_s, "workload.deadline_s", where, MAX_DEADLINE_S)
    _positive(w.params, "workload.params", where, MAX_PARAMS)
    if not (math.isfinite(w.shared_prefix_fraction) and 0 <= w.shared_prefix_fraction < 1):
        raise ConfigError(f"{where}: workload.shared_prefix_fraction must be in [0, 1), got {w.shared_prefix_fraction:g}; "
                          f"{_HINT}")
    for name, summary in (("prompt_tokens", w.prompt_tokens), ("output_tokens", w.output_tokens)):
        if summary is None:
            continue
        for key in ("mean", "p50", "p90", "p99", "min", "max", "mean_param", "std_param"):
            _nonneg(getattr(summary, key), f"workload.{name}.{key}", where, MAX_TOKENS)
        if len(summary.samples) > MAX_DIST_POINTS or len(summary.weights) > MAX_DIST_POINTS:
            raise ConfigError(f"{where}: workload.{name} holds more than {MAX_DIST_POINTS:,} samples; {_HINT}")
        for n in summary.samples:
            _positive(n, f"workload.{name}.samples", where, MAX_TOKENS)
        for wt in summary.weights:
            _nonneg(wt, f"workload.{name}.weights", where, 1e300)


def _check_network(net: Network, where: str) -> None:
    """An owned node's NIC as a plan file states it: a known kind, Gb/s bounded, and a device resource (which
    becomes a key of a pod's resource limits) that is a Kubernetes extended resource name."""
    if net.kind not in NETWORK_KINDS:
        raise ConfigError(f"{where}: network.kind {net.kind[:40]!r} is not one of {', '.join(sorted(NETWORK_KINDS))}; {_HINT}")
    _nonneg(net.gbps_per_gpu, "network.gbps_per_gpu", where, MAX_NIC_GBPS)
    _nonneg(net.gbps_per_instance, "network.gbps_per_instance", where, MAX_NIC_GBPS)
    _nonneg(net.k8s_per_gpu, "network.k8s_per_gpu", where, 64)
    if net.k8s_resource and not K8S_EXTENDED_RESOURCE.fullmatch(net.k8s_resource):
        raise ConfigError(f"{where}: network.k8s_resource {net.k8s_resource[:80]!r} is not a Kubernetes extended "
                          f"resource name; {_HINT}")


def _nonneg(value: float | None, name: str, where: str, limit: float) -> None:
    if value is not None and not (math.isfinite(value) and 0 <= value <= limit):
        raise ConfigError(f"{where}: {name} must be between 0 and {limit:g}, got {value:g}; {_HINT}")


def _check_row(row: PlanRow, where: str) -> None:
    """Cross-field checks: TP within the GPU's interconnect domain (catalog GPUs), prices and figures
    non-negative, the row's USD/h the sum of its pools' (when all are priced)."""
    from recommender.catalog import default_catalog
    from recommender.errors import CatalogError

    cat = default_catalog()
    for p in row.pools:
        pw = f"{where} pool {p.role.value}"
        try:
            gpu = cat.gpu(p.gpu)
        except CatalogError:
            gpu = None  # a GPU outside the catalog: deploy refuses it; nothing to compare here
        if gpu is not None and p.tp > gpu.interconnect.gpus_per_domain:
            raise ConfigError(f"{pw}: tp {p.tp} exceeds {gpu.id}'s interconnect domain of "
                              f"{gpu.interconnect.gpus_per_domain} GPUs ({gpu.interconnect.kind}); {_HINT}")
        _nonneg(p.usd_per_gpu_hour, "usd_per_gpu_hour", pw, MAX_USD_PER_GPU_HOUR)
        if p.rental is not None:
            r = p.rental
            _nonneg(r.usd_per_instance_hour, "rental.usd_per_instance_hour", pw, MAX_USD_PER_GPU_HOUR * 1000)
            _nonneg(r.usd_per_hour, "rental.usd_per_hour", pw, MAX_USD_PER_HOUR)
            _nonneg(r.rdma_per_gpu, "rental.rdma_per_gpu", pw, 64)
            if r.rdma_resource and not K8S_EXTENDED_RESOURCE.fullmatch(r.rdma_resource):
                raise ConfigError(f"{pw}: rental.rdma_resource {r.rdma_resource[:80]!r} is not a Kubernetes extended "
                                  f"resource name (domain/name, e.g. vpc.amazonaws.com/efa); {_HINT}")
        _nonneg(p.kv_capacity_tokens, "kv_capacity_tokens", pw, 1e15)
    _nonneg(row.usd_per_hour, "usd_per_hour", where, MAX_USD_PER_HOUR)
    for name in ("usd_per_million_output_tokens", "usd_per_million_tokens", "ttft_s", "tpot_s", "e2e_s",
                 "output_tokens_per_s", "load_utilisation"):
        _nonneg(getattr(row, name, None), name, where, 1e15)
    _check_kv_link_model(row.kv_link_model, where)
    pool_usd = [p.usd_per_hour for p in row.pools]
    if row.usd_per_hour is not None and all(u is not None for u in pool_usd):
        total = sum(u for u in pool_usd if u is not None)
        if abs(total - row.usd_per_hour) > 0.01 + 1e-3 * total:
            raise ConfigError(f"{where}: usd_per_hour {row.usd_per_hour:g} is not the sum of its pools' "
                              f"({total:g}); {_HINT}")


#: the KV link a P/D row was sized with (``kv_link_model``, recommender.load.link.KvLink's fields): each bounded
KV_LINK_LIMITS = {"bytes_per_token": 1e9, "nic_bytes_per_s": MAX_NIC_BYTES_PER_S, "prefill_tp": MAX_TP,
                  "decode_tp": MAX_TP, "latency_s": 60.0, "handoff_s": 60.0}


def _check_kv_link_model(kl: Mapping[str, float] | None, where: str) -> None:
    """A P/D row's KV link: only :class:`KvLink`'s fields, each between 0 and its bound (the NIC above 0, the TPs
    at least 1), so a hand-edited link is refused on read rather than by the load model."""
    if not kl:
        return
    unknown = sorted(set(kl) - set(KV_LINK_LIMITS))
    if unknown:
        raise ConfigError(f"{where}: kv_link_model has unknown field(s) {', '.join(k[:40] for k in unknown[:3])} "
                          f"(known: {', '.join(KV_LINK_LIMITS)}); {_HINT}")
    missing = [k for k in ("bytes_per_token", "nic_bytes_per_s") if k not in kl]
    if missing:
        raise ConfigError(f"{where}: kv_link_model lacks {' and '.join(missing)}; {_HINT}")
    for name, value in kl.items():
        _nonneg(value, f"kv_link_model.{name}", where, KV_LINK_LIMITS[name])
    if kl.get("nic_bytes_per_s", 1.0) <= 0 or min(kl.get("prefill_tp", 1.0), kl.get("decode_tp", 1.0)) < 1:
        raise ConfigError(f"{where}: kv_link_model needs nic_bytes_per_s above 0 and TPs of at least 1; {_HINT}")


def _check_pool(p: Pool, max_model_len: int, where: str) -> None:
    """Known dtypes; vLLM's own start-up checks (SchedulerConfig / CacheConfig), so a refused engine is never
    deployed or simulated; sizes within MAX_* (a corrupt plan must not become 1e30 replicas). What depends on
    the GPU or the model (kernels, TP dividing the heads) is deploy's to check."""
    if p.weight_dtype not in WEIGHT_DTYPES:
        raise ConfigError(f"{where}: unknown weight_dtype {p.weight_dtype!r} (expected one of {', '.join(WEIGHT_DTYPES)}); {_HINT}")
    if p.kv_dtype not in KV_DTYPES:
        raise ConfigError(f"{where}: unknown kv_dtype {p.kv_dtype!r} (expected {' or '.join(KV_DTYPES)}); {_HINT}")
    if not (1 <= p.tp <= MAX_TP and 1 <= p.replicas <= MAX_REPLICAS):
        raise ConfigError(f"{where}: tp must be in 1..{MAX_TP} and replicas in 1..{MAX_REPLICAS:,} "
                          f"(got tp={p.tp}, replicas={p.replicas})")
    if not (1 <= p.data_parallel_size <= MAX_TP and 0 <= p.num_speculative_tokens <= 8):
        raise ConfigError(f"{where}: data_parallel_size must be in 1..{MAX_TP} and num_speculative_tokens in 0..8 "
                          f"(got {p.data_parallel_size}, {p.num_speculative_tokens})")
    if not 1 <= p.pp <= MAX_PP:
        raise ConfigError(f"{where}: pp (pipeline stages) must be in 1..{MAX_PP} (got {p.pp}); {_HINT}")
    nic = p.stage_nic_bytes_per_s_per_gpu
    if nic is not None and not (math.isfinite(nic) and 0 < nic <= MAX_NIC_BYTES_PER_S):
        raise ConfigError(f"{where}: stage_nic_bytes_per_s_per_gpu must be above 0 and at most {MAX_NIC_BYTES_PER_S:g} "
                          f"(got {nic:g}); {_HINT}")
    if p.max_num_seqs > MAX_ENGINE_SEQS or max(p.max_num_batched_tokens, max_model_len) > MAX_ENGINE_TOKENS:
        raise ConfigError(f"{where}: max_num_seqs / max_num_batched_tokens / max_model_len out of range")
    if p.max_num_seqs < 1 or max_model_len < 1:
        raise ConfigError(f"{where}: max_num_seqs and max_model_len must be >= 1")
    if p.max_num_batched_tokens < p.max_num_seqs:
        raise ConfigError(f"{where}: vLLM requires max_num_batched_tokens ({p.max_num_batched_tokens}) "
                          f">= max_num_seqs ({p.max_num_seqs})")
    if not p.chunked_prefill and p.max_num_batched_tokens < max_model_len:
        raise ConfigError(f"{where}: with chunked prefill off vLLM requires max_num_batched_tokens "
                          f"({p.max_num_batched_tokens}) >= max_model_len ({max_model_len}); pick a plan with chunked "
                          f"prefill or a larger token budget")
    if not MIN_GPU_MEMORY_UTILIZATION <= p.gpu_memory_utilization <= 1.0:
        raise ConfigError(f"{where}: gpu_memory_utilization must be in [{MIN_GPU_MEMORY_UTILIZATION}, 1], got "
                          f"{p.gpu_memory_utilization:g}")
