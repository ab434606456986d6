"""Workloads and SLOs: pydantic at the edge (YAML files, CLI strings), frozen dataclasses inside.

A workload file (``examples/*.yaml``)::

    name: rag
    model: llama-3.1-70b            # catalog id, or a path to a HF config.json (relative to this file)
    traffic:
      arrival_rate: 4               # requests/s  (or: offline: {requests: 10_000_000, deadline: 8h})
    prompt_tokens: {dist: lognormal, mean: 6000, std: 1200, min: 4000, max: 8000}
    output_tokens: {dist: normal, mean: 150, std: 50, min: 16, max: 512}
    shared_prefix_fraction: 0.3     # share of prompt tokens that hit the prefix cache
    multi_turn: true                # conversations resend their history: prefix caching on (no modelled gain)
    gpus: [h100-sxm, h200]          # default: every catalog GPU
    max_gpus: 16
    prices: {h100-sxm: "$2.49/h"}   # USD per GPU-hour overrides
    checkpoints: {int4: org/model-AWQ}  # pre-quantized checkpoints the plan may use (int8/int4/fp4)
    slo: [tpot=30ms, ttft=2s@p99]

Length distributions: ``constant`` (value), ``normal`` (mean, std), ``lognormal`` (mean, std of the
tokens themselves), ``empirical`` (samples), ``histogram`` (edges = bucket upper edges, counts);
all clipped to [min, max]. Their moments and quantiles are computed once from a fixed, seeded sample
grid so every consumer sees the same numbers.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any, Literal, Mapping, Sequence

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from recommender import units
from recommender.bounded import read_file_text
from recommender.errors import ConfigError, UnitError
from recommender.offers import MAX_NIC_GBPS, UNKNOWN_NETWORK, OwnedGpus, network_from_doc
from recommender.yamlfile import read_yaml_file, validation_message

PERCENTILES = ("mean", "p50", "p90", "p95", "p99")
#: physical ranges accepted at the edge (larger values are typos or attacks, and would make loops spin):
#: 10 M tokens per prompt or output (above the longest context any catalog model supports), 1 M requests/s,
#: 1e15 offline requests, 100,000 GPUs, 1,000 USD per GPU-hour, 1 M samples / buckets in a distribution
MAX_TOKENS = 10_000_000
MAX_RATE_PER_S = 1e6
MAX_OFFLINE_REQUESTS = 10**15
MAX_GPUS = 100_000
MAX_USD_PER_GPU_HOUR = 1000.0
MAX_DIST_POINTS = 1_000_000
MAX_SLO_S = 7 * 24 * 3600.0
MAX_BUCKET_COUNT = 1e15  # a histogram bucket's count (their sum stays exact in a float)


def _refuse_bools(v: Any) -> Any:
    """YAML ``true`` / ``false`` where a number or string belongs is a mistake, not 1 / 0."""
    items = list(v.values()) if isinstance(v, dict) else v if isinstance(v, list) else [v]
    if any(isinstance(x, bool) for x in items):
        raise ValueError("a boolean (true/false) is not a value here")
    return v
DEFAULT_PERCENTILE = "p90"
SLO_METRICS = ("ttft", "tpot", "e2e")
_QUANTILE_GRID = 2001  # points used to tabulate a distribution's quantile function


@dataclass(frozen=True)
class Slo:
    """A latency objective: ``metric`` at ``percentile`` must be <= ``limit_s`` seconds."""

    metric: str
    limit_s: float
    percentile: str = DEFAULT_PERCENTILE

    def __str__(self) -> str:
        return f"{self.metric}={units.fmt_seconds(self.limit_s).replace(' ', '')}@{self.percentile}"

    @staticmethod
    def parse(text: str) -> "Slo":
        """'tpot=30ms', 'ttft=2s@p99', 'e2e=20s@p90', 'tpot=40ms@mean'."""
        s = text.strip().lower().replace(" ", "")
        if "=" not in s:
            raise ConfigError(f"SLO {text!r}: expected METRIC=LIMIT[@PERCENTILE], e.g. tpot=30ms or ttft=2s@p99")
        metric, rest = s.split("=", 1)
        if metric not in SLO_METRICS:
            raise ConfigError(f"SLO {text!r}: metric must be one of {', '.join(SLO_METRICS)}")
        limit, _, pct = rest.partition("@")
        pct = pct or DEFAULT_PERCENTILE
        if pct not in PERCENTILES:
            raise ConfigError(f"SLO {text!r}: percentile must be one of {', '.join(PERCENTILES)}")
        if not re.fullmatch(r"[0-9.e+-]+(ms|s|us|µs|min)", limit):
            raise ConfigError(f"SLO {text!r}: the limit needs a time unit; accepted forms: "
                              f"{metric}=30ms, {metric}=2s, {metric}=2s@p99, {metric}=500us@mean (units us, ms, s, min)")
        try:
            limit_s = units.parse_duration_s(limit, f"SLO {text!r}")
        except Exception as e:  # UnitError is a ConfigError-like user error
            raise ConfigError(str(e)) from None
        if not math.isfinite(limit_s) or limit_s <= 0 or limit_s > MAX_SLO_S:
            raise ConfigError(f"SLO {text!r}: the limit must be positive and at most a week")
        return Slo(metric, limit_s, pct)


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution, clipped to [min_tokens, max_tokens]."""

    kind: str
    mean_param: float = 0.0
    std_param: float = 0.0
    min_tokens: int = 1
    max_tokens: int = 1
    samples: tuple[int, ...] = ()
    weights: tuple[float, ...] = ()
    _table: tuple[int, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_table", self._build_table())

    # -- constructors -------------------------------------------------------------------------
    @staticmethod
    def constant(n: int) -> "LengthDist":
        return LengthDist("constant", n, 0.0, int(n), int(n))

    @staticmethod
    def normal(mean: float, std: float, min_tokens: int = 1, max_tokens: int | None = None) -> "LengthDist":
        hi = max_tokens or int(mean + 4 * std) + 1
        return LengthDist("normal", mean, std, min_tokens, hi)

    @staticmethod
    def lognormal(mean: float, std: float, min_tokens: int = 1, max_tokens: int | None = None) -> "LengthDist":
        hi = max_tokens or int(mean + 6 * std) + 1
        return LengthDist("lognormal", mean, std, min_tokens, hi)

    @staticmethod
    def empirical(samples: Sequence[int]) -> "LengthDist":
        xs = tuple(sorted(int(x) for x in samples))
        if not xs:
            raise ConfigError("empirical length distribution needs at least one sample")
        return LengthDist("empirical", 0.0, 0.0, xs[0], xs[-1], samples=xs)

    @staticmethod
    def histogram(edges: Sequence[float], counts: Sequence[float]) -> "LengthDist":
        """Buckets (previous edge, edge]; tokens uniform inside a bucket. ``edges`` are upper edges."""
        if len(edges) != len(counts) or not edges or sum(counts) <= 0:
            raise ConfigError("histogram length distribution needs matching, non-empty edges and counts")
        finite = [e for e in edges if math.isfinite(e)]
        lo = 1
        hi = int(finite[-1]) if finite else 1
        return LengthDist("histogram", 0.0, 0.0, lo, hi, samples=tuple(int(min(e, hi)) for e in edges),
                          weights=tuple(float(c) for c in counts))

    # -- quantiles ----------------------------------------------------------------------------
    def _raw_quantile(self, q: float) -> float:
        if self.kind == "constant":
            return self.mean_param
        if self.kind == "normal":
            return NormalDist(self.mean_param, max(self.std_param, 1e-9)).inv_cdf(q)
        if self.kind == "lognormal":
            m, s = self.mean_param, max(self.std_param, 1e-9)
            sigma2 = math.log(1 + (s / m) ** 2)
            mu = math.log(m) - sigma2 / 2
            return math.exp(NormalDist(mu, math.sqrt(sigma2)).inv_cdf(q))
        if self.kind == "empirical":
            xs = self.samples
            return xs[min(len(xs) - 1, int(q * len(xs)))]
        if self.kind == "histogram":
            total = sum(self.weights)
            target, acc, prev = q * total, 0.0, 0.0
            for edge, w in zip(self.samples, self.weights):
                if acc + w >= target and w > 0:
                    return prev + (edge - prev) * (target - acc) / w
                acc += w
                prev = edge
            return self.samples[-1]
        raise ConfigError(f"unknown length distribution {self.kind!r}")

    def _build_table(self) -> tuple[int, ...]:
        """Token counts at the quantile grid (i + 0.5) / n, clipped to [min, max] (vectorised)."""
        import numpy as np

        n = _QUANTILE_GRID
        q = (np.arange(n) + 0.5) / n
        if self.kind in ("normal", "lognormal"):
            from scipy.special import ndtri

            z = ndtri(q)
            if self.kind == "normal":
                v = self.mean_param + max(self.std_param, 1e-9) * z
            else:
                m, sd = self.mean_param, max(self.std_param, 1e-9)
                sigma2 = math.log(1 + (sd / m) ** 2)
                v = np.exp(math.log(m) - sigma2 / 2 + math.sqrt(sigma2) * z)
        elif self.kind == "empirical":
            xs = np.asarray(self.samples, dtype=float)
            v = xs[np.minimum(len(xs) - 1, (q * len(xs)).astype(int))]
        else:
            v = np.array([self._raw_quantile(float(x)) for x in q])
        v = np.clip(np.rint(v), self.min_tokens, self.max_tokens).astype(int)
        return tuple(int(x) for x in v)

    def quantile(self, q: float) -> int:
        """Token count at quantile ``q`` in [0, 1]."""
        t = self._table
        return t[min(len(t) - 1, max(0, int(q * len(t))))]

    @property
    def mean(self) -> float:
        return sum(self._table) / len(self._table)

    @property
    def second_moment(self) -> float:
        return sum(x * x for x in self._table) / len(self._table)

    @property
    def std(self) -> float:
        return math.sqrt(max(0.0, self.second_moment - self.mean**2))

    def sample(self, rng: random.Random, n: int) -> list[int]:
        """``n`` seeded draws (inverse-CDF on the tabulated quantiles)."""
        t = self._table
        if self.kind == "empirical":
            return [self.samples[rng.randrange(len(self.samples))] for _ in range(n)]
        return [t[int(rng.random() * len(t))] for _ in range(n)]

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"dist": self.kind, "mean": round(self.mean, 1), "p50": self.quantile(0.5),
                             "p90": self.quantile(0.9), "p99": self.quantile(0.99),
                             "min": self.min_tokens, "max": self.max_tokens}
        return d


