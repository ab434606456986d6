"""Turn ids and flags into a validated :class:`Deployment` (the library side of ``recommend estimate``)."""

from __future__ import annotations

from dataclasses import dataclass

from recommender.catalog import KV_DTYPES, WEIGHT_DTYPES, Catalog, Gpu, default_catalog
from recommender.errors import ConfigError, DoesNotFitError
from recommender.hf_config import ModelArch
from recommender.perf.steady import Estimate, Load, estimate
from recommender.perf.step import Deployment, EngineLimits, check_parallelism, default_limits
from recommender.profiles import EngineProfile, resolve_profile
from recommender import units


def native_weight_dtype(model: ModelArch) -> str:
    """The checkpoint's own dtype (fp16 counts as bf16 for sizing)."""
    return model.checkpoint_dtype if model.checkpoint_dtype in WEIGHT_DTYPES else "bf16"


def price_for(gpu: Gpu, override: float | None = None) -> float:
    """USD per GPU-hour: the override, else the catalog default; error if neither exists."""
    if override is not None:
        if override < 0:
            raise ConfigError(f"price {override} USD/GPU-hour must be >= 0")
        return override
    if gpu.usd_per_gpu_hour is None:
        raise ConfigError(f"{gpu.id} has no catalog price (none with a source and date was found); pass --price USD_PER_GPU_HOUR")
    return gpu.usd_per_gpu_hour


@dataclass(frozen=True)
class EstimateRequest:
    """One configuration and one load, as the CLI (or a script) states it."""

    model: str
    gpu: str
    tp: int = 1
    replicas: int = 1
    weight_dtype: str | None = None
    kv_dtype: str = "bf16"
    batch: int | None = None
    concurrency: str | None = None      # an integer, or "max"
    context_tokens: int | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    engine: str = "vllm"
    profile_file: str | None = None
    usd_per_gpu_hour: float | None = None
    gpu_memory_utilization: float = 0.92
    cuda_graphs: bool = True
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    chunked_prefill: bool = True
    max_model_len: int | None = None


def _positive(name: str, v: int | None) -> None:
    if v is not None and v <= 0:
        raise ConfigError(f"{name} must be a positive number of tokens/sequences, got {v}")


def build(req: EstimateRequest, catalog: Catalog | None = None, profile: EngineProfile | None = None) -> tuple[Deployment, Load]:
    """Validate the request and build the deployment and the load."""
    cat = catalog or default_catalog()
    model = cat.model(req.model)
    gpu = cat.gpu(req.gpu)
    for name, v in (("--tp", req.tp), ("--replicas", req.replicas), ("--batch", req.batch),
                    ("--context", req.context_tokens), ("--prompt-tokens", req.prompt_tokens),
                    ("--output-tokens", req.output_tokens), ("--max-num-seqs", req.max_num_seqs),
                    ("--max-num-batched-tokens", req.max_num_batched_tokens)):
        _positive(name, v)
    if not 0.05 <= req.gpu_memory_utilization <= 1.0:
        raise ConfigError(f"--gpu-memory-utilization {req.gpu_memory_utilization} must be in [0.05, 1.0]")
    wd = (req.weight_dtype or native_weight_dtype(model)).lower()
    if wd not in WEIGHT_DTYPES:
        raise ConfigError(f"--weight-dtype {wd!r}: valid dtypes are {', '.join(WEIGHT_DTYPES)}")
    kd = req.kv_dtype.lower()
    if kd not in KV_DTYPES:
        raise ConfigError(f"--kv-dtype {kd!r}: valid dtypes are {', '.join(KV_DTYPES)}")
    check_parallelism(model, gpu, req.tp)
    if req.batch is not None and req.concurrency is not None:
        raise ConfigError("give --batch (static batch) or --concurrency (continuous batching), not both")
    has_req = req.prompt_tokens is not None or req.output_tokens is not None
    if req.context_tokens is not None and has_req:
        raise ConfigError("give --context (a decode step at that context) or --prompt-tokens/--output-tokens (whole requests), not both")
    if has_req and (req.prompt_tokens is None or req.output_tokens is None):
        raise ConfigError("--prompt-tokens and --output-tokens go together")
    if req.concurrency is not None:
        conc = req.concurrency.strip().lower()
        if conc != "max":
            try:
                n = units.parse_count(conc, "--concurrency")
            except Exception:
                raise ConfigError(f"--concurrency {req.concurrency!r}: an integer or 'max'") from None
            _positive("--concurrency", n)
        if not has_req:
            raise ConfigError("--concurrency needs --prompt-tokens and --output-tokens")
        load = Load("max" if conc == "max" else "closed", 1 if conc == "max" else n, 0,
                    req.prompt_tokens or 0, req.output_tokens or 0)
    elif has_req:
        load = Load("static", req.batch or 1, 0, req.prompt_tokens or 0, req.output_tokens or 0)
    else:
        load = Load("context", req.batch or 1, req.context_tokens or 1)
    lim = default_limits(gpu)
    max_len = req.max_model_len or max(load.context_tokens, load.prompt_tokens + load.output_tokens, 1)
    limits = EngineLimits(
        max_num_seqs=req.max_num_seqs or lim.max_num_seqs,
        max_num_batched_tokens=req.max_num_batched_tokens or lim.max_num_batched_tokens,
        chunked_prefill=req.chunked_prefill,
    )
    prof = profile or resolve_profile(req.engine, req.profile_file)
    dep = Deployment(model=model, gpu=gpu, tp=req.tp, weight_dtype=wd, kv_dtype=kd, profile=prof, limits=limits,
                     gpu_memory_utilization=req.gpu_memory_utilization, cuda_graphs=req.cuda_graphs,
                     max_model_len=max_len)
    return dep, load


