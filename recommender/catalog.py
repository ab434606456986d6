"""Typed registry over the YAML catalogs (``catalogs/gpus/*.yaml``, ``catalogs/models/*.yaml``).

Adding a GPU or a model is one YAML file. Unknown ids raise :class:`CatalogError` listing the valid
ones; a duplicate id raises too. Strings with units ("80 GB", "3.35 TB/s") are converted here, once.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from recommender import units
from recommender.dtypes import KV_DTYPES, WEIGHT_DTYPES, native_weight_dtype
from recommender.errors import CatalogError, UnsupportedArchitectureError
from recommender.hf_config import ModelArch, arch_from_config, load_config_file, weight_block_size
from recommender.kernels import UNKNOWN_ARCH, ArchSupport, load_kernel_support
from recommender.offers import Offer, offers_from_doc
from recommender.shipped import shipped_dir

__all__ = ["KV_DTYPES", "WEIGHT_DTYPES", "Catalog", "Gpu", "Interconnect", "default_catalog", "load_catalog"]


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def catalog_dir() -> Path:
    """``$RECOMMENDER_CATALOGS``, else the shipped ``catalogs/`` folder (the installed package's copy, or the
    source checkout's; :func:`recommender.shipped.shipped_dir`), whatever the working folder."""
    env = os.environ.get("RECOMMENDER_CATALOGS")
    return Path(env) if env else shipped_dir("catalogs")


@dataclass(frozen=True)
class Interconnect:
    """Scale-up fabric: ``bandwidth_bytes_per_s`` is one direction per GPU (aggregate over links).

    ``peer_bandwidth_bytes_per_s`` is set for point-to-point meshes (AMD xGMI) where one peer pair
    gets one link only; a ring over n GPUs then gets ``min(aggregate, peer x (n-1))``.
    """

    kind: str
    bandwidth_bytes_per_s: float
    gpus_per_domain: int
    peer_bandwidth_bytes_per_s: float | None = None
    host_kind: str = "pcie4"  # the GPU's link to host memory (``host_link:``), one direction
    host_bandwidth_bytes_per_s: float = 32e9
    #: measured all-reduce bus bandwidth (nccl-tests / rccl-tests ``busbw``, large messages) over the whole
    #: domain, and for point-to-point meshes per peer link; None where no measurement is catalogued
    allreduce_busbw_bytes_per_s: float | None = None
    allreduce_peer_busbw_bytes_per_s: float | None = None

    def allreduce_bus_bytes_per_s(self, tp: int) -> float | None:
        """Measured all-reduce bus bandwidth over ``tp`` GPUs: ``busbw``, on a mesh at most ``peer_busbw x (tp - 1)``
        (each GPU reaches its ring neighbours over ``tp - 1`` links); None without a measurement."""
        if self.allreduce_busbw_bytes_per_s is None:
            return None
        if self.allreduce_peer_busbw_bytes_per_s is None or tp <= 1:
            return self.allreduce_busbw_bytes_per_s
        return min(self.allreduce_busbw_bytes_per_s, self.allreduce_peer_busbw_bytes_per_s * (tp - 1))

    def ring_bandwidth_bytes_per_s(self, tp: int) -> float:
        """Bandwidth one GPU gets in a ring collective over ``tp`` GPUs."""
        if self.peer_bandwidth_bytes_per_s is None or tp <= 1:
            return self.bandwidth_bytes_per_s
        return min(self.bandwidth_bytes_per_s, self.peer_bandwidth_bytes_per_s * (tp - 1))

    @property
    def is_pcie(self) -> bool:
        return self.kind.startswith("pcie")


@dataclass(frozen=True)
class Gpu:
    """One accelerator's datasheet figures (dense, no sparsity) and default price."""

    id: str
    name: str
    vendor: str
    memory_bytes: float
    hbm_bandwidth_bytes_per_s: float
    dense_flops_per_s: Mapping[str, float]
    interconnect: Interconnect
    offers: tuple[Offer, ...] = ()  # ways to rent it (catalog offers:); see recommender.offers
    vllm_supported: bool = True
    k8s_resource: str = "nvidia.com/gpu"
    arch: str = ""
    kernels: ArchSupport = UNKNOWN_ARCH  # this GPU's row of catalogs/kernel-support.yaml
    node_labels: tuple[tuple[str, str], ...] = ()  # Kubernetes node label (key, value) pairs naming this GPU model
    aliases: tuple[str, ...] = ()
    gke_accelerators: tuple[str, ...] = ()  # GKE's cloud.google.com/gke-accelerator values for this GPU (k8s.gke_accelerator)
    #: GPUs one Kubernetes node holds where that is fewer than the NVLink domain (k8s.gpus_per_node: a GB200 / GB300
    #: NVL72 compute tray, 4); 0 = a node holds the whole domain. An engine wider than a node spans nodes of the domain.
    k8s_gpus_per_node: int = 0

    def k8s_nodes(self, engine_gpus: int) -> int:
        """Kubernetes nodes one engine of ``engine_gpus`` GPUs (one pipeline stage) takes (:func:`k8s_nodes`)."""
        return k8s_nodes(engine_gpus, self.k8s_gpus_per_node)

    def flops_per_s(self, dtype: str) -> float:
        """Dense tensor throughput for a compute dtype; int4/mxfp4 weight-only run at 16-bit."""
        d = {"fp16": "bf16", "int4": "bf16", "mxfp4": "bf16"}.get(dtype, dtype)
        if d == "fp4" and "fp4" not in self.dense_flops_per_s:
            d = "bf16"
        return self.dense_flops_per_s.get(d) or self.dense_flops_per_s["bf16"]

    def supports_dtype(self, dtype: str) -> bool:
        """Whether vLLM 0.33 runs this weight dtype on the GPU (the kernel-support table)."""
        return self.kernels.runs_weights(dtype)

    def why_unsupported(self, weight_dtype: str, kv_dtype: str | None = None) -> str | None:
        """None when vLLM 0.33 runs the combination here, else a one-line reason."""
        return self.kernels.why_not(self.id, weight_dtype=weight_dtype, kv_dtype=kv_dtype)

    @property
    def cheapest_offer(self) -> Offer | None:
        """The offer with the lowest USD per GPU-hour (ties: provider name), or None when unpriced."""
        return min(self.offers, key=lambda o: (o.usd_per_gpu_hour, o.provider, o.gpus_per_instance), default=None)

    @property
    def usd_per_gpu_hour(self) -> float | None:
        """USD per GPU-hour of :attr:`cheapest_offer` (what ``estimate`` charges by default)."""
        o = self.cheapest_offer
        return None if o is None else o.usd_per_gpu_hour

    @property
    def quantized_checkpoints(self) -> tuple[str, ...]:
        """Non-16-bit weight dtypes with a kernel on this GPU."""
        return tuple(d for d in self.kernels.weight_kernels if d not in ("bf16", "fp16"))


def name_key(name: str) -> str:
    """Normalised spelling used to match user names: lower case, only letters, digits and dots.

    'H100 80GB HBM3' -> 'h10080gbhbm3', 'h100-sxm' -> 'h100sxm', 'MI300X' -> 'mi300x'.
    """
    return re.sub(r"[^a-z0-9.]+", "", name.strip().lower())


def _index(entries: Iterable[tuple[str, Iterable[str]]]) -> dict[str, tuple[str, ...]]:
    """name_key(spelling) -> the catalog ids it names. An id always names only itself; an alias or
    datasheet name shared by two entries names both (the lookup then says it is ambiguous)."""
    ids: dict[str, tuple[str, ...]] = {}
    others: dict[str, tuple[str, ...]] = {}
    for cid, names in entries:
        ids[name_key(cid)] = (cid,)
        for n in names:
            k = name_key(n)
            if k and cid not in others.get(k, ()):
                others[k] = (*others.get(k, ()), cid)
    return {**{k: v for k, v in others.items() if k}, **ids}


def _lookup(index: Mapping[str, tuple[str, ...]], keys: Iterable[str], name: str, kind: str) -> str | None:
    if not name.isprintable():  # NUL, bidi overrides, zero-width spaces: name_key would drop them and match
        raise CatalogError(f"{kind} name {name!r} contains control or invisible characters; type the name plainly")
    for k in keys:
        hits = index.get(k)
        if hits and len(hits) > 1:
            raise CatalogError(f"{kind} name {name!r} is ambiguous: it names {', '.join(hits)}; use one of those ids")
        if hits:
            return hits[0]
    return None


@dataclass(frozen=True)
class Catalog:
    """All GPUs and models by id, and the one resolver from the names users have to catalog ids."""

    gpus: Mapping[str, Gpu]
    models: Mapping[str, ModelArch]
    model_meta: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @functools.cached_property
    def _gpu_names(self) -> dict[str, tuple[str, ...]]:
        return _index((g.id, (g.name, *g.aliases)) for g in self.gpus.values())

    def _repos(self, mid: str) -> tuple[str, ...]:
        """The Hugging Face repo ids of one architecture: the entry's ``hf_repo``, then its ``aliases``."""
        meta = self.model_meta.get(mid) or {}
        return tuple(r for r in (self.models[mid].hf_repo, *(str(a) for a in meta.get("aliases") or ())) if r)

    @functools.cached_property
    def _model_names(self) -> dict[str, tuple[str, ...]]:
        def names(mid: str) -> tuple[str, ...]:
            repos = self._repos(mid)
            # a repo id also answers to its name without the organisation ('Llama-3.3-70B-Instruct', as users type it)
            return (*repos, *(r.rsplit("/", 1)[-1] for r in repos if "/" in r))

        return _index((mid, names(mid)) for mid in self.models)

    def named_repo(self, mid: str, name: str) -> str | None:
        """The repo id of catalog model ``mid`` that ``name`` spells (with or without its organisation, any case),
        None where ``name`` is the catalog id or no repo of it: 'deepseek-r1' -> 'deepseek-ai/DeepSeek-R1'."""
        key = name_key(name)
        for repo in self._repos(mid):
            if key in (name_key(repo), name_key(repo.rsplit("/", 1)[-1])) and key != name_key(mid):
                return repo
        return None

    @functools.cached_property
    def _checkpoint_blocks(self) -> dict[str, tuple[int, int]]:
        """Lower-cased repo id -> ``weight_block_size``: every model entry's ``checkpoint_weight_blocks`` (its
        pre-quantized releases), and each entry's own repos where its config is block-quantized (DeepSeek-V3/R1)."""
        out: dict[str, tuple[int, int]] = {}
        for mid, arch in self.models.items():
            if arch.weight_block is not None:
                out.update({r.lower(): arch.weight_block for r in self._repos(mid)})
            out.update(checkpoint_blocks_of(self.model_meta.get(mid) or {}, mid))
        return out

    def checkpoint_block(self, repo: str) -> tuple[int, int] | None:
        """``(block_n, block_k)`` of a Hugging Face checkpoint the catalog knows to be block-quantized (its
        config.json's ``quantization_config.weight_block_size``), None otherwise (any case)."""
        return self._checkpoint_blocks.get(repo.strip().lower())

    def default_checkpoint(self, model: ModelArch, weight_dtype: str) -> str:
        """The checkpoint vLLM loads for ``model`` at ``weight_dtype`` where none is named: the model catalog's
        ``quantized_checkpoints`` entry for a dtype other than the model's own, else "" (the model's own repo, at
        its own dtype or quantized online at load)."""
        if weight_dtype == native_weight_dtype(model.checkpoint_dtype):
            return ""
        quantized = (self.model_meta.get(model.id) or {}).get("quantized_checkpoints") or {}
        return str(quantized.get(weight_dtype) or "") if isinstance(quantized, Mapping) else ""

    def weight_block_for(self, model: ModelArch, weight_dtype: str,
                         checkpoint: str | None = None) -> tuple[str, tuple[int, int]] | None:
        """The checkpoint vLLM loads for ``model`` at ``weight_dtype`` and its block size, where it is block-quantized:
        ``checkpoint`` when given ("" = none: the model's own repo, or quantized online at load), else the model
        catalog's ``quantized_checkpoints`` entry for a dtype other than the model's own; the model's own checkpoint
        (``hf_repo``) at its own dtype. None where the weights vLLM loads are not block-quantized (online fp8 is
        per tensor) or the checkpoint is unknown."""
        native = native_weight_dtype(model.checkpoint_dtype)
        if checkpoint is None:
            checkpoint = self.default_checkpoint(model, weight_dtype)
        if checkpoint:
            block = self.checkpoint_block(checkpoint)
            return None if block is None else (checkpoint, block)
        if weight_dtype == native and model.weight_block is not None:
            return model.hf_repo or model.id, model.weight_block
        return None

    def gpu_id(self, name: str) -> str:
        """Catalog id for a GPU name: its id, its datasheet name or an alias, any case or punctuation.

        'h100' -> 'h100-sxm', 'NVIDIA H100 80GB HBM3' (what nvidia-smi prints) -> 'h100-sxm', 'MI300X' -> 'mi300x'.
        A leading vendor word (NVIDIA, AMD, AMD Instinct) is optional.
        """
        key = name_key(name)
        cid = _lookup(self._gpu_names, (key, re.sub(r"^(nvidia|amd)(instinct)?", "", key)), name, "GPU")
        if cid is None:
            raise CatalogError(f"unknown GPU {name!r}{_did_you_mean(name, self._gpu_names)}; valid GPUs: "
                               f"{', '.join(sorted(self.gpus))} (`recommend gpus` lists them with their aliases)")
        return cid

    def gpu(self, gpu_id: str) -> Gpu:
        """The GPU for an id or alias (see :meth:`gpu_id`)."""
        return self.gpus[self.gpu_id(gpu_id)]

    def model_id(self, name: str) -> str | None:
        """Catalog id for a model id, Hugging Face repo id or alias (any case); None if none matches."""
        return _lookup(self._model_names, (name_key(name),), name, "model")

    def model(self, name: str) -> ModelArch:
        """A catalog id, a Hugging Face repo id the catalog knows (e.g. meta-llama/Llama-3.1-8B-Instruct),
        an alias, or a path to a Hugging Face ``config.json`` (or a folder holding one)."""
        cid = self.model_id(name)
        if cid is not None:
            # a name that spells one of the entry's checkpoints (an alias: a chat or reasoning release of the same
            # architecture) is the checkpoint the plan deploys, not the entry's default repo
            repo = self.named_repo(cid, name)
            arch = self.models[cid]
            return arch if repo is None or repo == arch.hf_repo else dataclasses.replace(arch, hf_repo=repo)
        if name.endswith(".json") or Path(name).exists():
            return load_config_file(name)
        hint = _did_you_mean(name, self._model_names)
        if "/" in name:
            raise CatalogError(f"model {name!r} is not in the catalog{hint} and no file of that name exists; "
                               "download its config.json and pass its path (nothing is fetched at run time), "
                               "or see `recommend models`")
        raise CatalogError(f"unknown model {name!r}{hint}; valid models: {', '.join(sorted(self.models))} "
                           "(`recommend models` lists their Hugging Face ids; or pass a path to a config.json)")


def _did_you_mean(name: str, index: Mapping[str, tuple[str, ...]]) -> str:
    close = difflib.get_close_matches(name_key(name), list(index), n=3, cutoff=0.6)
    ids = list(dict.fromkeys(i for c in close for i in index[c]))
    return f" (did you mean {', '.join(ids)}?)" if ids else ""


def checkpoint_blocks_of(doc: Mapping[str, Any], where: str) -> dict[str, tuple[int, int]]:
    """A model entry's ``checkpoint_weight_blocks: {repo: [block_n, block_k]}`` (lower-cased repo keys); CatalogError
    on a malformed one."""
    raw = doc.get("checkpoint_weight_blocks") or {}
    if not isinstance(raw, Mapping):
        raise CatalogError(f"model catalog entry {where}: checkpoint_weight_blocks must map repo ids to [block_n, block_k]")
    out: dict[str, tuple[int, int]] = {}
    for repo, block in raw.items():
        try:
            parsed = weight_block_size(block, f"model catalog entry {where}: checkpoint_weight_blocks[{repo!r}]")
        except UnsupportedArchitectureError as e:
            raise CatalogError(str(e)) from None
        if parsed is not None:
            out[str(repo).strip().lower()] = parsed
    return out


def _load_yaml(path: Path) -> dict[str, Any]:
    try:
        doc = yaml.load(path.read_text(), Loader=_LOADER)  # safe loader (libyaml's when available)
    except yaml.YAMLError as e:
        raise CatalogError(f"catalog file {path} is not valid YAML: {e}") from None
    if not isinstance(doc, dict) or "id" not in doc:
        raise CatalogError(f"catalog file {path} must be a mapping with an 'id'")
    return doc


def gpu_from_doc(doc: Mapping[str, Any], where: str = "", kernels: Mapping[str, ArchSupport] | None = None) -> Gpu:
    """Parse one GPU catalog entry (units converted here); ``kernels`` is the kernel-support table
    (default: the shipped one) that ``vllm.arch`` names a row of."""
    table = default_kernel_support() if kernels is None else kernels
    try:
        ic = doc["interconnect"]
        vllm = doc.get("vllm") or {}
        peer = ic.get("peer_bandwidth")
        arch = str(vllm.get("arch", "")).lower()
        if arch and arch not in table:
            raise CatalogError(f"GPU catalog entry {where or doc.get('id')}: vllm.arch {arch!r} is not in "
                               f"kernel-support.yaml ({', '.join(sorted(table)) or 'none'})")
        return Gpu(
            id=str(doc["id"]).lower(),
            name=str(doc.get("name", doc["id"])),
            vendor=str(doc.get("vendor", "nvidia")).lower(),
            # what the driver reports (nvidia-smi memory.total) where the catalog has it: the total that
            # vLLM's --gpu-memory-utilization and SGLang's --mem-fraction-static are fractions of
            memory_bytes=units.parse_bytes(doc.get("device_memory") or doc["memory"], f"{where} memory"),
            hbm_bandwidth_bytes_per_s=units.parse_bandwidth(doc["hbm_bandwidth"], f"{where} hbm_bandwidth"),
            dense_flops_per_s={str(k): float(v) * 1e12 for k, v in doc["dense_tflops"].items() if v is not None},
            interconnect=Interconnect(
                kind=str(ic["kind"]),
                bandwidth_bytes_per_s=units.parse_bandwidth(ic["bandwidth"], f"{where} interconnect.bandwidth"),
                gpus_per_domain=int(ic["gpus_per_domain"]),
                peer_bandwidth_bytes_per_s=units.parse_bandwidth(peer) if peer else None,
                **_host_link(ic.get("host_link"), where),
                allreduce_busbw_bytes_per_s=(units.parse_bandwidth(ic["allreduce_busbw"], f"{where} interconnect.allreduce_busbw")
                                             if ic.get("allreduce_busbw") else None),
                allreduce_peer_busbw_bytes_per_s=(units.parse_bandwidth(ic["allreduce_peer_busbw"],
                                                                        f"{where} interconnect.allreduce_peer_busbw")
                                                  if ic.get("allreduce_peer_busbw") else None),
            ),
            offers=offers_from_doc(str(doc["id"]).lower(), doc.get("offers"), where),
            vllm_supported=bool(vllm.get("supported", True)),
            k8s_resource=str(vllm.get("k8s_resource", "amd.com/gpu" if doc.get("vendor") == "amd" else "nvidia.com/gpu")),
            arch=arch,
            kernels=table.get(arch, UNKNOWN_ARCH),
            node_labels=_node_labels(doc.get("k8s") or {}),
            aliases=tuple(str(a) for a in doc.get("aliases") or ()),
            gke_accelerators=tuple(str(a) for a in (doc.get("k8s") or {}).get("gke_accelerator") or ()),
            k8s_gpus_per_node=_gpus_per_node(doc.get("k8s") or {}, int(ic["gpus_per_domain"]), where),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise CatalogError(f"GPU catalog entry {where or doc.get('id')}: missing or bad field {e}") from None


def _host_link(doc: Mapping[str, Any] | None, where: str) -> dict[str, Any]:
    """``interconnect.host_link: {kind, bandwidth}`` -> Interconnect keywords (absent: PCIe Gen4 x16, 32 GB/s)."""
    if not doc:
        return {}
    return {"host_kind": str(doc["kind"]),
            "host_bandwidth_bytes_per_s": units.parse_bandwidth(doc["bandwidth"], f"{where} interconnect.host_link")}


def k8s_nodes(engine_gpus: int, gpus_per_node: int) -> int:
    """Kubernetes nodes one engine of ``engine_gpus`` GPUs takes: 1, or where a node holds fewer GPUs than the NVLink
    domain (``gpus_per_node`` > 0, a GB200 / GB300 tray of 4), ``ceil(engine_gpus / gpus_per_node)`` of them."""
    return 1 if not gpus_per_node or engine_gpus <= gpus_per_node else -(-engine_gpus // gpus_per_node)


def _gpus_per_node(k8s: Mapping[str, Any], domain: int, where: str) -> int:
    """``k8s.gpus_per_node`` (absent: 0): a whole number of GPUs below the NVLink domain that divides it."""
    raw = k8s.get("gpus_per_node")
    if raw is None:
        return 0
    n = raw if isinstance(raw, int) and not isinstance(raw, bool) else -1
    if n < 1 or n >= domain or domain % n:
        raise CatalogError(f"GPU catalog entry {where}: k8s.gpus_per_node {raw!r} must be a whole number of GPUs below "
                           f"the NVLink domain of {domain} that divides it (leave it out where a node holds the domain)")
    return n


def _node_labels(k8s: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """``k8s.node_labels: {key: value | [values]}`` -> sorted (key, value) pairs."""
    out: list[tuple[str, str]] = []
    for key, values in (k8s.get("node_labels") or {}).items():
        for v in values if isinstance(values, list) else [values]:
            out.append((str(key), str(v)))
    return tuple(out)


def _register(table: dict[str, Any], key: str, value: Any, path: Path, kind: str) -> None:
    if key in table:
        raise CatalogError(f"duplicate {kind} id {key!r} (again in {path})")
    table[key] = value


def load_catalog(root: Path | None = None, extra_dirs: Iterable[Path] = ()) -> Catalog:
    """Load every YAML under ``root/gpus`` and ``root/models`` (and ``extra_dirs``)."""
    root = root or catalog_dir()
    kernels = load_kernel_support(root / "kernel-support.yaml") or default_kernel_support()
    gpus: dict[str, Gpu] = {}
    models: dict[str, ModelArch] = {}
    meta: dict[str, Mapping[str, Any]] = {}
    for base in (root, *extra_dirs):
        for path in sorted((base / "gpus").glob("*.yaml")):
            doc = _load_yaml(path)
            _register(gpus, str(doc["id"]).lower(), gpu_from_doc(doc, str(path), kernels), path, "GPU")
        for path in sorted((base / "models").glob("*.yaml")):
            doc = _load_yaml(path)
            key = str(doc["id"]).lower()
            arch = arch_from_config(doc.get("config") or {}, model_id=key, hf_repo=str(doc.get("hf_repo", "")),
                                    checkpoint_dtype=doc.get("checkpoint_dtype"))
            checkpoint_blocks_of(doc, str(path))  # refused here, at load, when malformed
            _register(models, key, arch, path, "model")
            meta[key] = doc
    return Catalog(gpus=gpus, models=models, model_meta=meta)


@functools.lru_cache(maxsize=1)
def default_kernel_support() -> dict[str, ArchSupport]:
    """The shipped kernel-support table (``catalogs/kernel-support.yaml``), loaded once."""
    return load_kernel_support(catalog_dir() / "kernel-support.yaml")


@functools.lru_cache(maxsize=1)
def default_catalog() -> Catalog:
    """The catalog shipped with the project (cached: loaded once per process)."""
    return load_catalog()
