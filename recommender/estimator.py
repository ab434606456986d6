"""The estimate library: one Deployment builder, one typed load, one prediction path.

``recommend estimate``, ``recommend calibrate`` (through ``calibrate.measurements``), ``simulate``,
the search and replan build every :class:`~recommender.perf.step.Deployment` with
:func:`build_deployment` and predict a :class:`~recommender.perf.steady.Load` with :func:`predict`:

- ``context`` / ``static`` / ``closed`` / ``max``: the steady-state model (``perf.steady``), with
  admission and the prefill queue when a closed loop asks more than the engine runs at once;
- ``open``: open-loop arrivals at a rate, steady state, through the queueing model (``load.analyze``);
- ``finite``: a run of M requests at a rate and/or a concurrency cap, as ``vllm bench serve`` runs it:
  analytic transient by default (:func:`finite_run`), the discrete-event simulator on request.

The engine conditions (limits, memory fraction, front end) are one layer (``perf.conditions``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from recommender.catalog import KV_DTYPES, WEIGHT_DTYPES, Catalog, Gpu, default_catalog
from recommender.dtypes import WeightsChoice, resolve_weights
from recommender.errors import ConfigError, DoesNotFitError, RecommenderError
from recommender.hf_config import ModelArch, not_a_model_repo
from recommender.offers import (Offer, Rental, cheapest_rental, fits, multinode_offers, rent,
                               slowest_stage_nic_bytes_per_s_per_gpu)
from recommender.perf.conditions import EngineConditions, engine_conditions, with_limits
from recommender.perf.steady import Estimate, Load, LoadMode, estimate
from recommender.perf.moe import check_layout
from recommender.perf.pipeline import why_not_pipelined
from recommender.perf.speculative import SpecDecode
from recommender.perf.step import Deployment, EngineLimits, check_parallelism, default_limits
from recommender.profiles import EngineProfile, resolve_profile
from recommender import dtypes, units


def native_weight_dtype(model: ModelArch) -> str:
    """The checkpoint's own dtype (:func:`recommender.dtypes.native_weight_dtype`)."""
    return dtypes.native_weight_dtype(model.checkpoint_dtype)


@dataclass(frozen=True)
class Pricing:
    """What an estimate charges per hour and where that price comes from (shown in its Cost section).

    Without ``--price`` the configuration rents whole instances of the cheapest offer that holds its TP groups
    (:func:`recommender.offers.cheapest_rental`, as the search prices a pool); ``--price`` is USD per GPU-hour,
    billed per GPU."""

    usd_per_hour: float
    gpus: int  # GPUs the configuration runs (tp x replicas)
    basis: str  # the formula, e.g. "1 x runpod-secure 1-GPU instance at $6.79/h"
    source: str  # where the price comes from (provider, instance size, SKU, date, source tag), or "--price"
    rental: Rental | None = None
    notes: tuple[str, ...] = ()  # idle instance GPUs, a TP that does not fit the cheapest offer's instances
    priced: bool = True  # False: no --price and no catalog offer (GPUs a user owns): the estimate states no cost

    @property
    def usd_per_gpu_hour(self) -> float:
        """USD per hour per GPU the configuration runs (what :func:`recommender.perf.steady.estimate` takes)."""
        return self.usd_per_hour / self.gpus

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {"usd_per_hour": self.usd_per_hour if self.priced else None, "basis": self.basis,
                                "source": self.source, "notes": list(self.notes)}
        if self.rental is not None:
            o = self.rental.offer
            d.update(provider=o.provider, sku=o.sku, gpus_per_instance=o.gpus_per_instance, instances=self.rental.instances,
                     usd_per_instance_hour=o.usd_per_instance_hour, date=o.date)
        return d


def _offer_text(o: Offer) -> str:
    sku = f" {o.sku!r}" if o.sku else ""
    dated = ", ".join(x for x in (o.date, o.source) if x)
    return (f"{o.provider}{sku}, {o.gpus_per_instance}-GPU instances at ${o.usd_per_instance_hour:,.2f}/instance-hour "
            f"(${o.usd_per_gpu_hour:,.2f}/GPU-hour{'; ' + dated if dated else ''})")


def pricing_for(gpu: Gpu, *, tp: int, replicas: int, usd_per_gpu_hour: float | None = None, pp: int = 1) -> Pricing:
    """The price of ``replicas`` TP groups of ``tp`` GPUs (``pp`` > 1: ``replicas x pp`` stage groups, on the offers
    that name their NIC): ``--price`` (USD per GPU-hour) when given, else whole instances of the cheapest catalog
    offer holding a TP group; unpriced (``priced`` False, 0 USD) when the GPU has no offer: the estimate's performance
    stands and its cost section asks for ``--price``."""
    replicas *= pp
    gpus = tp * replicas
    if usd_per_gpu_hour is not None:
        if usd_per_gpu_hour < 0:
            raise ConfigError(f"price {usd_per_gpu_hour} USD/GPU-hour must be >= 0")
        return Pricing(usd_per_hour=usd_per_gpu_hour * gpus, gpus=gpus, source="--price (USD per GPU-hour, billed per GPU)",
                       basis=f"${usd_per_gpu_hour:g}/GPU-hour x {gpus} GPUs")
    cheapest = gpu.cheapest_offer
    if cheapest is None:   # performance still stands; the cost waits for a price
        return Pricing(usd_per_hour=0.0, gpus=gpus, basis="no price", priced=False,
                       source=f"none: {gpu.id} has no catalog price (none with a source and date was found); pass "
                              "--price USD_PER_GPU_HOUR for the cost")
    rental = cheapest_rental(gpu.offers if pp == 1 else multinode_offers(gpu.offers, tp), tp, replicas)
    if rental is None:
        largest = max(o.nvlink_domain_gpus or o.gpus_per_instance for o in gpu.offers)
        note = (f"TP {tp} does not fit one instance of any {gpu.id} offer (the largest holds {largest} "
                f"GPU{'s' if largest > 1 else ''}): no offer rents it and the search never proposes it; priced per GPU "
                f"at the cheapest offer's rate")
        return Pricing(usd_per_hour=cheapest.usd_per_gpu_hour * gpus, gpus=gpus, notes=(note,),
                       basis=f"${cheapest.usd_per_gpu_hour:g}/GPU-hour x {gpus} GPUs (no instance holds TP {tp})",
                       source=f"cheapest offer per GPU-hour: {_offer_text(cheapest)}")
    o = rental.offer
    notes: list[str] = []
    if cheapest is not o and cheapest.usd_per_gpu_hour < o.usd_per_gpu_hour:
        if pp > 1 and cheapest not in multinode_offers((cheapest,), tp):
            notes.append(f"pipeline stages rent only offers whose NIC between instances the catalog names; the cheapest "
                         f"per GPU-hour ({cheapest.provider}, ${cheapest.usd_per_gpu_hour:,.2f}) names none or holds no "
                         f"TP {tp} stage")
        elif not fits(cheapest, tp):
            notes.append(f"TP {tp} does not fit one instance of the cheapest offer per GPU-hour ({cheapest.provider}, "
                         f"{cheapest.gpus_per_instance}-GPU instances at ${cheapest.usd_per_gpu_hour:,.2f}/GPU-hour)")
        else:
            held = rent(cheapest, tp, replicas)
            cost = f" would cost ${held.usd_per_hour:,.2f}/h" if held is not None else ""
            notes.append(f"the cheapest offer per GPU-hour ({cheapest.provider}, ${cheapest.usd_per_gpu_hour:,.2f}) sells "
                         f"{cheapest.gpus_per_instance}-GPU instances only, which{cost} here")
    if rental.gpus_billed > gpus:
        # with pp > 1 the rental counts stage groups: a replica is pp of them
        fit = f": up to {rental.replicas // pp} replicas cost the same" if rental.replicas // pp > replicas // pp else ""
        notes.append(f"{rental.instances} instance{'s hold' if rental.instances > 1 else ' holds'} {rental.gpus_billed} "
                     f"GPUs for the {gpus} this runs{fit}")
    plural = "s" if rental.instances > 1 else ""
    return Pricing(usd_per_hour=rental.usd_per_hour, gpus=gpus, rental=rental, notes=tuple(notes),
                   basis=f"{rental.instances} x {o.provider} {o.gpus_per_instance}-GPU instance{plural} "
                         f"at ${o.usd_per_instance_hour:,.2f}/h",
                   source=f"cheapest whole-instance offer: {_offer_text(o)}")