def estimate_request(req: EstimateRequest, catalog: Catalog | None = None,
                     profile: EngineProfile | None = None) -> tuple[Deployment, Load, Estimate]:
    """Build and evaluate; the caller decides what to do when ``estimate.fits`` is False."""
    cat = catalog or default_catalog()
    dep, load = build(req, cat, profile)
    price = price_for(dep.gpu, req.usd_per_gpu_hour)
    return dep, load, estimate(dep, load, req.replicas, price)


def does_not_fit_message(dep: Deployment, est: Estimate) -> str:
    m = dep.memory()
    need = m.weights_bytes_per_gpu + m.activation_bytes_per_gpu + m.runtime_reserve_bytes_per_gpu + m.cuda_graph_bytes_per_gpu + m.min_kv_bytes_per_gpu
    return (f"{dep.model.id} ({dep.weight_dtype}) does not fit {dep.tp} x {dep.gpu.id}: each GPU needs "
            f"{units.fmt_bytes(need)} (weights {units.fmt_bytes(m.weights_bytes_per_gpu)} + activations/runtime "
            f"{units.fmt_bytes(m.activation_bytes_per_gpu + m.runtime_reserve_bytes_per_gpu + m.cuda_graph_bytes_per_gpu)} "
            f"+ one {dep.max_model_len}-token sequence's KV {units.fmt_bytes(m.min_kv_bytes_per_gpu)}) but has "
            f"{units.fmt_bytes(m.budget_bytes_per_gpu)} at gpu-memory-utilization {dep.gpu_memory_utilization}: "
            f"short by {units.fmt_bytes(est.shortfall_bytes_per_gpu)} per GPU; try a larger --tp, a smaller "
            f"--weight-dtype (fp8, int4) or a GPU with more memory")


def raise_if_not_fit(dep: Deployment, est: Estimate) -> None:
    if not est.fits:
        raise DoesNotFitError(does_not_fit_message(dep, est), est.shortfall_bytes_per_gpu)


def under_load(dep: Deployment, load: Load, est: Estimate, rate_per_s: float, replicas: int) -> dict[str, object]:
    """Open-loop Poisson arrivals at ``rate_per_s`` (all replicas): tail latencies from the load model.

    ``ttft_s``, ``tpot_s``, ``e2e_s`` and ``output_tokens_per_s`` become the means under that load
    (what ``vllm bench serve --request-rate R`` reports); an unstable configuration reports
    ``stable: false`` and no finite latency.
    """
    from recommender.load import analyze
    from recommender.perf.step import StepCostModel
    from recommender.workload import LengthDist

    if rate_per_s <= 0:
        raise ConfigError(f"--rate {rate_per_s}: requests per second must be > 0")
    if load.mode == "context":
        raise ConfigError("--rate needs --prompt-tokens and --output-tokens (whole requests), not --context")
    cost = StepCostModel.build(dep)
    res = analyze(cost, dep.limits, rate_per_s, LengthDist.constant(load.prompt_tokens),
                  LengthDist.constant(load.output_tokens), replicas=replicas)
    inf = float("inf")
    out: dict[str, object] = {"rate_per_s": rate_per_s, "stable": bool(res.stable), "utilisation": res.utilisation}
    for m in ("ttft", "tpot"):
        for p in ("p50", "p90", "p99"):
            out[f"{m}_{p}_s"] = getattr(res, f"{m}_s").at(p) if res.stable else inf
    out["e2e_p99_s"] = res.e2e_s.at("p99") if res.stable else inf
    out["ttft_s"] = res.ttft_s.at("mean") if res.stable else inf
    out["tpot_s"] = res.tpot_s.at("mean") if res.stable else inf
    out["e2e_s"] = res.e2e_s.at("mean") if res.stable else inf
    out["output_tokens_per_s"] = rate_per_s * load.output_tokens if res.stable else 0.0
    return out
