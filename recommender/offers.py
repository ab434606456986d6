"""Rental offers and whole-instance rounding.

A GPU is rented as instances: an offer is (provider, GPU, GPUs per instance, USD per instance-hour,
date, source), read from ``offers:`` in ``catalogs/gpus/<id>.yaml``. A plan buys a whole number of
instances, and a TP group never straddles two instances, except on offers sold as slices of one NVLink
domain (GB200 NVL72 trays: ``nvlink_domain_gpus``), where a TP group may span trays of the domain.

Rounding (:func:`rent`), for ``replicas`` TP groups of ``tp`` GPUs on an offer of ``n`` GPUs per instance::

    groups per instance  g = n // tp                      (needs tp <= n)
    instances            i = ceil(replicas / g)
    NVLink-domain slices i = ceil(replicas x tp / n)      (needs tp <= nvlink_domain_gpus)
    replicas held        = i x g  (or floor(i x n / tp))  -- the instances run that many replicas
    usd_per_hour         = i x usd_per_instance_hour

:func:`cheapest_rental` picks, among the offers allowed, the one with the lowest ``usd_per_hour``
(ties: fewer instances, then the lower USD per GPU-hour, then provider name), so each pool of a plan names one offer.
A workload's ``prices:`` override becomes an offer of provider ``workload`` billed per GPU with
instances of one TP group (no rounding beyond the TP group).

Network (:class:`Network`, the offer's ``network:``): the NIC between instances, RDMA (InfiniBand, RoCE,
EFA) or plain Ethernet, in Gb/s per GPU (or per instance, shared by its GPUs), with its dated source. An offer
without one is taken as :data:`UNKNOWN_NETWORK` (10 Gb/s Ethernet per instance) and the plan says so.

KV paths of a P/D pair (:class:`KvPath`): on one instance (:func:`rent_colocated`: both pools' TP groups in
one instance) the KV moves through host memory over the GPUs' host link (``recommender.sizing.Sizer.fabric_path``
says why not NVLink); across instances, over the slower of the two offers' NICs, both pools renting from one
provider (between providers there is only the public internet, which no plan assumes).
GPUs the user owns (``--inventory h100-sxm=16``, :class:`OwnedGpus`) become an offer of provider ``owned``
(:func:`owned_offer`): nodes of ``gpus_per_node`` GPUs as they are, a TP group inside one node, at most
``owned_nodes`` nodes, and billed per GPU in use at the amortised USD per GPU-hour the user gives (1.0 when
none is given, so that the cost counts GPU-hours)::

    groups per node  g = n // tp
    nodes used       i = ceil(replicas / g)            (refused when i > owned_nodes)
    usd_per_hour     = usd_per_gpu_hour x tp x replicas
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from recommender import units
from recommender.errors import CatalogError

#: Provider name of the offers made from a workload's ``prices:`` overrides.
WORKLOAD_PROVIDER = "workload"
#: Provider name of the offers made from the user's own GPUs (``--inventory``).
OWNED_PROVIDER = "owned"

#: NIC kinds that move KV by RDMA (NIXL over UCX / libfabric); anything else is TCP.
RDMA_KINDS = frozenset({"infiniband", "roce", "efa"})
NETWORK_KINDS = RDMA_KINDS | {"ethernet"}
#: What an offer without a ``network:`` is taken to have: 10 Gb/s Ethernet per instance (shared by its GPUs).
UNKNOWN_NIC_GBPS = 10.0
#: The largest NIC a user may state for their own nodes, Gb/s per GPU or per node (above any NIC made).
MAX_NIC_GBPS = 100_000.0


@dataclass(frozen=True)
class Network:
    """The inter-instance NIC of an offer: ``kind`` (infiniband, roce, efa, ethernet) and Gb/s (one direction)
    per GPU (``gbps_per_gpu``) or per instance (``gbps_per_instance``, shared by its GPUs)."""

    kind: str = "ethernet"
    gbps_per_gpu: float = 0.0
    gbps_per_instance: float = UNKNOWN_NIC_GBPS
    source: str = ""
    date: str = ""
    known: bool = False  # False: not given in the catalog (the UNKNOWN_NETWORK default)
    k8s_resource: str = ""  # the Kubernetes device resource of its RDMA NICs (``vpc.amazonaws.com/efa``), if known
    k8s_per_gpu: float = 0.0  # those devices per GPU (a pod of tp GPUs requests ceil(tp x this))

    @property
    def rdma(self) -> bool:
        return self.kind in RDMA_KINDS

    def bytes_per_s_per_gpu(self, gpus_per_instance: int) -> float:
        """One GPU's share of the NIC, bytes/s: ``gbps_per_gpu x 1e9 / 8``, else ``gbps_per_instance / n``."""
        gbps = self.gbps_per_gpu or self.gbps_per_instance / max(gpus_per_instance, 1)
        return gbps * 1e9 / 8.0