@dataclass(frozen=True)
class Workload:
    """What to serve: model, traffic, lengths, constraints and SLOs (all SI units)."""

    model: str
    prompt_tokens: LengthDist
    output_tokens: LengthDist
    arrival_rate_per_s: float | None = None
    offline_requests: int | None = None
    deadline_s: float | None = None
    shared_prefix_fraction: float = 0.0
    gpus: tuple[str, ...] | None = None
    max_gpus: int | None = None
    usd_per_gpu_hour_overrides: Mapping[str, float] = field(default_factory=dict)
    slos: tuple[Slo, ...] = ()
    name: str = "workload"
    source: str = ""
    checkpoints: Mapping[str, str] = field(default_factory=dict)
    multi_turn: bool = False  # conversations resend their history (prefix caching helps; the gain is not modelled)
    #: traffic over a day (``day:`` in the file), validated by ``recommender.autoscale`` (``recommend autoscale``)
    day: Mapping[str, Any] | None = None

    @property
    def prefix_caching(self) -> bool:
        """Whether the engine runs with prefix caching: a shared prefix, or multi-turn conversations."""
        return self.shared_prefix_fraction > 0 or self.multi_turn
    inventory: tuple[OwnedGpus, ...] = ()  # GPUs the user owns (--inventory / inventory:): plans use only these

    @property
    def max_model_len(self) -> int:
        """Longest sequence the engine must hold: max prompt + max output tokens."""
        return int(self.prompt_tokens.max_tokens + self.output_tokens.max_tokens)

    @property
    def is_offline(self) -> bool:
        return self.offline_requests is not None

    @property
    def effective_rate_per_s(self) -> float:
        """Requests/s the deployment must sustain (offline: requests / deadline)."""
        if self.arrival_rate_per_s is not None:
            return self.arrival_rate_per_s
        assert self.offline_requests is not None and self.deadline_s
        return self.offline_requests / self.deadline_s

    def with_slos(self, slos: Sequence[Slo]) -> "Workload":
        """CLI SLOs override the file's SLOs for the same metric."""
        merged = {s.metric: s for s in self.slos}
        merged.update({s.metric: s for s in slos})
        return dataclasses.replace(self, slos=tuple(merged.values()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "model": self.model, "arrival_rate_per_s": self.arrival_rate_per_s,
            "offline_requests": self.offline_requests, "deadline_s": self.deadline_s,
            "prompt_tokens": self.prompt_tokens.to_dict(), "output_tokens": self.output_tokens.to_dict(),
            "max_model_len": self.max_model_len, "shared_prefix_fraction": self.shared_prefix_fraction,
            "source": self.source,
        }


# ---------------------------------------------------------------------------------------------
# pydantic edge
# ---------------------------------------------------------------------------------------------
_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)


