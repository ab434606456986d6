"""``recommend models`` / ``recommend gpus``: the catalog as a table or JSON (pure string producers)."""

from __future__ import annotations

import json
from typing import Any

from recommender.catalog import Catalog
from recommender.offers import multinode_offers
from recommender.render.table import fit_table, wrap_text
from recommender.units import fmt_bytes

_FLOPS_DTYPES = ("bf16", "fp8", "int8", "fp4")


def model_records(cat: Catalog) -> list[dict[str, Any]]:
    """One dict per catalog model: id, HF repo, aliases, parameter counts, context length (tokens)."""
    out = []
    for mid in sorted(cat.models):
        m = cat.models[mid]
        out.append({"id": mid, "hf_repo": m.hf_repo, "aliases": list((cat.model_meta.get(mid) or {}).get("aliases") or []),
                    "total_params": m.total_params, "active_params": m.active_params, "moe": m.is_moe,
                    "max_context_tokens": m.max_position_embeddings, "checkpoint_dtype": m.checkpoint_dtype})
    return out


def gpu_records(cat: Catalog) -> list[dict[str, Any]]:
    """One dict per catalog GPU: memory (B), HBM bandwidth (B/s), dense peak per dtype (FLOP/s), fabric, price."""
    out = []
    for gid in sorted(cat.gpus):
        g = cat.gpus[gid]
        ic = g.interconnect
        out.append({"id": gid, "name": g.name, "vendor": g.vendor, "aliases": list(g.aliases),
                    "memory_bytes": g.memory_bytes, "hbm_bandwidth_bytes_per_s": g.hbm_bandwidth_bytes_per_s,
                    "dense_flops_per_s": dict(g.dense_flops_per_s),
                    "interconnect": {"kind": ic.kind, "bandwidth_bytes_per_s": ic.bandwidth_bytes_per_s,
                                     "gpus_per_domain": ic.gpus_per_domain},
                    "usd_per_gpu_hour": g.usd_per_gpu_hour,
                    "cheapest_offer": None if g.cheapest_offer is None else {
                        "provider": g.cheapest_offer.provider, "gpus_per_instance": g.cheapest_offer.gpus_per_instance,
                        "date": g.cheapest_offer.date, "source": g.cheapest_offer.source},
                    "offers": len(g.offers), "arch": g.arch,
                    "vllm_supported": g.vllm_supported, "multinode": _multinode(g.offers)})
    return out


def _multinode(offers: Any) -> dict[str, Any] | None:
    """The offers whose NIC between instances the catalog names (pipeline stages over nodes rent only these):
    how many, their providers, and the slowest NIC per GPU (Gb/s, what a pipeline is priced at); None without."""
    named = multinode_offers(offers, 1)  # every instance holds a 1-GPU stage: the filter is the NIC alone
    if not named:
        return None
    slowest = min(o.nic_bytes_per_s_per_gpu for o in named)
    return {"offers": len(named), "providers": sorted({o.provider for o in named}),
            "slowest_nic_gbps_per_gpu": round(slowest * 8 / 1e9, 3)}


def _params(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n < 100e9 else f"{n / 1e9:.0f}B"


def _tokens(n: int) -> str:
    """131072 -> '128K' (K = 1024 tokens, as model cards state context lengths)."""
    return f"{n // 1024}K" if n % 1024 == 0 else f"{n:,}"


def render_models(cat: Catalog, *, fmt: str = "table", width: int | None = None) -> str:
    recs = model_records(cat)
    if fmt == "json":
        return json.dumps(recs, indent=2)
    rows = [[r["id"], r["hf_repo"],
             _params(r["total_params"]) + (f"/{_params(r['active_params'])}" if r["moe"] else ""),
             _tokens(r["max_context_tokens"]), r["checkpoint_dtype"], ", ".join(r["aliases"])] for r in recs]
    text, _ = fit_table(["id", "Hugging Face repo", "params", "context", "dtype", "aliases"], rows, width=width,
                        drop_order=["aliases", "dtype"])
    return text + "\n\n" + wrap_text("params: total/active for MoE models. Any id, Hugging Face repo or alias works as --model (any case), "
                                     "as does a path to a config.json.", width)


def render_gpus(cat: Catalog, *, fmt: str = "table", width: int | None = None) -> str:
    recs = gpu_records(cat)
    if fmt == "json":
        return json.dumps(recs, indent=2)
    rows = []
    for r in recs:
        peak = "/".join(f"{r['dense_flops_per_s'][d] / 1e12:,.0f}" if d in r["dense_flops_per_s"] else "-"
                        for d in _FLOPS_DTYPES)
        ic = r["interconnect"]
        price = "-" if r["usd_per_gpu_hour"] is None else f"{r['usd_per_gpu_hour']:.2f}"
        mn = r["multinode"]
        nic = "-" if mn is None else f"{mn['slowest_nic_gbps_per_gpu']:g} Gb/s ({mn['offers']})"
        rows.append([r["id"], fmt_bytes(r["memory_bytes"]), f"{r['hbm_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s", peak,
                     f"{ic['kind']} {fmt_bytes(ic['bandwidth_bytes_per_s'])}/s x{ic['gpus_per_domain']}", price, nic,
                     ", ".join(r["aliases"])])
    hdr = ["id", "memory", "HBM", "TFLOP/s " + "/".join(_FLOPS_DTYPES), "interconnect", "$/GPU-h", "multi-node NIC",
           "aliases"]
    text, _ = fit_table(hdr, rows, width=width, drop_order=["aliases", "multi-node NIC", "interconnect"])
    return text + "\n\n" + wrap_text(
        "TFLOP/s are dense (no sparsity); '-' = no tensor-core path for that dtype. "
        "$/GPU-h is the cheapest dated offer in the catalog (offers: per provider and instance size; "
        "--provider restricts, prices: in a workload overrides). Multi-node NIC: the slowest NIC per GPU of the offers "
        "whose NIC between instances the catalog names (how many): only these run a model no instance holds in "
        "pipeline stages; '-' = none (owned nodes: state it in the inventory).\n"
        "Any id, alias or datasheet name works as --gpu / --gpus (any case, vendor prefix optional).", width)