def build_deployment(*, model: ModelArch, gpu: Gpu, tp: int, weight_dtype: str, kv_dtype: str,
                     profile: EngineProfile, limits: EngineLimits | None = None, gpu_memory_utilization: float = 0.92,
                     cuda_graphs: bool = True, max_model_len: int = 0, dp: int = 1, ep: bool = False,
                     spec: SpecDecode | None = None, pp: int = 1,
                     stage_nic_bytes_per_s_per_gpu: float = 0.0) -> Deployment:
    """THE way to build a :class:`Deployment` (estimate, calibrate, simulate, search, replan).

    ``limits`` default to vLLM's for the GPU; the profile is specialised to the GPU's family and the model
    (:meth:`EngineProfile.for_gpu`: the family's fitted parameters where it has measurements, else the engine
    profile; then the family's override for this model, where a calibration of one configuration wrote one)."""
    return Deployment(model=model, gpu=gpu, tp=tp, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                      profile=profile.for_gpu(gpu.id, model.id), limits=limits if limits is not None else default_limits(gpu),
                      gpu_memory_utilization=gpu_memory_utilization, cuda_graphs=cuda_graphs,
                      max_model_len=max_model_len, dp=dp, ep=ep, spec=spec, pp=pp,
                      stage_nic_bytes_per_s_per_gpu=stage_nic_bytes_per_s_per_gpu)


#: ``--speculative-config`` methods that mean the model's own MTP heads (vLLM 0.33 SpeculativeConfig.method)
MTP_METHODS = ("mtp", "deepseek_mtp")
#: Per-position acceptance used when neither ``--acceptance-rate`` nor the model catalog's ``speculative:`` gives one
FALLBACK_ACCEPTANCE_RATE = 0.7


def acceptance_by_engine(catalog: Catalog, model: ModelArch) -> dict[str, tuple[float, str]]:
    """Engine profile name -> (per-position acceptance rate, its source) for the engines the model catalog's
    ``speculative.by_engine`` measured on their own (malformed entries skipped)."""
    doc = catalog.model_meta.get(model.id, {}).get("speculative") or {}
    per = doc.get("by_engine") if isinstance(doc, dict) else None
    if not isinstance(per, dict):
        return {}
    return {str(e): (float(v["acceptance_rate"]), str(v.get("source", f"catalogs/models/{model.id}.yaml ({e})")))
            for e, v in per.items() if isinstance(v, dict) and isinstance(v.get("acceptance_rate"), (int, float))}


def default_acceptance(catalog: Catalog, model: ModelArch, engine: str | None = None) -> tuple[float, str]:
    """(per-position acceptance rate, its source): ``engine``'s own (:func:`acceptance_by_engine`; ``engine`` a profile
    name such as ``trtllm``) where measured, else the model catalog's ``speculative.acceptance_rate`` (fitted on
    measurements, with its source), else :data:`FALLBACK_ACCEPTANCE_RATE`."""
    own = acceptance_by_engine(catalog, model).get(engine) if engine else None
    if own is not None:
        return own
    doc = catalog.model_meta.get(model.id, {}).get("speculative") or {}
    if isinstance(doc, dict) and isinstance(doc.get("acceptance_rate"), (int, float)):
        return float(doc["acceptance_rate"]), str(doc.get("source", f"catalogs/models/{model.id}.yaml"))
    return FALLBACK_ACCEPTANCE_RATE, "fallback (no measured acceptance for this model)"


def mtp_spec(model: ModelArch, num_speculative_tokens: int, catalog: Catalog | None = None) -> SpecDecode | None:
    """A plan pool's ``num_speculative_tokens`` as :class:`SpecDecode` at :func:`default_acceptance` (None for 0):
    what the search sized it with (``recommender.sizing.Sizer.speculation``)."""
    if num_speculative_tokens <= 0:
        return None
    a, source = default_acceptance(catalog or default_catalog(), model)
    return SpecDecode(num_speculative_tokens=num_speculative_tokens, acceptance_rate=a, acceptance_source=source)