class _DistSpec(BaseModel):
    model_config = _STRICT
    dist: Literal["constant", "normal", "lognormal", "empirical", "histogram"]
    value: int | None = Field(default=None, gt=0, le=MAX_TOKENS)
    mean: float | None = Field(default=None, gt=0, le=MAX_TOKENS)
    std: float | None = Field(default=None, ge=0, le=MAX_TOKENS)
    min: int = Field(default=1, gt=0, le=MAX_TOKENS)
    max: int | None = Field(default=None, gt=0, le=MAX_TOKENS)
    samples: list[int] | None = Field(default=None, max_length=MAX_DIST_POINTS)
    edges: list[float] | None = Field(default=None, max_length=MAX_DIST_POINTS)
    counts: list[float] | None = Field(default=None, max_length=MAX_DIST_POINTS)

    _no_bool = field_validator("*", mode="before")(classmethod(lambda cls, v: _refuse_bools(v)))

    @field_validator("samples", "edges", "counts")
    @classmethod
    def _not_empty(cls, v: list[Any] | None) -> list[Any] | None:
        if v is not None and not v:
            raise ValueError("give at least one value (an empty list describes no lengths)")
        return v

    @field_validator("samples", "edges")
    @classmethod
    def _token_counts(cls, v: list[float] | None) -> list[float] | None:
        """Token lengths are at least 1: a sample of 0, or a bucket whose upper edge is below 1 (it holds no whole
        token count), would become a 0-token request, and a plan echo its own reader refuses."""
        if v is not None and any(not 1 <= x <= MAX_TOKENS for x in v):
            bad = next(x for x in v if not 1 <= x <= MAX_TOKENS)
            raise ValueError(f"token counts must be from 1 to {MAX_TOKENS:,} (a prompt or output holds at least one "
                             f"token), got {bad:g}")
        return v

    @model_validator(mode="after")
    def _check(self) -> "_DistSpec":
        need = {"constant": ("value",), "normal": ("mean", "std"), "lognormal": ("mean", "std"),
                "empirical": ("samples",), "histogram": ("edges", "counts")}[self.dist]
        for n in need:
            if getattr(self, n) is None:
                raise ValueError(f"dist {self.dist} needs '{n}'")
        allowed = set(need) | {"dist"} | ({"min", "max"} if self.dist in ("normal", "lognormal") else set())
        extra = sorted(self.model_fields_set - allowed)
        if extra:
            raise ValueError(f"dist {self.dist} takes {', '.join(sorted(allowed - {'dist'}))}, not "
                             f"{', '.join(extra)} (it would be ignored)")
        if self.edges is not None:
            if any(b <= a for a, b in zip(self.edges, self.edges[1:])):
                raise ValueError("edges must be strictly ascending upper bucket edges")
            if self.counts is not None and len(self.counts) != len(self.edges):
                raise ValueError(f"{len(self.edges)} edges but {len(self.counts)} counts; give one count per edge")
        if self.counts is not None:
            if any(not 0 <= c <= MAX_BUCKET_COUNT for c in self.counts):
                raise ValueError(f"counts must be between 0 and {MAX_BUCKET_COUNT:g}")
            if not sum(self.counts) > 0:
                raise ValueError("counts must not all be 0")
        if self.counts is not None and any(c < 0 for c in self.counts):
            raise ValueError("counts must be >= 0")
        if self.dist in ("normal", "lognormal") and self.max is None and (self.mean or 0) + 6 * (self.std or 0) > MAX_TOKENS:
            raise ValueError(f"mean + 6 std exceeds {MAX_TOKENS:,} tokens; give 'max' to clip the tail")
        if self.max is not None and self.max < self.min:
            raise ValueError("max must be >= min")
        if self.dist in ("normal", "lognormal") and self.max is None:
            top = int((self.mean or 0) + (4 if self.dist == "normal" else 6) * (self.std or 0)) + 1
            if top < self.min:
                raise ValueError(f"min {self.min} is above the distribution's upper end {top} (mean + "
                                 f"{4 if self.dist == 'normal' else 6} std); give 'max' or a smaller min")
        return self

    def build(self) -> LengthDist:
        if self.dist == "constant":
            return LengthDist.constant(int(self.value))  # type: ignore[arg-type]
        if self.dist == "normal":
            return LengthDist.normal(self.mean, self.std, self.min, self.max)  # type: ignore[arg-type]
        if self.dist == "lognormal":
            return LengthDist.lognormal(self.mean, self.std, self.min, self.max)  # type: ignore[arg-type]
        if self.dist == "empirical":
            return LengthDist.empirical(self.samples or [])
        return LengthDist.histogram(self.edges or [], self.counts or [])


