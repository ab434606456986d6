"""The deployment space: what a candidate is, and which candidates are valid for a model and GPU."""

from __future__ import annotations

from dataclasses import dataclass

from recommender.catalog import Catalog, Gpu
from recommender.dtypes import (
    narrower_or_equal,
    native_weight_dtype,
    resolve_weight_dtype,
)
from recommender.errors import ConfigError
from recommender.hf_config import ModelArch
from recommender.offers import Offer, OwnedGpus, owned_offer, restrict, workload_offer
from recommender.perf.moe import check_layout
from recommender.perf.step import check_parallelism
from recommender.sizing import Candidate

__all__ = ["Candidate", "SpaceChoices", "allowed_gpus", "layout_valid", "moe_layouts", "mtp_choices", "parallelism_valid",
           "resolve_dtype", "weight_dtype_valid"]


@dataclass(frozen=True)
class SpaceChoices:
    """The discrete choices of the space (fixed across trials, as Optuna requires; dtypes resolved for the model)."""

    gpus: tuple[str, ...]
    tps: tuple[int, ...]
    weight_dtypes: tuple[str, ...]
    kv_dtypes: tuple[str, ...]
    max_num_seqs: tuple[int, ...]
    budgets: tuple[int, ...]
    disaggregation: bool
    pd_heterogeneous: bool = False  # decode pool may use another GPU type than prefill
    # MoE models only: (data-parallel attention size, expert parallel) layouts besides plain TP (1, False),
    # each checked per GPU and TP by ``layout_valid``; aggregated pools only
    layouts: tuple[tuple[int, bool], ...] = ()
    # models with MTP heads only: the draft-token counts k > 0 besides no speculation (``mtp_choices``); every
    # aggregated shape (TP or MoE layout) is also tried with each
    mtp: tuple[int, ...] = ()


def resolve_dtype(dtype: str, model: ModelArch) -> str:
    """``native`` -> the checkpoint's own dtype (:func:`recommender.dtypes.native_weight_dtype`)."""
    return resolve_weight_dtype(dtype, model.checkpoint_dtype)


def weight_dtype_valid(model: ModelArch, gpu: Gpu, dtype: str, kv_dtype: str | None = None) -> str | None:
    """None if valid, else why not. A quantized checkpoint is never upcast to a wider dtype on purpose,
    and the GPU must run the dtype pair per the kernel-support table."""
    native = native_weight_dtype(model.checkpoint_dtype)
    if not narrower_or_equal(dtype, native):
        return f"{model.id}'s checkpoint is {native}; serving it at {dtype} would only waste memory"
    if native == "mxfp4" and dtype != "mxfp4":
        return f"{model.id} ships MXFP4 experts; re-quantizing to {dtype} is not a vLLM path"
    return gpu.why_unsupported(dtype, kv_dtype)


def pd_pair_valid(prefill: Gpu, decode: Gpu, tp_prefill: int, tp_decode: int, heterogeneous: bool) -> str | None:
    """None if vLLM 0.33 can hand KV from this prefill pool to this decode pool over NixlConnector.

    - one GPU type in both pools unless the policy allows heterogeneous pools, and one vendor always;
    - both architectures list the ``nixl_connector`` feature (catalogs/kernel-support.yaml);
    - TP sizes divide each other: vLLM's ``TransferTopology.tp_ratio`` (vllm/distributed/kv_transfer/
      kv_connector/utils.py) asserts ``local_tp % remote_tp == 0`` when the decode TP is larger and
      uses ``remote_tp // local_tp`` reads otherwise (nixl/tp_mapping.py), so 1|2, 2|8, 8|4 pair, 2|3 does not.
    """
    if prefill.id != decode.id and not heterogeneous:
        return f"prefill on {prefill.id} and decode on {decode.id}: the policy keeps both pools on one GPU type (pd_heterogeneous_gpus)"
    if prefill.vendor != decode.vendor:
        return f"prefill on {prefill.vendor} and decode on {decode.vendor}: NIXL KV transfer needs one vendor's stack"
    for g in (prefill, decode):
        if "nixl_connector" not in g.kernels.features:
            return f"vLLM 0.33's NixlConnector is not listed for {g.id} ({g.kernels.arch})"
    if max(tp_prefill, tp_decode) % min(tp_prefill, tp_decode):
        return f"NixlConnector needs one TP size to divide the other (prefill TP{tp_prefill}, decode TP{tp_decode})"
    return None