def parse_speculative_config(text: str | None, model: ModelArch, *, acceptance_rate: float | None = None,
                             catalog: Catalog | None = None, engine: str | None = None) -> SpecDecode | None:
    """``--speculative-config`` JSON as vLLM 0.33 takes it (``{"method": "mtp", "num_speculative_tokens": k}``) ->
    :class:`SpecDecode`, or None without it. ``num_speculative_tokens`` defaults to the model's MTP layer count
    (vLLM's rule); the acceptance rate to :func:`default_acceptance` (``engine``'s own where measured). One-line errors
    for anything else."""
    import json

    from recommender.perf.speculative import MAX_SPECULATIVE_TOKENS

    if acceptance_rate is not None and not (math.isfinite(acceptance_rate) and 0 < acceptance_rate <= 1):
        raise ConfigError(f"--acceptance-rate {acceptance_rate}: a per-position acceptance probability in (0, 1]")
    if text is None:
        if acceptance_rate is not None:
            raise ConfigError("--acceptance-rate needs --speculative-config (e.g. '{\"method\": \"mtp\"}')")
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        raise ConfigError(f"--speculative-config {text!r} is not JSON; e.g. '{{\"method\": \"mtp\", \"num_speculative_tokens\": 1}}'") from None
    if not isinstance(doc, dict):
        raise ConfigError("--speculative-config must be a JSON object such as {\"method\": \"mtp\", \"num_speculative_tokens\": 1}")
    allowed = {"method", "num_speculative_tokens", "model", "draft_tensor_parallel_size", "enforce_eager", "quantization"}
    unknown = sorted(set(doc) - allowed)
    if unknown:
        raise ConfigError(f"--speculative-config key {unknown[0]!r} is not modelled; the estimate takes method and "
                          f"num_speculative_tokens (MTP)")
    method = doc.get("method") or ("mtp" if doc.get("model") in (None, model.hf_repo) else None)
    if method not in MTP_METHODS:
        raise ConfigError(f"--speculative-config method {doc.get('method')!r}: only the model's own MTP heads are modelled "
                          f"(method {' or '.join(repr(m) for m in MTP_METHODS)})")
    if model.mtp_layers <= 0:
        raise ConfigError(f"--speculative-config MTP: {model.id} has no MTP heads (config num_nextn_predict_layers is 0); "
                          f"drop --speculative-config or use a model with MTP layers (deepseek-v3)")
    k = doc.get("num_speculative_tokens", model.mtp_layers)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
        raise ConfigError(f"--speculative-config num_speculative_tokens {k!r}: an integer from 1 to {MAX_SPECULATIVE_TOKENS}")
    if acceptance_rate is None:
        a, source = default_acceptance(catalog or default_catalog(), model, engine)
    else:
        a, source = acceptance_rate, "--acceptance-rate"
    return SpecDecode(num_speculative_tokens=k, acceptance_rate=a, acceptance_source=source)


def conditions_of(dep: Deployment) -> EngineConditions:
    """The engine conditions a deployment runs under (its own limits; the basis names vLLM's defaults when equal),
    named by its profile's engine, with the front end its limits say the figures are timed by: the engine's own
    timer, or an HTTP server that adds ``server_request_overhead_s`` (what ``StepCostModel`` charges)."""
    engine = dep.profile.engine or "vllm"
    base = engine_conditions(engine if engine in ("trtllm", "lmdeploy", "gpt-fast") else "vllm",
                             model=dep.model, gpu=dep.gpu, tp=dep.tp, weight_dtype=dep.weight_dtype,
                             kv_dtype=dep.kv_dtype, prompt_tokens=dep.max_model_len, output_tokens=1, profile=dep.profile)
    cond = with_limits(base, dep.limits, "set by flags")
    timer = dep.limits.engine_timer
    overhead = dep.profile.request_overhead_s + (0.0 if timer else dep.profile.server_request_overhead_s)
    return replace(cond, engine=engine, front_end="engine timer" if timer else "OpenAI API server",
                   request_overhead_s=overhead, gpu_memory_utilization=dep.gpu_memory_utilization,
                   cuda_graphs=dep.cuda_graphs)


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
    dp: int = 1                          # --data-parallel-size (attention ranks; MoE layers span tp x dp)
    ep: bool = False                     # --enable-expert-parallel
    speculative_config: str | None = None  # --speculative-config JSON (MTP)
    acceptance_rate: float | None = None  # --acceptance-rate (per draft position)
    scheduler_poll_steps: int = 1        # SGLang --scheduler-recv-interval: new requests are taken every N steps
    pp: int = 1                          # --pipeline-parallel-size: stages of --tp GPUs, one instance each
    stage_nic_bytes_per_s_per_gpu: float | None = None  # pp > 1: the NIC between them (None: the catalog offers')
    shared_prefix_fraction: float = 0.0  # share of each prompt the prefix cache serves (vLLM's prefix caching on when > 0)
    #: the checkpoint vLLM loads (``--checkpoint``): None = the catalog's (its ``quantized_checkpoints`` entry for a
    #: dtype other than the model's own), "" = the model's own repo (quantized online at load where the dtype differs;
    #: ``--checkpoint none``), else that repo; a block-quantized one refuses layouts that split its blocks
    #: (``Catalog.weight_block_for``, ``perf.blocks``)
    checkpoint: str | None = None


#: ``--checkpoint none``: no pre-quantized checkpoint, the model's own repo (quantized online at load where the weight
#: dtype is not its own): ``EstimateRequest.checkpoint = ""``
CHECKPOINT_NONE = "none"


def checkpoint_of_flag(text: str) -> str:
    """``--checkpoint``'s value as ``EstimateRequest.checkpoint``: ``none`` (any case) or an empty string -> ""
    (the model's own repo), else the repo as given (:func:`build` checks it; :func:`check_checkpoint`)."""
    return "" if text.lower() in ("", CHECKPOINT_NONE) else text


def check_checkpoint(checkpoint: str | None) -> None:
    """Refuse (ConfigError, one line) a ``--checkpoint`` that is neither a Hugging Face repo id nor an absolute local
    path (None and "": the catalog's, the model's own repo)."""
    why = not_a_model_repo(checkpoint, "--checkpoint") if checkpoint else None
    if why:
        raise ConfigError(f"{why}; give the pre-quantized checkpoint's repo, or --checkpoint {CHECKPOINT_NONE} "
                          f"for the model's own repo (quantized at load)")


def checkpoint_flag(req: EstimateRequest, catalog: Catalog | None = None) -> str | None:
    """The ``--checkpoint`` value a command line needs to load what ``req`` loads: None where ``estimate``'s default
    (:meth:`Catalog.default_checkpoint`) is the same checkpoint, ``none`` for the model's own repo, else the repo."""
    if req.checkpoint is None:
        return None
    cat = catalog or default_catalog()
    try:
        model = cat.model(req.model)
        default = cat.default_checkpoint(model, (req.weight_dtype or native_weight_dtype(model)).lower())
    except RecommenderError:
        default = ""  # a model outside the catalog has no catalog checkpoint
    if req.checkpoint.strip().lower() == default.lower():
        return None
    return req.checkpoint or CHECKPOINT_NONE