def _dist_from_any(v: Any) -> Any:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return {"dist": "constant", "value": int(v) if math.isfinite(v) and v == int(v) else v}
    return v


class _Offline(BaseModel):
    model_config = _STRICT
    _no_bool = field_validator("*", mode="before")(classmethod(lambda cls, v: _refuse_bools(v)))
    requests: int = Field(gt=0, le=MAX_OFFLINE_REQUESTS)
    deadline: str | float  # seconds once validated (``_deadline_s``)

    @field_validator("requests", mode="before")
    @classmethod
    def _count(cls, v: Any) -> Any:
        return units.parse_count(v, "offline.requests") if isinstance(v, str) else v

    @field_validator("deadline")
    @classmethod
    def _deadline_s(cls, v: str | float) -> float:
        """'8h', '90min', 3600 -> seconds, positive and finite (an error here names the file, line and field)."""
        try:
            seconds = units.parse_duration_s(v, "deadline")
        except UnitError as e:  # the field is named by the message around it: "<file> line N...: field '...'"
            raise ValueError(str(e).removeprefix("deadline: ")) from None
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"must be a positive duration (e.g. 8h, 90min), got {v!r}")
        return seconds

    @model_validator(mode="after")
    def _rate(self) -> "_Offline":
        if self.requests / float(self.deadline) > MAX_RATE_PER_S:
            raise ValueError(f"requests / deadline exceeds {MAX_RATE_PER_S:g} requests/s")
        return self