UNKNOWN_NETWORK = Network()


@dataclass(frozen=True)
class Offer:
    """One way to rent a GPU: ``gpus_per_instance`` GPUs for ``usd_per_instance_hour``."""

    provider: str
    gpu: str
    gpus_per_instance: int
    usd_per_instance_hour: float
    date: str = ""
    source: str = ""
    sku: str = ""
    nvlink_domain_gpus: int = 0  # > 0: instances are slices of one NVLink domain of that many GPUs
    per_tp_group: bool = False  # True: billed per GPU, an instance is one TP group (workload prices:)
    network: Network = field(default=UNKNOWN_NETWORK)  # the NIC between instances
    fabric_kind: str = ""  # intra-instance fabric when it differs from the GPU's interconnect ("" = the GPU's)
    fabric_bytes_per_s: float = 0.0  # its bandwidth per GPU, one direction (0 = the GPU's)
    owned: bool = False  # the user's own nodes (--inventory): billed per GPU in use, TP group inside one node
    owned_nodes: int = 0  # owned: how many nodes there are (0: no limit, for sizing what a shortfall needs)

    @property
    def usd_per_gpu_hour(self) -> float:
        return self.usd_per_instance_hour / self.gpus_per_instance

    @property
    def nic_bytes_per_s_per_gpu(self) -> float:
        """One GPU's share of the offer's NIC (bytes/s, one direction)."""
        return self.network.bytes_per_s_per_gpu(self.gpus_per_instance)

    def label(self) -> str:
        """``provider 8xGPU`` (or ``provider per-GPU`` for per-GPU billing)."""
        return f"{self.provider} per-GPU" if self.per_tp_group else f"{self.provider} {self.gpus_per_instance}x"


@dataclass(frozen=True)
class Rental:
    """Whole instances of one offer holding ``replicas`` TP groups of ``tp`` GPUs."""

    offer: Offer
    tp: int
    instances: int
    replicas: int  # TP groups the instances hold (>= the replicas asked for); with stages > 1, whole pipelines
    share: float = 1.0  # fraction of the instances billed to this pool (< 1: P and D share one instance)
    stages: int = 1  # TP groups a replica takes: its pipeline stages (recommender.sizing.Sizer.rent_pool)

    @property
    def gpus_billed(self) -> int:
        """GPUs this pool pays for (a shared instance: its share, rounded; owned nodes: the GPUs in use)."""
        if self.offer.per_tp_group or self.offer.owned:
            return self.tp * self.replicas * self.stages
        return round(self.instances * self.offer.gpus_per_instance * self.share)

    @property
    def usd_per_hour(self) -> float:
        if self.offer.per_tp_group or self.offer.owned:
            return self.offer.usd_per_gpu_hour * self.tp * self.replicas * self.stages
        return self.instances * self.offer.usd_per_instance_hour * self.share

    @property
    def shared(self) -> bool:
        return self.share < 1.0


def workload_offer(gpu: str, usd_per_gpu_hour: float) -> Offer:
    """The offer a workload's ``prices: {gpu: "$X/h"}`` stands for (billed per GPU)."""
    return Offer(provider=WORKLOAD_PROVIDER, gpu=gpu, gpus_per_instance=1, usd_per_instance_hour=usd_per_gpu_hour,
                 source="workload prices:", per_tp_group=True)


@dataclass(frozen=True)
class OwnedGpus:
    """GPUs of one type the user owns: ``count`` GPUs in nodes of ``gpus_per_node`` (0: the GPU's NVLink
    domain, or ``count`` when smaller), at an amortised ``usd_per_gpu_hour`` (None: cost counts GPU-hours)."""

    gpu: str
    count: int
    usd_per_gpu_hour: float | None = None
    gpus_per_node: int = 0
    network: Network = field(default=UNKNOWN_NETWORK)  # between the nodes (pipeline stages need a known one)

    def label(self) -> str:
        price = f" at ${self.usd_per_gpu_hour:g}/GPU-h" if self.usd_per_gpu_hour is not None else ""
        return f"{self.count} x {self.gpu}{price}"