def weights_condition(req: EstimateRequest, dep: Deployment) -> str | None:
    """The line saying which weights vLLM loads, where the request names its checkpoint (``--checkpoint``, or a plan's
    pool) and they are not simply the model's own repo at its own dtype: ``deploy``'s wording (:func:`serve_weights`),
    with the checkpoint's block size where it is block-quantized."""
    if req.checkpoint is None:
        return None
    m, wd = dep.model, dep.weight_dtype
    native, repo = native_weight_dtype(m), m.hf_repo or m.id
    if not req.checkpoint and wd == native:
        return None
    serve = serve_weights(req, dep)
    # None: int8 / int4 / fp4 from a 16-bit repo, where deploy needs a pre-quantized checkpoint
    note = serve.note if serve is not None else (
        f"{native} checkpoint {repo} at {wd} weights (deploy needs a pre-quantized {wd} checkpoint: --checkpoint REPO)")
    found = default_catalog().weight_block_for(m, wd, req.checkpoint)
    block = f", {found[1][0]}x{found[1][1]} blocks (each GPU's shard must be whole blocks)" if found else ""
    return f"weights: {note}{block}"


def serve_weights(req: EstimateRequest, dep: Deployment) -> WeightsChoice | None:
    """What ``vllm serve`` loads for ``req`` (:func:`recommender.dtypes.resolve_weights`, deploy's policy): the named
    checkpoint, else the catalog's for the weight dtype (:meth:`Catalog.default_checkpoint`), else the model's own repo
    (``--quantization fp8`` / ``--dtype`` where it is quantized or cast at load); None where vLLM would need a
    pre-quantized checkpoint no one named."""
    m, wd = dep.model, dep.weight_dtype
    ckpt = req.checkpoint
    if ckpt is None:
        try:
            ckpt = default_catalog().default_checkpoint(m, wd)
        except RecommenderError:
            ckpt = ""
    try:
        return resolve_weights(wd, native_weight_dtype(m), m.hf_repo or m.id, ckpt or None)
    except RecommenderError:
        return None


def estimate_conditions(req: EstimateRequest, dep: Deployment) -> list[str]:
    """The conditions lines ``estimate`` prints for ``req``: the engine's (:func:`conditions_of`), then which weights
    it loads where the request names its checkpoint (:func:`weights_condition`)."""
    weights = weights_condition(req, dep)
    return conditions_of(dep).lines() + ([weights] if weights else []) + _poll_condition(dep)


def _poll_condition(dep: Deployment) -> list[str]:
    """The scheduler's poll interval where it is not every step (``perf.steady.poll_wait_s``), or, for SGLang, that
    every step is assumed (its InferenceX launch scripts poll every 4-30 steps: ``--scheduler-poll-steps``)."""
    n = dep.limits.scheduler_poll_steps
    if n > 1:
        return [f"scheduler takes new requests every {n} steps (--scheduler-poll-steps): a prompt waits "
                f"{(n - 1) / 2:g} steps on average before its prefill"]
    if dep.profile.engine == "sglang":
        return ["scheduler takes new requests every step; SGLang polls every --scheduler-recv-interval steps "
                "(InferenceX's launch scripts: 10-30 on B200 / B300, 4 on AMD): pass it as --scheduler-poll-steps (closed "
                "loops)"]
    return []


#: largest values estimate accepts (refused before any loop; workload.MAX_TOKENS is the token bound)
MAX_SEQS = 1_000_000
MAX_REPLICAS = 100_000
MAX_TP = 1024
MAX_PP = 256
MAX_RATE_PER_S = 1e6


def _positive(name: str, v: int | None, cap: int | None = None) -> None:
    from recommender.workload import MAX_TOKENS

    cap = MAX_TOKENS if cap is None else cap
    if v is not None and not 0 < v <= cap:
        raise ConfigError(f"{name} must be a positive {_POSITIVE_WHAT.get(name, 'number')} up to {cap:,}, got {v}")


#: what each count :func:`_positive` checks counts (the default: tokens)
_POSITIVE_WHAT = {"--tp": "number of GPUs", "--replicas": "number of replicas", "--batch": "number of sequences",
                  "--max-num-seqs": "number of sequences", "--scheduler-poll-steps": "number of steps",
                  "--pipeline-parallel-size": "number of stages", "--context": "number of tokens",
                  "--prompt-tokens": "number of tokens", "--output-tokens": "number of tokens",
                  "--max-num-batched-tokens": "number of tokens", "--max-model-len": "number of tokens",
                  "--concurrency": "number of requests"}


def check_vllm_runs(catalog: Catalog, gpu: Gpu, *, weight_dtype: str, kv_dtype: str) -> None:
    """Refuse (ConfigError, one line) a configuration vLLM 0.33 would not start: the kernel-support table's
    rule (:meth:`recommender.kernels.ArchSupport.why_not`, the one ``deploy`` and the search apply), with
    the flags to try: the nearest weight dtype the GPU runs, or GPUs whose architecture runs the dtype."""
    if not gpu.vllm_supported:
        raise ConfigError(f"vLLM 0.33 does not support GPU {gpu.id!r} (catalog vllm.supported is false); "
                          f"try another --gpu (`recommend gpus` lists them)")
    why = gpu.why_unsupported(weight_dtype, kv_dtype)
    if why is None:
        return
    if not gpu.supports_dtype(weight_dtype):
        closest = gpu.kernels.closest_weight_dtype(weight_dtype)
        archs = sorted({g.kernels.arch for g in catalog.gpus.values() if g.supports_dtype(weight_dtype)})
        tries = ([f"--weight-dtype {closest}"] if closest else []) + (
            [f"a --gpu whose architecture runs {weight_dtype} ({', '.join(archs)})"] if archs else [])
    else:
        tries = [f"--kv-dtype {d}" for d in gpu.kernels.kv_dtypes]
    raise ConfigError(f"{why}; try {' or '.join(tries) or 'another --gpu'}")