class _Traffic(BaseModel):
    model_config = _STRICT
    _no_bool = field_validator("*", mode="before")(classmethod(lambda cls, v: _refuse_bools(v)))
    arrival_rate: float | None = Field(default=None, gt=0, le=MAX_RATE_PER_S)
    offline: _Offline | None = None

    @model_validator(mode="after")
    def _one(self) -> "_Traffic":
        if (self.arrival_rate is None) == (self.offline is None):
            raise ValueError("give exactly one of arrival_rate (requests/s) or offline {requests, deadline}")
        return self


class _OwnedNetwork(BaseModel):
    """The NIC between the user's nodes (an offer's ``network:`` without the catalog's sourcing and device-plugin
    fields: the user states the fabric, nothing they write reaches a manifest)."""

    model_config = _STRICT
    kind: Literal["infiniband", "roce", "efa", "ethernet"]
    gbps_per_gpu: float | None = Field(default=None, gt=0, le=MAX_NIC_GBPS)
    gbps_per_node: float | None = Field(default=None, gt=0, le=MAX_NIC_GBPS)

    @model_validator(mode="after")
    def _one(self) -> "_OwnedNetwork":
        if (self.gbps_per_gpu is None) == (self.gbps_per_node is None):
            raise ValueError("give exactly one of gbps_per_gpu or gbps_per_node")
        return self


