"""One measured number, the configuration and load it was measured at, and the model's prediction of it.

A :class:`Measurement` is engine-agnostic: readers (``readers.py``) turn published tables and
``vllm bench serve`` result files into measurements; the fitter (``fit.py``) compares
:func:`predict` against ``value`` for a trial :class:`EngineProfile`.

Quantities (``Measurement.quantity``; values in SI units, per replica = one TP group):

- ``output_tokens_per_s``: output tokens per second of the whole replica (per-GPU figures are
  multiplied by ``tp`` and per-user figures by the batch when read);
- ``ttft_s``: time to first token; ``tpot_s``: time per output token (= one decode step);
- ``itl_intercept_s`` / ``itl_slope_s_per_token``: a published linear fit ``ITL = slope x context +
  intercept`` at batch 1. The model's are ``decode_step(1, 0)`` and
  ``(decode_step(1, C) - decode_step(1, 0)) / C`` with ``C`` = :data:`SLOPE_CONTEXT_TOKENS`
  (exact: the memory-bound batch-1 step is linear in the context).

Benchmark runs (``rate_per_s`` or ``requests`` set) are ``finite`` loads predicted by the one path
``recommender.estimator`` (:func:`~recommender.estimator.finite_run`): a closed loop at the mean number
of requests in flight ``N`` (the client's cap, or below it Little's law ``N = rate x e2e(N)``), with
the engine's admission queue above what it runs at once; a run of ``M`` requests lasts
``duration = max((M - 1) / rate, (M - N) x e2e / N) + e2e`` and reports ``M x output_tokens / duration``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

from recommender.catalog import Catalog, default_catalog
from recommender.errors import CalibrationError
from recommender.estimator import build_deployment, closed_at, finite_run
from recommender.estimator import in_flight as _in_flight
from recommender.perf.speculative import SpecDecode
from recommender.perf.steady import Estimate, Load, estimate
from recommender.perf.step import Deployment, EngineLimits, StepCostModel
from recommender.profiles import EngineProfile, gpu_family

QUANTITIES = ("output_tokens_per_s", "ttft_s", "tpot_s", "e2e_s", "itl_intercept_s", "itl_slope_s_per_token")
#: Context length at which the model's ITL slope is measured (the published sweeps reach 125k).
SLOPE_CONTEXT_TOKENS = 65536
#: physics limits of a measurement (refused above them, in one line naming the field): TP beyond a 72-GPU
#: NVLink domain (GB200 NVL72) does not exist; prompts and outputs beyond the workload limit of 10M tokens;
#: a run of more than 1e8 requests or 1e6 in flight is not a benchmark this fits in a reasonable time
MAX_TP = 72
MAX_CALIBRATION_TOKENS = 10_000_000
MAX_CALIBRATION_TOKENS_ENV = "RECOMMENDER_MAX_CALIBRATION_TOKENS"


def max_calibration_tokens() -> int:
    """The token limit of a measurement: ``$RECOMMENDER_MAX_CALIBRATION_TOKENS`` (a positive integer), default 10M."""
    import os

    raw = os.environ.get(MAX_CALIBRATION_TOKENS_ENV, "").strip()
    if not raw:
        return MAX_CALIBRATION_TOKENS
    if not raw.isdigit() or int(raw) < 1:
        raise CalibrationError(f"{MAX_CALIBRATION_TOKENS_ENV}={raw!r}: give a positive whole number of tokens")
    return int(raw)
MAX_CALIBRATION_CONCURRENCY = 1_000_000
MAX_CALIBRATION_REQUESTS = 100_000_000


@dataclass(frozen=True)
class Measurement:
    """One measured number (SI units) and everything needed to predict it."""

    id: str                      # row id, or "<file>#<key>"
    source: str                  # group used in reports: the id prefix of a published row, or the file name
    file: str
    engine: str                  # profile the row belongs to: vllm, trtllm, lmdeploy, gpt-fast, ...
    model: str                   # catalog id
    gpu: str                     # catalog id
    tp: int
    weight_dtype: str
    kv_dtype: str
    load: Load
    quantity: str                # one of QUANTITIES
    value: float                 # SI: seconds, tokens/s, seconds per token
    raw_metric: str              # the metric name as published / the JSON key
    limits: EngineLimits = EngineLimits()
    gpu_memory_utilization: float = 0.92
    cuda_graphs: bool = True
    rate_per_s: float | None = None   # open loop (Little's law), else None
    requests: int | None = None       # requests in the whole run (finite-run throughput), else steady state
    dp: int = 1                       # --data-parallel-size: attention ranks (MoE layers span tp x dp GPUs)
    ep: bool = False                  # --enable-expert-parallel: routed experts split over the tp x dp GPUs
    spec_tokens: int = 0              # MTP num_speculative_tokens k (0: no speculative decoding)
    acceptance_rate: float = 0.0      # MTP per-position acceptance the run measured (its spec_decode counters)

    def __post_init__(self) -> None:
        """Physics at the edge: every figure finite and in range, so no fit runs on nonsense (or forever)."""
        where = f"{self.file}: {self.id}"

        def bad(field_name: str, value: object, limit: str) -> CalibrationError:
            return CalibrationError(f"{where}: field {field_name!r} = {value!r} must be {limit}")

        if isinstance(self.tp, bool) or not isinstance(self.tp, int) or not 1 <= self.tp <= MAX_TP:
            raise bad("tp", self.tp, f"an integer from 1 to {MAX_TP}")
        if isinstance(self.dp, bool) or not isinstance(self.dp, int) or not 1 <= self.dp * self.tp <= MAX_TP:
            raise bad("data_parallel_size", self.dp, f"an integer from 1 with tp x dp at most {MAX_TP}")
        if self.spec_tokens and not (0 < self.acceptance_rate <= 1):
            raise bad("acceptance_rate", self.acceptance_rate, "a per-position acceptance in (0, 1] with MTP")
        if not (isinstance(self.value, (int, float)) and math.isfinite(self.value) and self.value > 0):
            raise bad(self.raw_metric or "value", self.value, "a finite positive number")
        ld = self.load
        max_tokens = max_calibration_tokens()
        for name, v in (("prompt_tokens", ld.prompt_tokens), ("output_tokens", ld.output_tokens),
                        ("context_tokens", ld.context_tokens)):
            if not 0 <= v <= max_tokens:
                raise bad(name, v, f"between 0 and {max_tokens:,} tokens (raise with {MAX_CALIBRATION_TOKENS_ENV})")
        if not 0 <= ld.batch <= MAX_CALIBRATION_CONCURRENCY:
            raise bad("batch / max_concurrency", ld.batch, f"between 0 (none) and {MAX_CALIBRATION_CONCURRENCY:,}")
        if self.requests is not None and not 1 <= self.requests <= MAX_CALIBRATION_REQUESTS:
            raise bad("completed", self.requests, f"between 1 and {MAX_CALIBRATION_REQUESTS:,} requests")
        if self.rate_per_s is not None and not (math.isfinite(self.rate_per_s) and 0 < self.rate_per_s <= 1e6):
            raise bad("request_rate", self.rate_per_s, "a positive rate up to 1e6 requests/s (or inf: all at once)")
        lim = self.limits
        if not 1 <= lim.max_num_seqs <= 1_000_000:
            raise bad("max_num_seqs", lim.max_num_seqs, "between 1 and 1,000,000")
        if not 1 <= lim.max_num_batched_tokens <= max_tokens:
            raise bad("max_num_batched_tokens", lim.max_num_batched_tokens, f"between 1 and {max_tokens:,}")
        g = self.gpu_memory_utilization
        if not (isinstance(g, (int, float)) and math.isfinite(g) and 0 < g <= 1):
            raise bad("gpu_memory_utilization", g, "in (0, 1]")

    def group(self, by: str) -> str:
        """Grouping key for held-out splits and reports: source, model, gpu, family, engine, quantity, config, row."""
        if by == "config":
            layout = (f"-dp{self.dp}" if self.dp > 1 else "") + ("-ep" if self.ep else "") + (
                f"-mtp{self.spec_tokens}" if self.spec_tokens else "")
            return f"{self.model}/{self.gpu}/tp{self.tp}{layout}"
        if by == "row":
            return self.id
        if by == "family":
            return gpu_family(self.gpu) or self.gpu
        return str(getattr(self, by))


@dataclass(frozen=True)
class Skip:
    """A row or file that could not be used, and why (counted in reports, never silently dropped)."""

    id: str
    reason: str
    #: the results file it was read from, as given ("" when not known)
    file: str = ""
    #: what it was: "row" (a row of a CSV) or "result" (a `vllm bench serve` result: a JSON file, or one result of
    #: an ``--append-result`` file)
    unit: str = "row"


# -- metric names ---------------------------------------------------------------------------------
_UNIT = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def _time_unit(tokens: list[str], where: str) -> float:
    for t in tokens:
        if t in _UNIT:
            return _UNIT[t]
    raise CalibrationError(f"{where}: metric has no time unit (_ns_, _us_, _ms_ or _s_ in the name)")


def parse_metric(name: str, where: str) -> tuple[str, float, str]:
    """Metric name -> (quantity, multiplier to SI, scale) with scale in {'replica', 'gpu', 'user'}.

    ``output_tok_s_per_gpu`` -> ('output_tokens_per_s', 1, 'gpu'); ``ttft_ms_median`` ->
    ('ttft_s', 1e-3, 'replica'); ``token_latency_s_p50`` -> ('tpot_s', 1, 'replica').
    """
    n = name.strip().lower()
    tok = n.split("_")
    if n.startswith(("output_tok_s", "output_throughput", "output_tokens_per_s")):
        scale = "gpu" if "per_gpu" in n else "user" if "per_user" in n else "replica"
        return "output_tokens_per_s", 1.0, scale
    if re.search(r"itl_\w*fit_slope|itl_\w*slope", n):
        return "itl_slope_s_per_token", _time_unit(tok, where), "replica"
    if re.search(r"itl_\w*fit_intercept|itl_\w*intercept", n):
        return "itl_intercept_s", _time_unit(tok, where), "replica"
    if "ttft" in tok or n.startswith("first_token"):
        return "ttft_s", _time_unit(tok, where), "replica"
    # An ITL metric of the published format is read as TPOT: the format has no column for speculative decoding or
    # --stream-interval, and its ITL rows (VLLMFP8KV) stream one token per chunk, where mean ITL = mean TPOT. A
    # `vllm bench serve` file is never read for ITL (readers.py takes its TPOT keys and skips speculative runs).
    if {"itl", "tpot"} & set(tok) or n.startswith(("token_latency", "decode_step")):
        return "tpot_s", _time_unit(tok, where), "replica"
    if "e2el" in tok or n.startswith(("e2e", "latency")):
        return "e2e_s", _time_unit(tok, where), "replica"
    raise CalibrationError(f"{where}: metric {name!r} is not one the model predicts "
                           "(output tokens/s, TTFT, TPOT/ITL, end-to-end latency)")


# -- names: catalog ids from free text ----------------------------------------------------------
_GPU_RULES: tuple[tuple[str, str | None], ...] = (
    # (substring of the normalised name, catalog id or None = known but not in the catalog); first match wins
    ("gh200", None), ("gb300", "gb300"), ("mi250", None), ("mi210", None), ("a10-", None),
    ("gb200", "gb200"), ("b300", "b300"), ("b200", "b200"),
    ("h200", "h200"), ("h100nvl", "h100-nvl"), ("h100-nvl", "h100-nvl"), ("h100pcie", "h100-pcie"),
    ("h100-pcie", "h100-pcie"), ("h100", "h100-sxm"),
    ("a10040", "a100-40gb"), ("a100-40", "a100-40gb"), ("a100", "a100-80gb"),
    ("l40s", "l40s"), ("l40", None), ("a10g", "a10g"), ("l4", "l4"),
    ("mi355", "mi355x"), ("mi325", "mi325x"), ("mi300", "mi300x"),
)


def resolve_gpu(text: str, catalog: Catalog | None = None) -> str | None:
    """Free-text GPU name ('H100 80GB HBM3', 'A100-SXM4-80GB', 'h200') -> catalog id, or None.

    Exact catalog ids win; otherwise the first rule in ``_GPU_RULES`` whose key occurs in the
    lower-cased name with spaces removed and 'sxm4'/'sxm5'/'sxm' dropped ('NVIDIA GB300', as nvidia-smi prints it,
    is ``gb300``: a rule's id is used where the catalog has it). GH200 (96/144 GB HBM with LPDDR) and AMD MI250X have
    no catalog entry and give None.
    """
    cat = catalog or default_catalog()
    raw = text.strip().lower()
    if raw in cat.gpus:
        return raw
    n = raw.split("(")[0].replace(" ", "").replace("nvidia", "").replace("amd", "")
    n = re.sub(r"-?sxm\d?", "", n)
    n = n.replace("a100-40gb", "a10040").replace("a100-80gb", "a100")
    for key, gid in _GPU_RULES:
        if key in n:
            return gid if gid is None or gid in cat.gpus else None
    return None


def _model_keys(catalog: Catalog) -> dict[str, str]:
    keys: dict[str, str] = {}
    for mid in catalog.models:
        keys[mid] = mid
        repo = str(catalog.model_meta.get(mid, {}).get("hf_repo", ""))
        if repo:
            base = repo.lower().split("/")[-1]
            for variant in (repo.lower(), base, re.sub(r"-(instruct|hf|chat-hf|chat|base)(?=-|$)", "", base)):
                keys.setdefault(variant, mid)
    return keys


def resolve_model(text: str, catalog: Catalog | None = None) -> str | None:
    """'Llama-2-7B (doc: "LLaMA 7B")', 'Mixtral-8x7B-v0.1', 'meta-llama/Llama-3.1-8B-Instruct' -> catalog id."""
    cat = catalog or default_catalog()
    keys = _model_keys(cat)
    n = text.strip().split(" (")[0].strip().lower()
    for cand in (n, n.split("/")[-1]):
        if cand in keys:
            return keys[cand]
        stripped = re.sub(r"-(instruct|hf|chat-hf|chat|base)(?=-|$)", "", cand)
        stripped = re.sub(r"-v\d+(\.\d+)?$", "", stripped)
        if stripped in keys:
            return keys[stripped]
    return None


# -- prediction -----------------------------------------------------------------------------------
def deployment(m: Measurement, profile: EngineProfile, catalog: Catalog | None = None) -> Deployment:
    """The replica the measurement ran on, with ``profile``'s efficiencies (its GPU family's where fitted)."""
    cat = catalog or default_catalog()
    ld = m.load
    max_len = max(ld.context_tokens, ld.prompt_tokens + ld.output_tokens, 1)
    return build_deployment(model=cat.model(m.model), gpu=cat.gpu(m.gpu), tp=m.tp, weight_dtype=m.weight_dtype,
                            kv_dtype=m.kv_dtype, profile=profile, limits=m.limits,
                            gpu_memory_utilization=m.gpu_memory_utilization, cuda_graphs=m.cuda_graphs,
                            max_model_len=max_len, dp=m.dp, ep=m.ep,
                            spec=SpecDecode(num_speculative_tokens=m.spec_tokens, acceptance_rate=m.acceptance_rate,
                                            acceptance_source="the run's spec_decode counters") if m.spec_tokens else None)


def _pick(est: Estimate, quantity: str) -> float:
    if quantity == "output_tokens_per_s":
        return est.output_tokens_per_s
    if quantity == "ttft_s":
        return est.ttft_s
    if quantity == "tpot_s":
        return est.tpot_s
    if quantity == "e2e_s":
        return est.e2e_s if est.e2e_s is not None else est.ttft_s
    raise ValueError(quantity)


def run_load(m: Measurement) -> Load:
    """The typed load of a benchmark run (``finite``: ``requests`` at ``rate_per_s``, capped by the client)."""
    ld = m.load
    return Load.finite(requests=m.requests or max(ld.batch, 1), prompt_tokens=ld.prompt_tokens,
                       output_tokens=ld.output_tokens, rate_per_s=m.rate_per_s or math.inf, concurrency=ld.batch)


def in_flight(dep: Deployment, m: Measurement) -> float:
    """Mean requests in flight during the run (:func:`recommender.estimator.in_flight`)."""
    return _in_flight(dep, run_load(m))


def _run_level(dep: Deployment, m: Measurement, n: float | None = None) -> float:
    """A ``vllm bench serve`` figure: the finite run (:func:`recommender.estimator.finite_run`)."""
    run = finite_run(dep, run_load(m), n)
    if m.quantity == "ttft_s":
        return run.ttft_s
    if m.quantity == "tpot_s":
        return run.tpot_s
    if m.quantity == "e2e_s":
        return run.e2e_s
    if m.requests:
        return run.output_tokens_per_s
    return run.in_flight * m.load.output_tokens / run.e2e_s


def _with_profile(d: Deployment, profile: EngineProfile) -> Deployment:
    p = profile.for_gpu(d.gpu.id, d.model.id)
    return d if d.profile is p else dataclasses.replace(d, profile=p)


def predict(m: Measurement, profile: EngineProfile, catalog: Catalog | None = None,
            dep: Deployment | None = None) -> float:
    """The model's value of ``m.quantity`` for this configuration and load, in SI units."""
    d = _with_profile(dep if dep is not None else deployment(m, profile, catalog), profile)
    if m.quantity in ("itl_intercept_s", "itl_slope_s_per_token"):
        cost = StepCostModel.build(d)
        t0 = cost.decode_step_s(1, 1)
        if m.quantity == "itl_intercept_s":
            return t0
        return (cost.decode_step_s(1, SLOPE_CONTEXT_TOKENS + 1) - t0) / SLOPE_CONTEXT_TOKENS
    if m.rate_per_s or m.requests:
        value = _run_level(d, m)
    else:
        value = _pick(estimate(d, m.load), m.quantity)
    return value if math.isfinite(value) else float("nan")


def predict_many(ms: list[Measurement], profile: EngineProfile, deps: list[Deployment]) -> list[float]:
    """:func:`predict` for many rows; rows of one benchmark run share one :func:`in_flight` solve."""
    out: list[float] = []
    solved: dict[tuple, float] = {}
    for m, d0 in zip(ms, deps):
        if (m.rate_per_s or m.requests) and m.quantity in ("output_tokens_per_s", "ttft_s", "tpot_s", "e2e_s"):
            d = _with_profile(d0, profile)
            key = (m.file, m.source, m.model, m.gpu, m.tp, m.dp, m.ep, m.spec_tokens, m.acceptance_rate, m.weight_dtype, m.kv_dtype, m.load, m.limits,
                   m.gpu_memory_utilization, m.cuda_graphs, m.rate_per_s, m.requests)
            if key not in solved:
                solved[key] = in_flight(d, m)
            v = _run_level(d, m, solved[key])
            out.append(v if math.isfinite(v) else float("nan"))
        else:
            out.append(predict(m, profile, dep=d0))
    return out


__all__ = ["closed_at", "in_flight", "run_load", "predict_many", "Measurement", "Skip", "QUANTITIES", "parse_metric", "resolve_gpu", "resolve_model", "deployment",
           "predict"]