def build(req: EstimateRequest, catalog: Catalog | None = None, profile: EngineProfile | None = None) -> tuple[Deployment, Load]:
    """Validate the request and build the deployment and the load."""
    cat = catalog or default_catalog()
    model = cat.model(req.model)
    gpu = cat.gpu(req.gpu)
    for name, v, cap in (("--tp", req.tp, MAX_TP), ("--replicas", req.replicas, MAX_REPLICAS),
                         ("--batch", req.batch, MAX_SEQS), ("--context", req.context_tokens, None),
                         ("--prompt-tokens", req.prompt_tokens, None), ("--output-tokens", req.output_tokens, None),
                         ("--max-num-seqs", req.max_num_seqs, MAX_SEQS),
                         ("--max-num-batched-tokens", req.max_num_batched_tokens, None),
                         ("--max-model-len", req.max_model_len, None),
                         ("--scheduler-poll-steps", req.scheduler_poll_steps, 1000),
                         ("--pipeline-parallel-size", req.pp, MAX_PP)):
        _positive(name, v, cap)
    if req.usd_per_gpu_hour is not None and not (math.isfinite(req.usd_per_gpu_hour) and 0 < req.usd_per_gpu_hour <= 1000):
        raise ConfigError(f"--price {req.usd_per_gpu_hour}: USD per GPU-hour must be above 0 and at most 1000")
    if not (math.isfinite(req.shared_prefix_fraction) and 0.0 <= req.shared_prefix_fraction < 1.0):
        raise ConfigError(f"--shared-prefix-fraction {req.shared_prefix_fraction}: must be in [0, 1)")
    if not 0.05 <= req.gpu_memory_utilization <= 1.0:
        raise ConfigError(f"--gpu-memory-utilization {req.gpu_memory_utilization} must be in [0.05, 1.0]")
    wd = (req.weight_dtype or native_weight_dtype(model)).lower()
    if wd not in WEIGHT_DTYPES:
        raise ConfigError(f"--weight-dtype {wd!r}: valid dtypes are {', '.join(WEIGHT_DTYPES)}")
    kd = req.kv_dtype.lower()
    if kd not in KV_DTYPES:
        raise ConfigError(f"--kv-dtype {kd!r}: valid dtypes are {', '.join(KV_DTYPES)}")
    check_parallelism(model, gpu, req.tp)
    check_checkpoint(req.checkpoint)
    ckpt, block = cat.weight_block_for(model, wd, req.checkpoint) or ("", None)
    check_layout(model, gpu.id, gpu.interconnect.gpus_per_domain, tp=req.tp, dp=req.dp, ep=req.ep,
                 weight_block=block, checkpoint=ckpt)
    prof = profile or resolve_profile(req.engine, req.profile_file)
    spec = parse_speculative_config(req.speculative_config, model, acceptance_rate=req.acceptance_rate, catalog=cat,
                                    engine=prof.engine)
    if prof.engine == "vllm":
        check_vllm_runs(cat, gpu, weight_dtype=wd, kv_dtype=kd)
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
            _positive("--concurrency", n, MAX_SEQS)
        if not has_req:
            raise ConfigError("--concurrency needs --prompt-tokens and --output-tokens")
        p_tok, o_tok = req.prompt_tokens or 0, req.output_tokens or 0
        load = (Load.offline_max(prompt_tokens=p_tok, output_tokens=o_tok) if conc == "max"
                else Load.closed(concurrency=n, prompt_tokens=p_tok, output_tokens=o_tok))
    elif has_req:
        load = Load.static(batch=req.batch or 1, prompt_tokens=req.prompt_tokens or 0, output_tokens=req.output_tokens or 0)
    else:
        load = Load.context(batch=req.batch or 1, context_tokens=req.context_tokens or 1)
    lim = default_limits(gpu)
    max_len = req.max_model_len or max(load.context_tokens, load.prompt_tokens + load.output_tokens, 1)
    _check_lengths(req, model, max_len)
    budget = req.max_num_batched_tokens or lim.max_num_batched_tokens
    if not req.chunked_prefill and req.max_num_batched_tokens is None:
        budget = max(budget, max_len)   # vLLM's default without chunked prefill: a whole prompt fits one step
    limits = EngineLimits(
        max_num_seqs=req.max_num_seqs or lim.max_num_seqs,
        max_num_batched_tokens=budget,
        chunked_prefill=req.chunked_prefill,
        enable_prefix_caching=req.shared_prefix_fraction > 0.0,
        scheduler_poll_steps=req.scheduler_poll_steps,
    )
    dep = build_deployment(model=model, gpu=gpu, tp=req.tp, weight_dtype=wd, kv_dtype=kd, profile=prof, limits=limits,
                           gpu_memory_utilization=req.gpu_memory_utilization, cuda_graphs=req.cuda_graphs,
                           max_model_len=max_len, dp=req.dp, ep=req.ep, spec=spec, pp=req.pp,
                           stage_nic_bytes_per_s_per_gpu=_stage_nic(req, model, gpu, spec))
    return dep, load


def _check_lengths(req: EstimateRequest, model: ModelArch, max_len: int) -> None:
    """Refuse, in one line, what vLLM refuses at start-up: ``max_model_len`` (``--max-model-len``, else the longest
    request or context) above the model's context (``max_position_embeddings``), and, with chunked prefill off, a
    ``--max-num-batched-tokens`` below ``max_model_len`` (``SchedulerConfig``: a prompt must fit one step)."""
    context = model.max_position_embeddings
    if max_len > context:
        what = (f"--max-model-len {max_len:,}" if req.max_model_len else f"--context {max_len:,} tokens"
                if req.context_tokens is not None else f"prompt + output {max_len:,} tokens")
        raise ConfigError(f"{what} exceeds {model.id}'s context of {context:,} tokens (max_position_embeddings), which "
                          f"vLLM refuses; use at most {context:,} tokens or a longer-context model")
    budget = req.max_num_batched_tokens
    if not req.chunked_prefill and budget is not None and budget < max_len:
        raise ConfigError(f"--max-num-batched-tokens {budget:,} with chunked prefill off: vLLM requires it >= "
                          f"max_model_len ({max_len:,}), a prompt being prefilled in one step; raise it, or drop "
                          f"--no-chunked-prefill")


def _stage_nic(req: EstimateRequest, model: ModelArch, gpu: Gpu, spec: SpecDecode | None) -> float:
    """``--pipeline-parallel-size`` > 1: the NIC per GPU between the stages' instances: the request's (a plan pool's,
    which may be owned nodes'), else the slowest of the catalog's offers of ``gpu`` that hold a ``--tp`` stage and
    name one (as the search prices a pipeline); 0 for one stage.
    Refused in one line where the search would not plan it: sliding-window models, DP attention, EP or MTP."""
    if req.pp == 1:
        return 0.0
    why = why_not_pipelined(model, req.pp)
    if why or req.dp > 1 or req.ep or spec is not None:
        raise ConfigError(f"--pipeline-parallel-size {req.pp}: {why or 'pipeline stages are modelled for plain TP engines'}"
                          f"; try it without --data-parallel-size, --enable-expert-parallel and --speculative-config, "
                          f"or --pipeline-parallel-size 1")
    given = req.stage_nic_bytes_per_s_per_gpu
    if given is not None and not (math.isfinite(given) and given > 0):
        raise ConfigError(f"the stages' NIC must be above 0 bytes/s per GPU, got {given}")
    nic = given if given is not None else slowest_stage_nic_bytes_per_s_per_gpu(gpu.offers, req.tp)
    if nic is None:
        raise ConfigError(f"--pipeline-parallel-size {req.pp}: no {gpu.id} offer in the catalog names the NIC between "
                          f"instances that the stages talk over; try --pipeline-parallel-size 1 or another --gpu")
    return nic