class _OwnedSpec(BaseModel):
    model_config = _STRICT
    gpus: int = Field(gt=0, le=MAX_GPUS)
    usd_per_gpu_hour: str | float | None = None
    gpus_per_node: int = Field(default=0, ge=0, le=MAX_GPUS)
    network: _OwnedNetwork | None = None  # between the nodes: lets a model no node holds run in pipeline stages

    @model_validator(mode="before")
    @classmethod
    def _count(cls, v: Any) -> Any:
        """``h100-sxm: 16`` is ``{gpus: 16}`` (one schema, so an error names the field of the mapping form)."""
        return {"gpus": v} if isinstance(v, int) and not isinstance(v, bool) else v


def _inventory(doc: Mapping[str, _OwnedSpec], source: str) -> tuple[OwnedGpus, ...]:
    """``inventory: {h100-sxm: 16, a100-80gb: {gpus: 8, usd_per_gpu_hour: 1.2, gpus_per_node: 8, network: {kind:
    infiniband, gbps_per_gpu: 400}}}``."""
    from recommender.catalog import default_catalog
    from recommender.errors import CatalogError

    out = []
    for gpu, v in doc.items():
        try:
            gpu = default_catalog().gpu_id(gpu)
        except CatalogError as e:
            raise CatalogError(f"{source}: inventory: {e}") from None
        spec = v
        price = None if spec.usd_per_gpu_hour is None else units.parse_usd_per_hour(
            spec.usd_per_gpu_hour, f"{source}: inventory.{gpu}.usd_per_gpu_hour")
        if price is not None and not (math.isfinite(price) and 0 < price <= MAX_USD_PER_GPU_HOUR):
            raise ConfigError(f"{source}: inventory.{gpu}.usd_per_gpu_hour must be above $0 and at most "
                              f"${MAX_USD_PER_GPU_HOUR:g}")
        net = spec.network
        network = UNKNOWN_NETWORK if net is None else network_from_doc(
            {"kind": net.kind, "gbps_per_gpu": net.gbps_per_gpu, "gbps_per_instance": net.gbps_per_node,
             "source": f"{source}: inventory.{gpu}.network"}, f"{source}: inventory.{gpu}")
        out.append(OwnedGpus(gpu=str(gpu), count=spec.gpus, usd_per_gpu_hour=price, gpus_per_node=spec.gpus_per_node,
                             network=network))
    return tuple(out)


class WorkloadSpec(BaseModel):
    """The YAML schema of a workload file (validated, then turned into :class:`Workload`)."""

    model_config = _STRICT
    name: str | None = Field(default=None, max_length=200)
    model: str = Field(min_length=1, max_length=4096)
    traffic: _Traffic
    prompt_tokens: _DistSpec
    output_tokens: _DistSpec
    shared_prefix_fraction: float = Field(default=0.0, ge=0.0, lt=1.0)
    multi_turn: bool = False
    gpus: list[str] | None = Field(default=None, min_length=1, max_length=1000)
    max_gpus: int | None = Field(default=None, gt=0, le=MAX_GPUS)
    prices: dict[str, str | float] = Field(default_factory=dict)
    slo: list[str] = Field(default_factory=list)
    checkpoints: dict[str, str] = Field(default_factory=dict)
    description: str | None = None
    day: dict[str, Any] | None = None  # traffic over a day: recommender.autoscale.spec checks it
    inventory: dict[str, _OwnedSpec] = Field(default_factory=dict)

    _no_bool = field_validator("name", "model", "shared_prefix_fraction", "max_gpus", "gpus", "prices", "slo",
                               "checkpoints", mode="before")(classmethod(lambda cls, v: _refuse_bools(v)))
    _coerce_prompt = field_validator("prompt_tokens", mode="before")(classmethod(lambda cls, v: _dist_from_any(v)))
    _coerce_output = field_validator("output_tokens", mode="before")(classmethod(lambda cls, v: _dist_from_any(v)))

    @model_validator(mode="after")
    def _names(self) -> "WorkloadSpec":
        for what, text in (("name", self.name or ""), ("model", self.model), *(("gpus", g) for g in self.gpus or ())):
            if not text.isprintable() or (what != "name" and not text.strip()):
                raise ValueError(f"{what} {text[:40]!r} must be one printable line (no control or invisible "
                                 f"characters, not blank)")
        from recommender.dtypes import FORMAT_DTYPE, WEIGHT_DTYPES

        for key, repo in self.checkpoints.items():
            if key.lower() not in WEIGHT_DTYPES and key.lower() not in FORMAT_DTYPE:
                raise ValueError(f"checkpoints key {key[:20]!r} is not a weight dtype ({', '.join(WEIGHT_DTYPES)})")
            if not repo.strip() or not repo.isprintable():
                raise ValueError(f"checkpoints.{key}: {repo[:40]!r} is not a checkpoint repo id")
        return self

    def build(self, source: str = "") -> Workload:
        off = self.traffic.offline
        deadline_s = float(off.deadline) if off else None  # seconds: _Offline._deadline_s parsed and checked it
        return Workload(
            model=model_relative_to(self.model, source),
            prompt_tokens=self.prompt_tokens.build(),
            output_tokens=self.output_tokens.build(),
            arrival_rate_per_s=self.traffic.arrival_rate,
            offline_requests=off.requests if off else None,
            deadline_s=deadline_s,
            shared_prefix_fraction=self.shared_prefix_fraction,
            gpus=tuple(g.lower() for g in self.gpus) if self.gpus else None,
            max_gpus=self.max_gpus,
            usd_per_gpu_hour_overrides=_prices(self.prices, source),
            slos=_slos(self.slo, source),
            name=self.name or (Path(source).stem if source else "workload"),
            source=source,
            checkpoints={k.lower(): v for k, v in self.checkpoints.items()},
            multi_turn=self.multi_turn,
            day=self.day,
            inventory=_inventory(self.inventory, source),
        )