def parallelism_valid(model: ModelArch, gpu: Gpu, tp: int) -> str | None:
    try:
        check_parallelism(model, gpu, tp)
    except ConfigError as e:
        return str(e)
    return None


def layout_valid(model: ModelArch, gpu: Gpu, tp: int, dp: int, ep: bool, *,
                 weight_block: tuple[int, int] | None = None, checkpoint: str = "") -> str | None:
    """None if vLLM runs ``--tensor-parallel-size tp --data-parallel-size dp [--enable-expert-parallel]`` of
    ``model`` on one scale-up domain of ``gpu`` (``recommender.perf.moe.check_layout``: MoE for EP, ``tp x dp``
    inside the domain, experts or, without EP, each expert's FFN split evenly; with a block-quantized ``checkpoint``
    (``weight_block``, ``Catalog.weight_block_for``), every shard whole blocks, plain TP included:
    ``recommender.perf.blocks``) and the search plans it, else why not.

    The search also keeps ``tp x dp`` dividing the domain, its space before ``check_layout`` let an engine span
    part of an NVL72 rack (on GB200: engines of at most 8 GPUs, as TP 8): ``recommend estimate`` explains a GB200
    DP 16 / 32 engine; its only evidence is InferenceX's disaggregated rows (their decode workers,
    docs/accuracy.md), which no aggregated plan's band carries. An engine over several
    4-GPU trays (TP 8 or TP x DP = 8 on GB200) deploys as a LeaderWorkerSet group of one pod per tray (``recommend
    deploy --format k8s``, Ray across them); the one-pod-per-replica outputs refuse it (``deploy.spec.refuse_multinode``)."""
    if dp == 1 and not ep and weight_block is None:
        return None
    if (dp > 1 or ep) and model.moe is None:
        return f"{model.id} is a dense model: data-parallel attention and expert parallelism are for MoE models"
    if ep and tp * dp == 1:
        return "expert parallelism over one GPU is the plain TP-1 engine"
    try:
        check_layout(model, gpu.id, gpu.interconnect.gpus_per_domain, tp=tp, dp=dp, ep=ep,
                     weight_block=weight_block, checkpoint=checkpoint)
    except ConfigError as e:
        return str(e)
    domain = gpu.interconnect.gpus_per_domain
    if dp > 1 and domain % (tp * dp):
        return (f"tp {tp} x dp {dp} = {tp * dp} GPUs does not divide {gpu.id}'s {domain}-GPU domain: the search plans "
                "engines that pack the domain (recommend estimate explains wider ones)")
    return None


def moe_layouts(model: ModelArch, sizes: tuple[int, ...]) -> tuple[tuple[int, bool], ...]:
    """The (dp, ep) layouts the search adds for a MoE model: EP alone (``dp = 1``) and every DP size of
    ``sizes`` above 1 with and without EP; none for a dense model (its plans stay TP x replicas)."""
    if model.moe is None:
        return ()
    dps = sorted({d for d in sizes if d > 1})
    return ((1, True), *((d, ep) for d in dps for ep in (False, True)))


def mtp_choices(model: ModelArch, tokens: tuple[int, ...] = (1, 2, 3)) -> tuple[int, ...]:
    """The MTP draft-token counts the search adds (the policy's ``mtp_draft_tokens``, default k in {1, 2, 3}
    besides 0) for a model whose config has MTP modules (``num_nextn_predict_layers`` > 0: DeepSeek-V3/R1;
    vLLM reuses the one module for every draft position), none otherwise (its plans stay without speculation)."""
    if model.mtp_layers <= 0:
        return ()
    from recommender.perf.speculative import MAX_SPECULATIVE_TOKENS

    bad = [k for k in tokens if not 1 <= k <= MAX_SPECULATIVE_TOKENS]
    if bad:
        raise ConfigError(f"search policy mtp_draft_tokens {bad[0]}: MTP draft tokens are 1 to {MAX_SPECULATIVE_TOKENS}")
    return tuple(sorted(set(tokens)))