def estimate_request(req: EstimateRequest, catalog: Catalog | None = None,
                     profile: EngineProfile | None = None) -> tuple[Deployment, Load, Estimate]:
    """Build and evaluate; the caller decides what to do when ``estimate.fits`` is False."""
    cat = catalog or default_catalog()
    dep, load = build(req, cat, profile)
    price = pricing_for(dep.gpu, tp=req.tp * req.dp, replicas=req.replicas, usd_per_gpu_hour=req.usd_per_gpu_hour,
                        pp=req.pp)
    # no price: the cost figures are unknown (nan), not free
    usd = price.usd_per_gpu_hour if price.priced else math.nan
    return dep, load, estimate(dep, load, req.replicas, usd, req.shared_prefix_fraction)


def does_not_fit_message(dep: Deployment, est: Estimate) -> str:
    m = dep.memory()
    need = m.weights_bytes_per_gpu + m.activation_bytes_per_gpu + m.runtime_reserve_bytes_per_gpu + m.cuda_graph_bytes_per_gpu + m.min_kv_bytes_per_gpu
    where = f"{dep.tp} x {dep.gpu.id}" + (f" in {dep.pp} pipeline stages" if dep.pp > 1 else "")
    stages = _stages_that_fit(dep)
    tries = (f"--pipeline-parallel-size {stages} (stages on {stages} instances), " if stages else "") + (
        "a larger --tp, " if dep.tp < dep.gpu.interconnect.gpus_per_domain else "")
    return (f"{dep.model.id} ({dep.weight_dtype}) does not fit {where}: each GPU needs "
            f"{units.fmt_bytes(need)} (weights {units.fmt_bytes(m.weights_bytes_per_gpu)} + activations/runtime "
            f"{units.fmt_bytes(m.activation_bytes_per_gpu + m.runtime_reserve_bytes_per_gpu + m.cuda_graph_bytes_per_gpu)} "
            f"+ one {dep.max_model_len}-token sequence's KV {units.fmt_bytes(m.min_kv_bytes_per_gpu)}) but has "
            f"{units.fmt_bytes(m.budget_bytes_per_gpu)} at gpu-memory-utilization {dep.gpu_memory_utilization}: "
            f"short by {units.fmt_bytes(est.shortfall_bytes_per_gpu)} per GPU; try {tries}a smaller "
            f"--weight-dtype (fp8, int4) or a GPU with more memory")


def _stages_that_fit(dep: Deployment) -> int | None:
    """The fewest pipeline stages (2, 4 or 8, as the search tries them and more) above ``dep.pp`` whose fullest
    stage fits, for a plain-TP engine whose ``--tp`` fills the GPU's interconnect domain and whose GPU has an
    offer naming the NIC the stages talk over; else None."""
    if dep.tp < dep.gpu.interconnect.gpus_per_domain or dep.dp > 1 or dep.ep or dep.spec is not None:
        return None
    nic = slowest_stage_nic_bytes_per_s_per_gpu(dep.gpu.offers, dep.tp)
    if nic is None:
        return None
    for pp in (2, 4, 8):
        if pp > dep.pp and not why_not_pipelined(dep.model, pp) and \
                replace(dep, pp=pp, stage_nic_bytes_per_s_per_gpu=nic).memory().fits:
            return pp
    return None


def raise_if_not_fit(dep: Deployment, est: Estimate) -> None:
    if not est.fits:
        raise DoesNotFitError(does_not_fit_message(dep, est), est.shortfall_bytes_per_gpu)


def under_load(dep: Deployment, load: Load, est: Estimate, rate_per_s: float, replicas: int, *,
               shared_prefix_fraction: float = 0.0) -> dict[str, object]:
    """Open-loop Poisson arrivals at ``rate_per_s`` (all replicas): tail latencies from the load model, with
    ``shared_prefix_fraction`` of each prompt served by the prefix cache (as the plan's search priced it).

    ``ttft_s``, ``tpot_s``, ``e2e_s`` and ``output_tokens_per_s`` become the means under that load
    (what ``vllm bench serve --request-rate R`` reports); an unstable configuration reports
    ``stable: false`` and no finite latency. ``usd_per_million_tokens`` = usd_per_hour / (R x 3600 x (prompt +
    output)) x 1e6 and ``usd_per_million_output_tokens`` = usd_per_hour / (R x 3600 x output) x 1e6: the cost
    at that rate, as the plan prices a configuration at the workload's rate.
    """
    from recommender.load import PoolSpec, Traffic, analyze
    from recommender.perf.step import StepCostModel
    from recommender.workload import LengthDist

    if not (math.isfinite(rate_per_s) and 0 < rate_per_s <= MAX_RATE_PER_S):
        raise ConfigError(f"--rate {rate_per_s}: requests per second must be above 0 and at most {MAX_RATE_PER_S:g}")
    if load.mode == LoadMode.CONTEXT:
        raise ConfigError("--rate needs --prompt-tokens and --output-tokens (whole requests), not --context")
    cost = StepCostModel.build(dep)
    res = analyze(PoolSpec(cost=cost, limits=dep.limits, replicas=replicas * dep.dp),
                  Traffic(rate_per_s=rate_per_s, prompt=LengthDist.constant(load.prompt_tokens),
                          output=LengthDist.constant(load.output_tokens), shared_prefix_fraction=shared_prefix_fraction))
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
    # priced at the rate it was given (what the plan reports): USD/h over the tokens that rate brings
    per_hour_tokens = rate_per_s * 3600.0
    out["usd_per_million_output_tokens"] = est.usd_per_hour / (per_hour_tokens * load.output_tokens) * 1e6
    out["usd_per_million_tokens"] = est.usd_per_hour / (per_hour_tokens * (load.prompt_tokens + load.output_tokens)) * 1e6
    return out