def model_relative_to(model: str, source: str) -> str:
    """A workload's ``model:`` read as the file means it: a relative path to a ``config.json`` (or a folder holding
    one) is relative to the workload file's folder, as ``day.trace`` is, not to the current folder.

    Catalog ids, aliases and Hugging Face repo ids the catalog knows stay as written (they win over a file of that
    name, as in :meth:`recommender.catalog.Catalog.model`), as do absolute paths and names that are neither a
    ``.json`` path nor a file or folder beside the workload (an unknown repo id is then refused by the catalog).
    ``source`` is the workload file; without one (a dict, the command line) ``model`` is returned unchanged."""
    if not source or Path(model).is_absolute() or not Path(source).is_file():
        return model
    beside = Path(source).parent / model
    try:
        there = beside.exists()
    except OSError:  # a name too long for a path (ENAMETOOLONG) is no file: the catalog names the mistake
        there = False
    if not (model.endswith(".json") or there):
        return model
    from recommender.catalog import default_catalog

    if not model.endswith(".json") and default_catalog().model_id(model) is not None:
        return model
    return str(beside)


def _slos(texts: Sequence[str], source: str) -> tuple[Slo, ...]:
    """The SLOs, at most one per metric (a second one would silently replace the first)."""
    out: dict[str, Slo] = {}
    for text in texts:
        slo = Slo.parse(text)
        if slo.metric in out:
            raise ConfigError(f"{source}: slo: two limits on {slo.metric} ({out[slo.metric]} and {slo}); give one per "
                              f"metric")
        out[slo.metric] = slo
    return tuple(out.values())


def _prices(prices: Mapping[str, str | float], source: str) -> dict[str, float]:
    """USD per GPU-hour overrides: each for a catalog GPU, each in (0, MAX_USD_PER_GPU_HOUR]."""
    from recommender.catalog import default_catalog
    from recommender.errors import CatalogError

    out: dict[str, float] = {}
    cat = default_catalog()
    for key, raw in prices.items():
        usd = units.parse_usd_per_hour(raw, f"{source}: prices.{key}")
        if not (math.isfinite(usd) and 0 < usd <= MAX_USD_PER_GPU_HOUR):
            raise ConfigError(f"{source}: prices.{key} = {raw!r}: a price must be above $0 and at most "
                              f"${MAX_USD_PER_GPU_HOUR:g} per GPU-hour")
        try:
            gpu_id = cat.gpu_id(key)  # the one name resolver: ids, aliases ('h100'), datasheet names
        except CatalogError as e:
            raise CatalogError(f"{source}: prices: {e}") from None
        if gpu_id in out and out[gpu_id] != usd:
            raise ConfigError(f"{source}: prices: {key!r} and another name both mean GPU {gpu_id} with different "
                              f"prices; give one")
        out[gpu_id] = usd
    return out


