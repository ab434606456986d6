"""``policies/search.yaml``: the search's settings (pydantic at the edge -> frozen dataclass)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from recommender.errors import ConfigError
from recommender.load.link import KV_HANDOFF_S
from recommender.shipped import shipped_dir
from recommender.yamlfile import read_yaml_file, validation_message


class _SearchPolicySpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    trials: int = Field(2000, gt=0)
    front_trials: int = Field(150, gt=0)
    timeout_s: float = Field(60.0, gt=0)
    population_size: int = Field(40, ge=2)
    headroom: float = Field(0.2, ge=0.0, le=5.0)
    rate_basis: Literal["mean"] = "mean"
    max_utilisation: float = Field(0.85, gt=0.0, le=1.0)
    tensor_parallel: list[int] = [1, 2, 4, 8]
    mtp_draft_tokens: list[int] = Field([1, 2, 3], max_length=8)
    weight_dtypes: list[str] = ["native", "fp8", "int8", "int4", "fp4"]
    kv_dtypes: list[str] = ["bf16", "fp8"]
    max_num_seqs: list[int] = [16, 32, 64, 128, 256, 512, 1024]
    max_num_batched_tokens: list[int] = [0, 1024, 2048, 4096, 8192, 16384]
    gpu_memory_utilization: float = Field(0.92, gt=0.05, le=1.0)
    disaggregation: bool = True
    pd_heterogeneous_gpus: bool = False
    pd_min_saving: float = Field(0.05, ge=0.0, lt=1.0)
    pd_saving_proof: bool = True
    prefer_measured: bool = True
    evidence_band: float = Field(0.15, ge=0.0, le=2.0)
    kv_transfer_bandwidth_bytes_per_s: float = Field(5e10, gt=0)
    kv_transfer_latency_s: float = Field(0.002, ge=0)
    kv_handoff_s: float = Field(KV_HANDOFF_S, ge=0, le=60)
    max_replicas: int = Field(256, gt=0)
    verify: int = Field(3, ge=0)
    verify_requests: int = Field(20000, gt=0)  # at most, per verified plan (search/verify.py sizes the run)
    quality_risk_dtypes: list[str] = ["int4", "fp4"]


@dataclass(frozen=True)
class SearchPolicy:
    """See ``policies/search.yaml`` for the meaning of each field."""

    trials: int = 2000
    front_trials: int = 150
    timeout_s: float = 60.0
    population_size: int = 40
    headroom: float = 0.2
    rate_basis: str = "mean"  # the rate a plan is sized for is rate_basis x (1 + headroom): docs/sizing-basis.md
    max_utilisation: float = 0.85
    tensor_parallel: tuple[int, ...] = (1, 2, 4, 8)
    mtp_draft_tokens: tuple[int, ...] = (1, 2, 3)  # MTP k tried besides 0, for models with MTP heads only
    weight_dtypes: tuple[str, ...] = ("native", "fp8", "int8", "int4", "fp4")
    kv_dtypes: tuple[str, ...] = ("bf16", "fp8")
    max_num_seqs: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024)
    max_num_batched_tokens: tuple[int, ...] = (0, 1024, 2048, 4096, 8192, 16384)
    gpu_memory_utilization: float = 0.92
    disaggregation: bool = True
    pd_heterogeneous_gpus: bool = False
    pd_min_saving: float = 0.05
    pd_saving_proof: bool = True  # a P/D rank 1: search the aggregated space on until its rank 1 is proven
    prefer_measured: bool = True
    evidence_band: float = 0.15
    kv_transfer_bandwidth_bytes_per_s: float = 5e10
    kv_transfer_latency_s: float = 0.002
    kv_handoff_s: float = KV_HANDOFF_S  # measured: recommender.load.link
    max_replicas: int = 256
    verify: int = 3
    verify_requests: int = 20000
    quality_risk_dtypes: tuple[str, ...] = ("int4", "fp4")


@dataclass(frozen=True)
class StudySettings:
    """How to run the study (CLI: --seed --trials --timeout --storage --study-name --workers)."""

    seed: int = 0
    trials: int | None = None
    timeout_s: float | None = None
    storage: str | None = None
    study_name: str | None = None
    workers: int = 1


def default_policy_path() -> Path:
    """The shipped ``policies/search.yaml`` (installed copy or source checkout), from any working folder."""
    return shipped_dir("policies") / "search.yaml"


def load_search_policy(path: str | Path | None = None) -> SearchPolicy:
    """Read ``policies/search.yaml`` (or ``path``); missing keys take the defaults above."""
    p = Path(path) if path else default_policy_path()
    # an explicit --policy must exist; the default file may be absent (installed without policies/)
    doc: object = {}
    if path or p.exists():
        doc = read_yaml_file(p, "search policy", "see policies/search.yaml") or {}
    try:
        spec = _SearchPolicySpec.model_validate(doc)
    except ValidationError as e:
        text = p.read_text(errors="replace") if p.is_file() else None
        raise ConfigError(validation_message(e, f"search policy {p}", model=_SearchPolicySpec, text=text)) from None
    d: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in spec.model_dump().items()}
    return SearchPolicy(**d)