def owned_offer(owned: OwnedGpus, gpus_per_node: int, *, limited: bool = True) -> Offer:
    """The offer ``owned`` stands for: nodes of ``gpus_per_node`` GPUs, ``count // gpus_per_node`` of them
    (no limit with ``limited=False``), billed per GPU in use at the amortised price (1.0 without one)."""
    if gpus_per_node < 1 or owned.count < 1 or owned.count % gpus_per_node:
        raise CatalogError(f"inventory {owned.gpu}={owned.count}: not whole nodes of {gpus_per_node} GPUs; give "
                           f"gpus_per_node in the workload's inventory: (e.g. {{{owned.gpu}: {{gpus: {owned.count}, "
                           f"gpus_per_node: {math.gcd(owned.count, gpus_per_node)}}}}})")
    price = 1.0 if owned.usd_per_gpu_hour is None else owned.usd_per_gpu_hour
    return Offer(provider=OWNED_PROVIDER, gpu=owned.gpu, gpus_per_instance=gpus_per_node,
                 usd_per_instance_hour=price * gpus_per_node, source="--inventory (amortised $/GPU-hour)"
                 if owned.usd_per_gpu_hour is not None else "--inventory (no price: 1 per GPU-hour)",
                 owned=True, owned_nodes=owned.count // gpus_per_node if limited else 0, network=owned.network)


def parse_inventory(text: str, what: str = "--inventory") -> tuple[OwnedGpus, ...]:
    """``h100-sxm=16,a100-80gb=8@$1.20/h`` -> OwnedGpus per entry (GPU names as given; the caller resolves them)."""
    from recommender.units import parse_usd_per_hour

    out: list[OwnedGpus] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, eq, rest = part.partition("=")
        count_text, at, price_text = rest.partition("@")
        if not eq or not name.strip() or not count_text.strip().isdigit() or int(count_text) < 1:
            raise CatalogError(f"{what} {part!r}: give GPU=COUNT[@$PRICE/h], e.g. h100-sxm=16 or h100-sxm=16@$2.10/h")
        price = parse_usd_per_hour(price_text, f"{what} {part}") if at else None
        if price is not None and not (math.isfinite(price) and price > 0):
            raise CatalogError(f"{what} {part!r}: the amortised price must be above $0 per GPU-hour")
        out.append(OwnedGpus(gpu=name.strip(), count=int(count_text), usd_per_gpu_hour=price))
    if not out:
        raise CatalogError(f"{what}: give GPU=COUNT entries, e.g. h100-sxm=16,a100-80gb=8")
    return tuple(out)


def parse_network_flag(text: str, what: str = "--inventory-network") -> Network:
    """``infiniband=400`` (also ``400Gb/s``, ``400G``): the NIC per GPU between the user's nodes, Gb/s one direction.
    Kind and figure only, bounded (at most ``MAX_NIC_GBPS``), as the workload's ``inventory: {gpu: {network: ...}}``."""
    kind, eq, gbps_text = text.strip().partition("=")
    number = gbps_text.strip().lower().removesuffix("gb/s").removesuffix("g").strip()
    try:
        gbps = float(number)
    except ValueError:
        gbps = math.nan
    if not eq or kind.strip().lower() not in NETWORK_KINDS or not (math.isfinite(gbps) and 0 < gbps <= MAX_NIC_GBPS):
        raise CatalogError(f"{what} {text[:80]!r}: give KIND=GBPS per GPU, KIND one of {', '.join(sorted(NETWORK_KINDS))} "
                           f"and GBPS above 0 and at most {MAX_NIC_GBPS:g}, e.g. infiniband=400")
    return Network(kind=kind.strip().lower(), gbps_per_gpu=gbps, gbps_per_instance=0.0, source=what, known=True)


def fits(offer: Offer, tp: int) -> bool:
    """Whether a TP group of ``tp`` GPUs stays inside one instance (or one NVLink domain) of ``offer``."""
    if offer.per_tp_group:
        return True
    if offer.nvlink_domain_gpus:
        return tp <= offer.nvlink_domain_gpus and (tp % offer.gpus_per_instance == 0 or offer.gpus_per_instance % tp == 0)
    return tp <= offer.gpus_per_instance


def multinode_offers(offers: Iterable[Offer], tp: int) -> tuple[Offer, ...]:
    """The offers a pipeline-parallel replica may span: a stage (TP group of ``tp``) fits one instance, and the
    offer names its NIC (stages talk over it every step; an assumed 10 Gb/s is no basis for a multi-node plan)."""
    return tuple(o for o in offers if o.network.known and fits(o, tp) and not o.per_tp_group)


def slowest_stage_nic_bytes_per_s_per_gpu(offers: Iterable[Offer], tp: int) -> float | None:
    """The NIC per GPU (bytes/s) a pipeline's stage hops are priced at: the slowest of :func:`multinode_offers`;
    None when no offer names one."""
    nics = [o.nic_bytes_per_s_per_gpu for o in multinode_offers(offers, tp)]
    return min(nics) if nics else None


def rent(offer: Offer, tp: int, replicas: int) -> Rental | None:
    """Fewest whole instances of ``offer`` holding ``replicas`` TP groups; None if a group cannot fit."""
    if replicas < 1 or tp < 1 or not fits(offer, tp):
        return None
    if offer.per_tp_group:
        return Rental(offer, tp, replicas, replicas)
    n = offer.gpus_per_instance
    if offer.owned:  # the user's nodes: as many as the groups need, within the inventory; nothing rounded up
        nodes = math.ceil(replicas / (n // tp))
        return None if offer.owned_nodes and nodes > offer.owned_nodes else Rental(offer, tp, nodes, replicas)
    if offer.nvlink_domain_gpus and tp > n:
        instances = math.ceil(replicas * tp / n)
        return Rental(offer, tp, instances, instances * n // tp)
    groups = n // tp
    instances = math.ceil(replicas / groups)
    return Rental(offer, tp, instances, instances * groups)


def rent_colocated(offer: Offer, groups: Sequence[tuple[int, int]]) -> tuple[int, int] | None:
    """One instance of ``offer`` holding every ``(tp, replicas)`` group TOGETHER: ``(1, its GPUs)``, or None
    when they do not fit one (per-GPU billing has no instance to share; an NVLink-domain slice is one host,
    so P and D share one slice, not the domain).

    The TP sizes are powers of two dividing the instance size, so packing succeeds whenever
    ``sum(tp x replicas) <= n`` (n: GPUs per instance)."""
    if offer.per_tp_group or not groups:
        return None
    used = sum(tp * r for tp, r in groups)
    n = offer.gpus_per_instance
    if used > n or any(tp > n or n % tp for tp, _ in groups):
        return None
    return 1, n


@dataclass(frozen=True)
class KvPath:
    """Where a P/D pair's KV moves: ``kind`` (the GPUs' host link such as pcie5 when ``same_instance``,
    or an offer's ``fabric:``; else the NIC kind) at ``bytes_per_s_per_gpu`` (one direction; a transfer runs on
    ``min(tp_p, tp_d)`` GPUs in parallel). ``known``: False when the NIC was not in the catalog."""

    kind: str
    bytes_per_s_per_gpu: float
    same_instance: bool = False
    known: bool = True
    provider: str = ""

    @property
    def rdma(self) -> bool:
        return not self.same_instance and self.kind in RDMA_KINDS

    def label(self, gpus: int = 1) -> str:
        """``pcie5 64 GB/s (same instance, via host memory)`` or ``roce 400 Gb/s`` / ``ethernet 10 Gb/s
        (assumed...)``: the bandwidth one transfer gets on ``gpus`` GPUs."""
        bw = self.bytes_per_s_per_gpu * max(gpus, 1)
        if self.same_instance:
            return f"{self.kind} {bw / 1e9:,.0f} GB/s (same instance, via host memory)"
        gbps = bw * 8 / 1e9
        text = f"{self.kind} {gbps:,.0f} Gb/s" if gbps >= 10 else f"{self.kind} {gbps:,.2g} Gb/s"
        return text if self.known else f"{text} (assumed: no NIC figure for the offer)"


def cheapest_rental(offers: Iterable[Offer], tp: int, replicas: int) -> Rental | None:
    """The cheapest :func:`rent` over ``offers`` (ties: see :func:`_rank`)."""
    best: Rental | None = None
    for o in offers:
        r = rent(o, tp, replicas)
        if r is None:
            continue
        if best is None or _rank(r) < _rank(best):
            best = r
    return best


def _rank(r: Rental) -> tuple[float, int, float, str]:
    """Cheapest first; at equal cost fewer instances (fewer machines to run), then provider name."""
    return (round(r.usd_per_hour, 9), r.instances, r.offer.usd_per_gpu_hour, r.offer.provider)


def offers_from_doc(gpu: str, entries: Sequence[Mapping[str, Any]] | None, where: str = "") -> tuple[Offer, ...]:
    """Parse ``offers:`` of one GPU catalog entry. ``gpus_per_instance`` may be a list (one offer per
    size, at ``usd_per_gpu_hour`` x size); exactly one of ``usd_per_gpu_hour`` / ``usd_per_instance_hour``."""
    out: list[Offer] = []
    for i, e in enumerate(entries or ()):
        at = f"{where} offers[{i}]"
        try:
            sizes = e["gpus_per_instance"]
            sizes = [int(s) for s in (sizes if isinstance(sizes, list) else [sizes])]
            per_gpu, per_inst = e.get("usd_per_gpu_hour"), e.get("usd_per_instance_hour")
            if (per_gpu is None) == (per_inst is None):
                raise CatalogError(f"{at}: give exactly one of usd_per_gpu_hour, usd_per_instance_hour")
            if per_inst is not None and len(sizes) != 1:
                raise CatalogError(f"{at}: usd_per_instance_hour needs a single gpus_per_instance")
            for n in sizes:
                price = float(per_gpu) * n if per_gpu is not None else float(per_inst or 0.0)
                if n < 1 or not math.isfinite(price) or price <= 0:
                    raise CatalogError(f"{at}: gpus_per_instance and the price must be positive")
                fab = e.get("fabric") or {}
                out.append(Offer(provider=str(e["provider"]).lower(), gpu=gpu, gpus_per_instance=n, usd_per_instance_hour=price,
                                 date=str(e.get("date", "")), source=str(e.get("source", "")), sku=str(e.get("sku", "")),
                                 nvlink_domain_gpus=int(e.get("nvlink_domain_gpus") or 0),
                                 network=network_from_doc(e.get("network"), at),
                                 fabric_kind=str(fab.get("kind", "")),
                                 fabric_bytes_per_s=units.parse_bandwidth(fab["bandwidth"], f"{at} fabric.bandwidth")
                                 if fab.get("bandwidth") else 0.0))
        except (KeyError, TypeError, ValueError) as err:
            raise CatalogError(f"{at}: missing or bad field {err}") from None
    return tuple(out)


def network_from_doc(doc: Mapping[str, Any] | None, at: str = "") -> Network:
    """``network: {kind, gbps_per_gpu | gbps_per_instance, source, date}`` -> :class:`Network`;
    absent -> :data:`UNKNOWN_NETWORK`."""
    if not doc:
        return UNKNOWN_NETWORK
    kind = str(doc.get("kind", "")).lower()
    if kind not in NETWORK_KINDS:
        raise CatalogError(f"{at} network.kind {kind!r}: use one of {', '.join(sorted(NETWORK_KINDS))}")
    per_gpu, per_inst = float(doc.get("gbps_per_gpu") or 0.0), float(doc.get("gbps_per_instance") or 0.0)
    if (per_gpu > 0) == (per_inst > 0) or not math.isfinite(per_gpu + per_inst):
        raise CatalogError(f"{at} network: give exactly one positive gbps_per_gpu or gbps_per_instance")
    k8s = doc.get("k8s") or {}
    return Network(kind=kind, gbps_per_gpu=per_gpu, gbps_per_instance=per_inst, source=str(doc.get("source", "")),
                   date=str(doc.get("date", "")), known=True, k8s_resource=str(k8s.get("resource", "")),
                   k8s_per_gpu=float(k8s.get("per_gpu") or 0.0))


def restrict(offers: Iterable[Offer], provider: str | None) -> tuple[Offer, ...]:
    """Offers of ``provider`` only (case-insensitive); all of them when ``provider`` is None."""
    if provider is None:
        return tuple(offers)
    p = provider.strip().lower()
    return tuple(o for o in offers if o.provider == p)