def workload_from_dict(doc: Mapping[str, Any], source: str = "<dict>") -> Workload:
    try:
        return WorkloadSpec.model_validate(doc).build(source)
    except ValidationError as e:
        text = None
        if source and Path(source).is_file():  # the error names the line and column of the key
            text = read_file_text(Path(source), "workload file")
        raise ConfigError(validation_message(e, source, model=WorkloadSpec, text=text)) from None


def load_workload(path: str | Path) -> Workload:
    """Read and validate a workload YAML file; errors name the file and the field."""
    p = Path(path)
    doc = read_yaml_file(p, "workload", "see examples/")
    if not isinstance(doc, dict):
        raise ConfigError(f"workload file {p} must be a YAML mapping (see examples/)")
    return workload_from_dict(doc, str(p))


def parse_price_flag(text: str, what: str = "--price") -> dict[str, float]:
    """``mi355x=$3.50/h,h100=2.49`` -> {catalog GPU id: USD per GPU-hour}, checked as a workload's ``prices:``."""
    entries: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, eq, price = part.partition("=")
        if not eq or not name.strip() or not price.strip():
            raise ConfigError(f"{what} {part!r}: give GPU=$PRICE/h per GPU-hour, e.g. mi355x=$3.50/h")
        if name.strip() in entries:
            raise ConfigError(f"{what}: two prices for {name.strip()!r}; give one")
        entries[name.strip()] = price.strip()
    if not entries:
        raise ConfigError(f"{what}: give GPU=$PRICE/h entries, e.g. mi355x=$3.50/h")
    return _prices(entries, what)


def workload_from_flags(base: Workload | None, *, model: str | None = None, gpus: Sequence[str] | None = None,
                        rate_per_s: float | None = None, prompt_tokens: int | None = None,
                        output_tokens: int | None = None, prices: Mapping[str, float] | None = None) -> Workload:
    """The workload of the main job's quick flags, over a file's workload when there is one (flags win).

    Token flags are constant lengths. Without ``base``, model, rate and both lengths are required. ``prices``
    (``--price``, catalog GPU id -> USD per GPU-hour) join the file's ``prices:``, a flag's winning for its GPU.
    """
    for flag, v in (("--rate", rate_per_s), ("--prompt-tokens", prompt_tokens), ("--output-tokens", output_tokens)):
        if v is not None and not v > 0:
            raise ConfigError(f"{flag} {v}: must be > 0")
    if base is None:
        missing = [f for f, v in (("--model", model), ("--rate", rate_per_s), ("--prompt-tokens", prompt_tokens),
                                  ("--output-tokens", output_tokens)) if v is None]
        if missing:
            raise ConfigError(f"give --workload FILE, or --model, --rate, --prompt-tokens and --output-tokens "
                              f"(missing {', '.join(missing)}), e.g. recommend --model llama-3.1-8b --rate 5 "
                              "--prompt-tokens 2000 --output-tokens 300 --slo tpot=30ms")
        assert model and rate_per_s and prompt_tokens and output_tokens
        return Workload(model=model, prompt_tokens=LengthDist.constant(prompt_tokens),
                        output_tokens=LengthDist.constant(output_tokens), arrival_rate_per_s=rate_per_s,
                        gpus=tuple(gpus) if gpus else None, name="flags", source="command-line flags",
                        usd_per_gpu_hour_overrides=dict(prices or {}))
    kw: dict[str, Any] = {}
    if prices:
        kw["usd_per_gpu_hour_overrides"] = {**base.usd_per_gpu_hour_overrides, **prices}
    if model:
        kw["model"] = model
    if gpus:
        kw["gpus"] = tuple(gpus)
    if rate_per_s is not None:
        kw.update(arrival_rate_per_s=rate_per_s, offline_requests=None, deadline_s=None)
    if prompt_tokens is not None:
        kw["prompt_tokens"] = LengthDist.constant(prompt_tokens)
    if output_tokens is not None:
        kw["output_tokens"] = LengthDist.constant(output_tokens)
    result: Workload = dataclasses.replace(base, **kw)
    return result