# -- finite runs (vllm bench serve): the analytic transient ----------------------------------------
def closed_at(dep: Deployment, n: float, prompt_tokens: int, output_tokens: int) -> tuple[float, float, float]:
    """(ttft_s, tpot_s, e2e_s) of a closed loop at a possibly fractional concurrency ``n`` >= 1.

    Linear interpolation between ``floor(n)`` and ``floor(n) + 1`` requests in flight, so that the
    result is continuous in ``n`` (the fitter differentiates through it)."""
    n0 = max(1, int(math.floor(n)))
    frac = min(max(n - n0, 0.0), 1.0)
    e0 = estimate(dep, Load.closed(concurrency=n0, prompt_tokens=prompt_tokens, output_tokens=output_tokens))
    v0 = (e0.ttft_s, e0.tpot_s, e0.e2e_s or e0.ttft_s)
    if frac == 0.0:
        return v0
    e1 = estimate(dep, Load.closed(concurrency=n0 + 1, prompt_tokens=prompt_tokens, output_tokens=output_tokens))
    v1 = (e1.ttft_s, e1.tpot_s, e1.e2e_s or e1.ttft_s)
    return (v0[0] + frac * (v1[0] - v0[0]), v0[1] + frac * (v1[1] - v0[1]), v0[2] + frac * (v1[2] - v0[2]))


def in_flight(dep: Deployment, load: Load) -> float:
    """Mean requests in flight during a run: the client's cap, or Little's law ``N = rate x e2e(N)`` below it.

    The cap is ``min(concurrency, requests)`` (0 = no client cap): above what the engine runs at once the
    closed loop queues (``perf.steady`` admission). ``N`` is found by Brent's method on
    ``N - rate x e2e(N)`` (increasing in ``N`` for a stable system), at least 1."""
    caps = [c for c in (load.batch, load.requests) if c]
    cap = float(max(1, min(caps))) if caps else 1.0
    rate = load.rate_per_s
    if rate is None or math.isinf(rate):
        return cap

    def g(n: float) -> float:
        return n - rate * closed_at(dep, n, load.prompt_tokens, load.output_tokens)[2]

    if g(cap) <= 0:
        return cap
    if g(1.0) >= 0:
        return 1.0
    from scipy.optimize import brentq  # lazy: only runs at a request rate need it

    return float(brentq(g, 1.0, cap, xtol=1e-6 * cap, rtol=1e-9))


@dataclass(frozen=True)
class RunPrediction:
    """What a finite run (or open loop) reports, means in SI units (``vllm bench serve``'s quantities)."""

    ttft_s: float
    tpot_s: float
    e2e_s: float
    output_tokens_per_s: float
    duration_s: float
    in_flight: float
    completed: int
    percentiles: dict[str, dict[str, float]] = field(default_factory=dict)   # metric -> {p50: s, ...}
    method: str = "analytic"
    stable: bool = True


def finite_run(dep: Deployment, load: Load, n: float | None = None) -> RunPrediction:
    """A run of ``M = load.requests`` requests: the closed loop at :func:`in_flight` requests.

    ``duration = max((M - 1) / rate, (M - N) x e2e / N) + e2e`` (the last arrival, or the steady
    completion rate ``N / e2e``, then one latency to drain); output throughput ``M x output / duration``.
    Small runs are far from the steady state, and above capacity such a run is transient, not unstable.
    At an infinite rate the mean TTFT is ``(N first_wave + (M - N) steady) / M``; with ``N < M / 2`` the median
    request is a steady one, so ``percentiles["ttft"]["p50"]`` is the steady closed loop's TTFT (the first wave
    is a long tail: InferenceX's MI300X 8k:1k at concurrency 64 reads a 2.8 s mean, 0.66 s median, 27 s p99).
    The first wave also waits the profile's ``first_wave_overhead_s`` ``c`` (a cold server), which delays the whole
    run: mean TTFT ``+ N c / M``, every E2E of the first wave and the duration ``+ c``."""
    n = in_flight(dep, load) if n is None else n
    ttft, tpot, e2e = closed_at(dep, n, load.prompt_tokens, load.output_tokens)
    m = load.requests or 1
    rate = load.rate_per_s
    burst = rate is None or math.isinf(rate)
    if burst and n >= m:
        return _burst(dep, load, m)
    pct: dict[str, dict[str, float]] = {}
    if burst:
        # the first N requests start at once: their prefills queue behind each other (first_wave_ttft_s);
        # the later M - N arrive one by one as earlier requests finish (the steady closed loop)
        cold = dep.profile.first_wave_overhead_s
        first = first_wave_ttft_s(dep, load.prompt_tokens, int(round(n)))
        shift = n / m * (first - ttft)
        if n < m / 2:  # the median request is one of the steady M - N, not of the first wave
            pct = {"ttft": {"p50": ttft}}
        ttft, e2e = ttft + shift + n / m * cold, e2e + shift + n / m * cold
        arrivals = 0.0
    else:
        cold = 0.0
        arrivals = (m - 1) / rate  # type: ignore[operator]
    steady_e2e = e2e - (shift + n / m * cold if burst else 0.0)
    duration = max(arrivals, max(m - n, 0.0) * steady_e2e / n) + steady_e2e + (shift if burst else 0.0) + cold
    return RunPrediction(ttft_s=ttft, tpot_s=tpot, e2e_s=e2e, output_tokens_per_s=m * load.output_tokens / duration,
                         duration_s=duration, in_flight=n, completed=m, percentiles=pct)


def first_wave_ttft_s(dep: Deployment, prompt_tokens: int, n: int) -> float:
    """Mean TTFT of ``n`` requests that arrive at once (the first wave of a closed-loop benchmark at ``--request-rate
    inf``): each attention rank takes ``b = min(ceil(n / dp), admitted)`` of them and prefills them first come first
    served in chunks of the token budget, so prompt ``k`` has its first token after about ``k / b`` of the batch's
    prefill time ``T_b`` (``StepCostModel.prefill_s(P, b, budget)``): mean ``(b + 1) / (2 b) x T_b`` + the
    request overhead (s)."""
    from recommender.perf.steady import admitted
    from recommender.perf.step import StepCostModel

    cost = StepCostModel.build(dep)
    b = max(1, min(math.ceil(max(n, 1) / max(dep.dp, 1)), admitted(dep, cost, max(n, 1), prompt_tokens, 1)))
    chunk = dep.limits.max_num_batched_tokens if dep.limits.chunked_prefill else None
    total_s = cost.prefill_s(max(prompt_tokens, 1), b, chunk)
    return (b + 1) / (2.0 * b) * total_s + cost.request_overhead_s