def allowed_gpus(catalog: Catalog, requested: tuple[str, ...] | None, overrides: dict[str, float] | None = None,
                 provider: str | None = None) -> list[Gpu]:
    """GPUs the search may use: the workload's list (validated) or every vLLM-supported GPU with an
    offer (of ``provider`` when given) or a workload price."""
    overrides = overrides or {}
    if requested:
        gpus = [catalog.gpu(g) for g in requested]
    else:
        gpus = [g for g in catalog.gpus.values() if g.vllm_supported]
    priced = [g for g in gpus if restrict(g.offers, provider) or g.id in overrides]
    if requested:
        missing = [g.id for g in gpus if g not in priced]
        if missing:
            whose = f"from provider {provider!r} " if provider else ""
            raise ConfigError(f"no offer {whose}for {', '.join(missing)}: price it with --price {missing[0]}=$X/h (or "
                              f"prices: {{{missing[0]}: \"$X/h\"}} in the workload){' or pick another --provider' if provider else ''}")
    if not priced and provider:
        known = sorted({o.provider for g in gpus for o in g.offers})
        raise ConfigError(f"provider {provider!r} offers none of the allowed GPUs; providers in the catalog: {', '.join(known)}")
    return sorted(priced, key=lambda g: g.id)


def offers_for(gpu: Gpu, overrides: dict[str, float], provider: str | None) -> tuple[Offer, ...]:
    """The offers a run prices ``gpu`` with: the workload's ``prices:`` override (billed per GPU) if any,
    else the catalog offers (of ``provider`` when given)."""
    if gpu.id in overrides:
        return (workload_offer(gpu.id, overrides[gpu.id]),)
    return restrict(gpu.offers, provider)


def node_size(gpu: Gpu, owned: OwnedGpus) -> int:
    """GPUs per owned node: as the user gives it, else the GPU's NVLink domain (8 on HGX), or fewer if they own fewer."""
    return owned.gpus_per_node or min(owned.count, gpu.interconnect.gpus_per_domain)


def inventory_space(catalog: Catalog, inventory: tuple[OwnedGpus, ...], requested: tuple[str, ...] | None, *,
                    limited: bool = True) -> tuple[list[Gpu], dict[str, tuple[Offer, ...]]]:
    """The GPUs and offers of a search on owned GPUs only: each owned type (those of ``requested`` when given)
    with its one ``owned`` offer (``recommender.offers.owned_offer``; ``limited=False``: as many nodes as needed,
    to size a shortfall)."""
    owned = [o for o in inventory if not requested or o.gpu in requested]
    if not owned:
        raise ConfigError(f"--inventory ({', '.join(o.gpu for o in inventory)}) has none of the GPUs asked for "
                          f"({', '.join(requested or ())})")
    gpus = [catalog.gpu(o.gpu) for o in owned]
    offers: dict[str, tuple[Offer, ...]] = {g.id: (owned_offer(o, node_size(g, o), limited=limited),)
                                            for g, o in zip(gpus, owned)}
    return sorted(gpus, key=lambda g: g.id), offers


def inventory_shortfall(inventory: tuple[OwnedGpus, ...], pools: list[tuple[str, int]]) -> dict[str, int]:
    """GPUs missing per type: what ``pools`` ((gpu, GPUs) per pool) use beyond what is owned."""
    need: dict[str, int] = {}
    for gpu, n in pools:
        need[gpu] = need.get(gpu, 0) + n
    have = {o.gpu: o.count for o in inventory}
    return {g: n - have.get(g, 0) for g, n in need.items() if n > have.get(g, 0)}