def _burst(dep: Deployment, load: Load, m: int) -> RunPrediction:
    """M requests sent at once, no client cap: the engine admits ``r`` (:func:`perf.steady.admitted`) and,
    with equal lengths, they run as ``W = ceil(M / r)`` synchronised waves, each a static batch (one
    prefill of the wave, then its decode steps). The mean request waits ``(W - 1) / 2`` waves, and every one the
    profile's ``first_wave_overhead_s`` (a cold server: the whole run starts that much later)."""
    r = min(_admitted_of(dep, load) * dep.dp, m)   # every attention rank admits its own
    waves = math.ceil(m / r)
    wave = estimate(dep, Load.static(batch=r, prompt_tokens=load.prompt_tokens, output_tokens=load.output_tokens))
    from recommender.perf.step import StepCostModel

    fixed_s = StepCostModel.build(dep).request_overhead_s   # the profile's + the HTTP front end's, once per request
    wave_s = (wave.e2e_s or wave.ttft_s) - fixed_s
    cold = dep.profile.first_wave_overhead_s
    wait = (waves - 1) / 2.0 * wave_s + cold
    duration = waves * wave_s + fixed_s + cold
    return RunPrediction(ttft_s=wave.ttft_s + wait, tpot_s=wave.tpot_s, e2e_s=(wave.e2e_s or wave.ttft_s) + wait,
                         output_tokens_per_s=m * load.output_tokens / duration, duration_s=duration,
                         in_flight=float(m), completed=m, method="analytic burst")


def _admitted_of(dep: Deployment, load: Load) -> int:
    from recommender.perf.steady import admitted
    from recommender.perf.step import StepCostModel

    return admitted(dep, StepCostModel.build(dep), load.requests or 1, load.prompt_tokens, load.output_tokens)


# -- vllm bench serve: what the benchmark will report ----------------------------------------------
#: The summary keys of a ``vllm bench serve --save-result`` file this module predicts (vLLM 0.33,
#: ``vllm/benchmarks/serve.py``; the default ``--percentile-metrics ttft,tpot,itl`` and
#: ``--metric-percentiles 99``; e2el is added for the check against an end-to-end SLO).
BENCH_METRICS = ("ttft", "tpot", "itl", "e2el")


def bench_run(dep: Deployment, load: Load, *, replicas: int = 1, seed: int = 0) -> dict[str, object]:
    """Predict ``vllm bench serve`` on this deployment: a ``finite`` load of ``requests`` prompts.

    Without a client concurrency cap (or a cap >= the prompts) the run is simulated request by request
    (``load.simulate``: arrivals at ``rate_per_s`` with gamma gaps of shape ``burstiness``, all at once
    at an infinite rate; the server serves from the profile's ``first_wave_overhead_s``, a cold start) and every
    percentile comes from the simulated requests. With a cap below the
    prompts the run is the analytic finite-run transient (:func:`finite_run`) and only means are given, with
    medians equal to them (TTFT's: the steady closed loop's, where the first wave is under half the run). ITL is the
    gap between streamed chunks, one per engine step: TPOT without speculative decoding, TPOT x ``tokens_per_step``
    with MTP (a verify step streams its accepted tokens as one chunk; ``vllm/benchmarks/serve.py`` appends one
    ITL per chunk).
    Keys and units are the benchmark's (``*_ms``, ``duration`` in s, throughputs per second).
    """
    if load.mode != LoadMode.FINITE or not load.requests:
        raise ConfigError("bench_run needs a finite load (--num-prompts)")
    m, p_tok, o_tok = load.requests, load.prompt_tokens, load.output_tokens
    rate = load.rate_per_s if load.rate_per_s is not None else math.inf
    out: dict[str, object] = {"num_prompts": m, "request_rate": rate if math.isfinite(rate) else "inf",
                              "burstiness": load.burstiness, "max_concurrency": load.batch or None}
    capped = bool(load.batch) and load.batch * replicas < m
    tau = dep.spec.tokens_per_step if dep.spec is not None else 1.0  # tokens per streamed chunk (MTP)
    if not capped:
        from recommender.load import PoolSpec, Traffic, simulate
        from recommender.load.percentiles import Percentiles
        from recommender.perf.step import StepCostModel
        from recommender.workload import LengthDist

        sim_rate = rate if math.isfinite(rate) else 1e9   # all at once: arrivals 1 ns apart
        res = simulate(PoolSpec(cost=StepCostModel.build(dep), limits=dep.limits, replicas=replicas * dep.dp),
                       Traffic(rate_per_s=sim_rate, prompt=LengthDist.constant(p_tok), output=LengthDist.constant(o_tok)),
                       n_requests=m, seed=seed, burstiness=load.burstiness,
                       cold_start_s=dep.profile.first_wave_overhead_s)
        t = res.tpot_s
        itl = Percentiles(t.mean * tau, t.p50 * tau, t.p90 * tau, t.p95 * tau, t.p99 * tau)
        dist = {"ttft": res.ttft_s, "tpot": res.tpot_s, "itl": itl, "e2el": res.e2e_s}
        out.update({"method": "simulated", "duration": res.duration_s, "completed": res.completed, "failed": 0,
                    "total_input_tokens": res.completed * p_tok, "total_output_tokens": res.completed * o_tok,
                    "request_throughput": res.requests_per_s, "output_throughput": res.output_tokens_per_s,
                    "total_token_throughput": res.requests_per_s * (p_tok + o_tok)})
        for k, d in dist.items():
            out.update({f"mean_{k}_ms": d.mean * 1e3, f"median_{k}_ms": d.p50 * 1e3,
                        f"p90_{k}_ms": d.p90 * 1e3, f"p99_{k}_ms": d.p99 * 1e3})
        return out
    per_replica = replace(load, requests=math.ceil(m / replicas), batch=max(1, math.ceil(load.batch / replicas)),
                          rate_per_s=rate / replicas if math.isfinite(rate) else math.inf)
    run = finite_run(dep, per_replica)
    req_s = m / run.duration_s
    out.update({"method": "analytic", "duration": run.duration_s, "completed": m, "failed": 0,
                "total_input_tokens": m * p_tok, "total_output_tokens": m * o_tok,
                "request_throughput": req_s, "output_throughput": req_s * o_tok,
                "total_token_throughput": req_s * (p_tok + o_tok)})
    means = {"ttft": run.ttft_s, "tpot": run.tpot_s, "itl": run.tpot_s * tau, "e2el": run.e2e_s}
    for k, v in means.items():
        if k == "itl":  # one chunk per step: the step's median, TPOT's x tokens per step
            med = run.percentiles.get("tpot", {}).get("p50", run.tpot_s) * tau
        else:
            med = run.percentiles.get(k, {}).get("p50", v)
        out.update({f"mean_{k}_ms": v * 1e3, f"median_{k}_ms": med * 1e3})
    return out
