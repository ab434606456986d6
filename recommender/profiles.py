"""Per-engine efficiency profiles: the few physical parameters that turn datasheet roofs into real times.

Profiles are data (``catalogs/profiles/<engine>.yaml``); ``recommend calibrate`` writes new ones and
every command takes ``--profile FILE``. Parameters (all fractions in (0, 1], times in seconds):

- ``hbm_bandwidth_efficiency``: achieved / datasheet HBM bandwidth for weight and KV streaming.
- ``compute_efficiency``: achieved / dense datasheet FLOP/s for the GEMMs and attention (prefill MFU).
- ``allreduce_latency_s``: fixed cost of one tensor-parallel all-reduce over NVLink / xGMI.
- ``allreduce_latency_pcie_s``: the same over PCIe.
- ``allreduce_bandwidth_efficiency``: achieved / datasheet one-direction link bandwidth in the ring.
- ``step_overhead_s``: per engine step with CUDA graphs (scheduling, sampling, launch of the graph).
- ``layer_launch_overhead_s``: extra per layer per step without CUDA graphs (eager kernel launches).
- ``runtime_reserve_bytes_per_gpu``: CUDA context, NCCL and library workspaces outside the KV cache.
- ``cuda_graph_bytes_per_gpu``: memory held by captured CUDA graphs.
- ``request_overhead_s``: fixed time every request adds to its first token (API server, tokenisation,
  scheduling into the next step, the first streamed chunk); 0 for offline engines' own timers.
- ``server_request_overhead_s``: fixed time (s per request) the engine's HTTP serving front end adds to a
  client-timed TTFT (``sglang.launch_server`` / ``trtllm-serve``: request parsing, tokenisation, the hand-off
  from the tokenizer process to the scheduler, the first streamed chunk back through the detokenizer). Fitted per
  engine x GPU family on InferenceX (``benchmarks/fit_inferencex.py`` stage B); added to ``request_overhead_s``
  unless the limits say the figures are the engine's own timer (``EngineLimits.engine_timer``: trtllm-bench,
  static-batch tables), so the offline rows the rest of the profile was fitted on do not see it.
- ``first_wave_overhead_s``: fixed time (s) the first wave of a benchmark run waits before the engine serves it at
  its steady speed: the requests a closed-loop client sends at once when the run starts (``vllm bench serve
  --max-concurrency N --request-rate inf``) find a cold server (SGLang on MI300X reads 3-8 s of first-wave TTFT
  beyond its prefills at concurrency 4, with 2 x N warm-up requests before the run). It moves a run's mean TTFT by
  ``N / M`` of it and its median not at all; steady-state plans never see it. Fitted per engine x GPU family on
  InferenceX's rows that publish a mean TTFT (``benchmarks/fit_inferencex.py`` stage B); 0 = a warm server.
- ``prefill_step_overhead_s``: fixed time of every step that carries prefill tokens (such steps are not
  CUDA-graph captured: per-layer launches of the attention kernels, the TP collectives' latency).
- ``gemm_m_half_tokens``: tokens in a step at which the weight GEMMs reach half of
  ``compute_efficiency`` (``eff(M) = compute_efficiency x M / (M + M_half)``; 0 = flat).
- ``moe_layer_overhead_s``: fixed time of every MoE layer in every step, CUDA graphs or not (router, top-k,
  token permute / unpermute, grouped-GEMM launches: work that does not scale with bytes); 0 for dense models.
- ``expert_bandwidth_efficiency``: share of ``hbm_bandwidth_efficiency`` the routed-expert grouped GEMMs reach
  (few tokens per expert: short, many GEMMs); 1 = as fast per byte as dense weights.
- ``expert_compute_efficiency``: share of the GEMMs' compute rate (``compute_efficiency``) the routed-expert grouped
  GEMMs reach where they are compute-bound (MoE prefill: many experts of uneven size, the permute between them);
  1 = as fast per FLOP as dense GEMMs. MoE models only.
- ``dp_balance_timeout_steps``: with data-parallel attention, the engine holds a new prompt until every attention
  rank has one to prefill together, at most this many steps (TensorRT-LLM ``attention_dp_config.enable_balance``
  with ``timeout_iters``); 0 = prefill at once (vLLM). ``perf.moe.balance_wait_s``.
- ``layer_overhead_s``: fixed time per layer per step WITH CUDA graphs too (the gaps between a layer's
  kernels, its synchronisations); without graphs ``layer_launch_overhead_s`` adds to it.
- ``fp8_gemm_efficiency_ratio``: achieved fraction of the 8-bit (fp8 / int8) tensor-core peak over the
  achieved fraction of the 16-bit peak (``compute_efficiency``); 1 = the dtype's peak ratio alone.
- ``fp4_gemm_efficiency_ratio``: the same for fp4 (W4A4) GEMMs.
- ``attention_efficiency_ratio``: achieved fraction of the peak in the attention kernels over the GEMMs'
  (``compute_efficiency``); 1 = the same.
- ``gemm_curve_hidden_fraction``: how much of the GEMM curve's small-M loss a memory-bound GEMM hides under
  its weight stream (1: all of it, NVIDIA decode runs at bandwidth; 0: none, as MI300X fp8 decode, whose
  steps grow with every sequence from batch 1). 0 in profiles written before it existed.

An engine with no measurements of a model may borrow that model's per-model terms from another engine's fit on the
same GPU family (``borrow_model_terms:``, :class:`BorrowedTerms`): vLLM takes DeepSeek-V3 / R1's routed-expert terms
from SGLang's InferenceX fit, whose fused-MoE kernel is adapted from vLLM's. Borrowed terms move the prediction's
centre only: the plan's error band stays that of the engine's own evidence (no rows: the wide prior).

The all-reduce uses the interconnect's measured bus bandwidth where the GPU catalog has one
(``interconnect.allreduce_busbw``); ``allreduce_bandwidth_efficiency`` applies only where it has none.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping


from recommender.catalog import catalog_dir
from recommender.errors import CatalogError, ConfigError
from recommender.yamlfile import read_yaml_file

FIT_PARAMETERS = (
    "hbm_bandwidth_efficiency", "compute_efficiency", "allreduce_latency_s",
    "allreduce_latency_pcie_s", "allreduce_bandwidth_efficiency", "step_overhead_s", "layer_launch_overhead_s",
    "request_overhead_s",
)
#: Parameters of the prefill-step fixed cost and the GEMM efficiency curve (fitted by
#: benchmarks/fit_profiles.py where they lower the held-out error; ``--parameters`` on calibrate).
SHAPE_PARAMETERS = ("prefill_step_overhead_s", "gemm_m_half_tokens")
#: The routed experts' terms: one MoE model's own (a family's ``models.<id>`` block; ``recommend calibrate`` fits them
#: on rows of one MoE model and writes them there, never as the family's).
MOE_PARAMETERS = ("moe_layer_overhead_s", "expert_bandwidth_efficiency", "expert_compute_efficiency")
#: Terms of round 3 (issue 22): per-layer time under CUDA graphs, low-precision GEMM efficiency.
KERNEL_PARAMETERS = ("layer_overhead_s", "fp8_gemm_efficiency_ratio", "fp4_gemm_efficiency_ratio",
                     "gemm_curve_hidden_fraction", "attention_efficiency_ratio")

#: Physical bounds for every parameter (calibration keeps fits inside them).
BOUNDS: Mapping[str, tuple[float, float]] = {
    "hbm_bandwidth_efficiency": (0.3, 1.0),
    "compute_efficiency": (0.1, 0.95),
    "allreduce_latency_s": (1e-6, 200e-6),
    "allreduce_latency_pcie_s": (5e-6, 1e-3),
    "allreduce_bandwidth_efficiency": (0.2, 1.0),
    "step_overhead_s": (0.0, 20e-3),
    "layer_launch_overhead_s": (0.0, 500e-6),
    "runtime_reserve_bytes_per_gpu": (0.0, 20e9),
    "cuda_graph_bytes_per_gpu": (0.0, 10e9),
    "request_overhead_s": (0.0, 0.2),
    "server_request_overhead_s": (0.0, 0.3),
    "first_wave_overhead_s": (0.0, 15.0),
    "prefill_step_overhead_s": (0.0, 50e-3),
    "gemm_m_half_tokens": (0.0, 4096.0),
    "moe_layer_overhead_s": (0.0, 500e-6),
    "expert_bandwidth_efficiency": (0.1, 1.0),
    "expert_compute_efficiency": (0.1, 1.0),
    "dp_balance_timeout_steps": (0.0, 1000.0),
    "layer_overhead_s": (0.0, 200e-6),
    "fp8_gemm_efficiency_ratio": (0.3, 1.05),   # x compute_efficiency <= 0.95 stays below the peak
    "fp4_gemm_efficiency_ratio": (0.2, 1.05),
    "gemm_curve_hidden_fraction": (0.0, 1.0),
    "attention_efficiency_ratio": (0.2, 1.0),
}


def release_key(release: str) -> tuple[int, ...] | None:
    """``"0.5.2"`` / ``"v0.5.5.post3"`` -> (0, 5, 2) / (0, 5, 5): the first dotted number of an engine release, for
    ordering; None when there is none."""
    m = re.search(r"(\d+(?:\.\d+)+)", release)
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


@dataclass(frozen=True)
class ReleaseFit:
    """Parameters of engine releases older than ``before`` on one GPU family (overrides of the family's, which
    describe the current releases): kernels that a later release replaced, measured on those releases' rows."""

    before: str
    rows: int
    parameters: tuple[tuple[str, float], ...]
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"before": self.before, "rows": self.rows, "source": self.source, "parameters": dict(self.parameters)}


@dataclass(frozen=True)
class ModelFit:
    """Parameters fitted on one model's measurements of a single configuration on one GPU family (``recommend
    calibrate`` on the results of one run): overrides of the family's, for that model only. One configuration cannot
    tell bandwidth, per-step overhead and collectives apart, so what its fit says holds for the model it measured, not
    for the engine's other models on the family (``docs/accuracy.md``, "`calibrate` that generalises")."""

    model: str
    rows: int
    parameters: tuple[tuple[str, float], ...]
    source: str = ""
    #: the engine whose fit these parameters are (:meth:`EngineProfile.borrowed_fit`); "" = this engine's own rows
    borrowed_from: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "source": self.source, "parameters": dict(self.parameters)}


@dataclass(frozen=True)
class BorrowedTerms:
    """Per-model parameters an engine without measurements of a model takes from ``engine``'s fit of that model on
    the same GPU family (the donor's ``families.<f>.models.<model>``), where the two engines run the same kernels for
    the work those parameters describe. Only ``parameters`` are borrowed, and only those the borrower's own family or
    model fit does not set; the donor's own fits only (one hop: what the donor borrows is not passed on)."""

    engine: str
    parameters: tuple[str, ...]
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "parameters": list(self.parameters), "reason": self.reason}


@dataclass(frozen=True)
class FamilyFit:
    """Parameters fitted on one GPU family's measurements (overrides of the engine profile)."""

    family: str
    rows: int
    parameters: tuple[tuple[str, float], ...]
    source: str = ""
    releases: tuple[ReleaseFit, ...] = ()
    #: MoE rows' error held out by whole configuration (``benchmarks/fit_inferencex.py``: rows, configurations,
    #: ttft_mape_pct, tpot_mape_pct, output_tput_mape_pct), every release epoch of the family; () = not measured
    held_out_inferencex: tuple[tuple[str, float], ...] = ()
    #: per-model overrides of these parameters (:class:`ModelFit`), by catalog model id
    models: tuple[ModelFit, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"rows": self.rows, "source": self.source, "parameters": dict(self.parameters)}
        if self.releases:
            d["releases"] = [r.to_dict() for r in self.releases]
        if self.held_out_inferencex:
            d["held_out_inferencex"] = dict(self.held_out_inferencex)
        if self.models:
            d["models"] = {m.model: m.to_dict() for m in self.models}
        return d

    def model_fit(self, model_id: str) -> ModelFit | None:
        """The override for ``model_id`` (a catalog model id), or None."""
        return next((m for m in self.models if m.model == model_id), None) if model_id else None

    def release_fit(self, release: str) -> ReleaseFit | None:
        """The override for an engine ``release`` (the one with the lowest ``before`` above it), or None: a
        release at or past every ``before``, or one that does not parse, runs the family's current parameters."""
        key = release_key(release) if release else None
        if key is None:
            return None
        older = [r for r in self.releases if (b := release_key(r.before)) is not None and key < b]
        return min(older, key=lambda r: release_key(r.before) or ()) if older else None


def gpu_family(gpu_id: str) -> str:
    """The GPU's family = its catalog architecture (``vllm.arch``: ampere, ada, hopper, blackwell, cdna3, ...),
    or "" for a GPU the shipped catalog does not have."""
    from recommender.catalog import default_catalog
    from recommender.errors import RecommenderError

    cat = default_catalog()
    known = cat.gpus.get(gpu_id)  # an id (the search's case): no name lookup
    if known is not None:
        return known.arch
    try:
        return cat.gpu(gpu_id).arch
    except RecommenderError:
        return ""


@dataclass(frozen=True)
class HeldOutEvidence:
    """How well a profile predicts a GPU family's measurements it was not fitted on (whole configurations held out)."""

    family: str
    rows: int                 # measured rows of this engine on the family
    configurations: int       # distinct (model, GPU, TP) among them
    median_ape_pct: float     # held-out absolute percentage error, median
    p90_ape_pct: float


@dataclass(frozen=True)
class EngineProfile:
    """Efficiency parameters of one serving engine (see module docstring for meanings and units)."""

    engine: str = "vllm"
    hbm_bandwidth_efficiency: float = 0.80
    compute_efficiency: float = 0.55
    allreduce_latency_s: float = 12e-6
    allreduce_latency_pcie_s: float = 40e-6
    allreduce_bandwidth_efficiency: float = 0.7
    step_overhead_s: float = 1.0e-3
    layer_launch_overhead_s: float = 60e-6
    runtime_reserve_bytes_per_gpu: float = 0.5e9
    cuda_graph_bytes_per_gpu: float = 0.5e9
    request_overhead_s: float = 0.0
    server_request_overhead_s: float = 0.0
    first_wave_overhead_s: float = 0.0
    prefill_step_overhead_s: float = 0.0
    gemm_m_half_tokens: float = 0.0
    moe_layer_overhead_s: float = 0.0
    expert_bandwidth_efficiency: float = 1.0
    expert_compute_efficiency: float = 1.0
    dp_balance_timeout_steps: float = 0.0
    layer_overhead_s: float = 0.0
    fp8_gemm_efficiency_ratio: float = 1.0
    fp4_gemm_efficiency_ratio: float = 1.0
    gemm_curve_hidden_fraction: float = 0.0
    attention_efficiency_ratio: float = 1.0
    source: str = ""
    fit: Mapping[str, Any] = field(default_factory=dict, compare=False)
    families: tuple[FamilyFit, ...] = ()
    family: str = ""              # the family this profile was specialised to ("" = the engine profile)
    borrow_model_terms: BorrowedTerms | None = None  # per-model terms taken from another engine's fit

    def replace(self, **kw: Any) -> "EngineProfile":
        return dataclasses.replace(self, **kw)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
             if f.name not in ("fit", "families", "borrow_model_terms")}
        if self.borrow_model_terms is not None:
            d["borrow_model_terms"] = self.borrow_model_terms.to_dict()
        if self.fit:
            d["fit"] = dict(self.fit)
        if self.families:
            d["families"] = {f.family: f.to_dict() for f in self.families}
        return d

    def family_fit(self, gpu_id: str) -> FamilyFit | None:
        fam = gpu_family(gpu_id)
        return next((f for f in self.families if f.family == fam), None) if fam else None

    def evidence(self, gpu_id: str) -> tuple[str, int]:
        """(family, measured rows behind its parameters); 0 rows: the GPU falls back to the engine profile."""
        f = self.family_fit(gpu_id)
        return (f.family, f.rows) if f is not None else (gpu_family(gpu_id), 0)

    def held_out_evidence(self, gpu_id: str) -> HeldOutEvidence | None:
        """Held-out error (whole configurations left out) of this profile on the GPU's family, as
        ``benchmarks/fit_profiles.py`` recorded it in ``fit.held_out_by_config.by_family``; None when not measured."""
        fam = gpu_family(gpu_id)
        block = self.fit.get("held_out_by_config") if isinstance(self.fit, Mapping) else None
        fams = block.get("by_family") if isinstance(block, Mapping) else None
        d = fams.get(fam) if isinstance(fams, Mapping) and fam else None
        if not isinstance(d, Mapping):
            return None
        return HeldOutEvidence(family=fam, rows=int(d.get("rows") or 0), configurations=int(d.get("configurations") or 0),
                               median_ape_pct=float(d.get("median_ape_pct") or 0.0),
                               p90_ape_pct=float(d.get("p90_ape_pct") or 0.0))

    def borrowed_fit(self, gpu_id: str, model_id: str) -> ModelFit | None:
        """The terms this profile borrows for ``model_id`` on ``gpu_id``'s family (:class:`BorrowedTerms`): the
        donor engine's own fit of that model on the family, cut to the borrowed parameters that this profile's family
        and model fits do not set; None where nothing is borrowed (no rule, no donor fit, or all set here)."""
        rule = self.borrow_model_terms
        if rule is None or not model_id:  # most profiles: no rule, no catalog lookup (every deployment's build)
            return None
        fam = gpu_family(gpu_id)
        if not fam:
            return None
        donor = engine_profile(rule.engine).family_fit(gpu_id)
        theirs = donor.model_fit(model_id) if donor is not None else None
        if theirs is None:
            return None
        f = self.family_fit(gpu_id)
        m = f.model_fit(model_id) if f is not None else None
        mine = set(dict(f.parameters) if f is not None else {}) | set(dict(m.parameters) if m is not None else {})
        params = tuple((k, v) for k, v in theirs.parameters if k in rule.parameters and k not in mine)
        if not params:
            return None
        return ModelFit(model_id, theirs.rows, params, f"{rule.engine}'s {fam} fit ({rule.reason}): {theirs.source}",
                        borrowed_from=rule.engine)

    def borrowed_note(self, gpu_id: str, model_id: str) -> str:
        """"sglang's hopper fit: 75 rows": whose fit :meth:`borrowed_fit` takes terms from, "" where none."""
        lent = self.borrowed_fit(gpu_id, model_id)
        return "" if lent is None else f"{lent.borrowed_from}'s {gpu_family(gpu_id)} fit: {lent.rows} rows"

    def _overrides(self, gpu_id: str, model_id: str, release: str | None = None) -> tuple[FamilyFit | None, dict[str, Any]]:
        """(family fit, parameters over the engine's): borrowed terms, then the family's, its ``model_id`` override,
        and (``release``) its override for older releases, each later one winning."""
        f, lent = self.family_fit(gpu_id), self.borrowed_fit(gpu_id, model_id)
        m = f.model_fit(model_id) if f is not None else None
        r = f.release_fit(release) if f is not None and release is not None else None
        kw: dict[str, Any] = {}
        for part in (lent, f, m, r):
            kw.update(dict(part.parameters) if part is not None else {})
        return f, kw

    def for_gpu(self, gpu_id: str, model_id: str = "") -> "EngineProfile":
        """This profile with the GPU family's fitted parameters, then the family's override for ``model_id``
        (:class:`ModelFit`) where it has one, over any terms it borrows for the model (:meth:`borrowed_fit`); itself
        when there is none of these."""
        f, kw = self._overrides(gpu_id, model_id)
        if f is None and not kw:
            return self
        return dataclasses.replace(self, family=f.family if f is not None else self.family, **kw)

    def for_release(self, gpu_id: str, release: str, model_id: str = "") -> "EngineProfile":
        """This profile on ``gpu_id`` as engine ``release`` ran it: the terms it borrows for ``model_id``, the family's
        parameters, its override for ``model_id`` (:class:`ModelFit`), then the family's override for releases older
        than its ``before`` (:meth:`FamilyFit.release_fit`). The result has no ``families`` or borrowing left (it is
        fully specialised: a later :meth:`for_gpu` leaves it as it is)."""
        f, kw = self._overrides(gpu_id, model_id, release)
        if f is None and not kw:
            return self
        return dataclasses.replace(self, family=f.family if f is not None else self.family, families=(),
                                   borrow_model_terms=None, **kw)


def profile_from_doc(doc: Mapping[str, Any], where: str) -> EngineProfile:
    if not isinstance(doc, Mapping):
        raise ConfigError(f"profile {where} must be a YAML mapping")
    params = dict(doc.get("parameters") or {})
    known = {f.name for f in dataclasses.fields(EngineProfile)}
    known -= {"families", "family", "fit", "engine", "source", "borrow_model_terms"}
    unknown = set(params) - known
    if unknown:
        import difflib

        first = sorted(unknown)[0]
        close = difflib.get_close_matches(first, sorted(known), n=1, cutoff=0.6)
        hint = f"; did you mean '{close[0]}'?" if close else f"; known: {', '.join(sorted(known))}"
        raise ConfigError(f"profile {where}: unknown parameter(s) {', '.join(sorted(unknown))}{hint}")
    for k, v in params.items():
        lo, hi = BOUNDS.get(k, (float("-inf"), float("inf")))
        if not isinstance(v, (int, float)) or not lo <= float(v) <= hi:
            raise ConfigError(f"profile {where}: {k}={v!r} outside its physical range [{lo:g}, {hi:g}]")
    fams = []
    for fam, fd in sorted((doc.get("families") or {}).items()):
        if not isinstance(fd, Mapping):
            raise ConfigError(f"profile {where}: families.{fam} must be a mapping with rows and parameters")
        fp = dict(fd.get("parameters") or {})
        fams.append(FamilyFit(str(fam), int(fd.get("rows") or 0), _checked(fp, known, f"{where}: families.{fam}"),
                              str(fd.get("source") or ""), _releases(fd.get("releases"), known, f"{where}: families.{fam}"),
                              models=_models(fd.get("models"), known, f"{where}: families.{fam}"),
                              held_out_inferencex=_figures(fd.get("held_out_inferencex"),
                                                           f"{where}: families.{fam}.held_out_inferencex")))
    values: dict[str, Any] = {k: float(v) for k, v in params.items()}
    fit = doc.get("fit") or {}
    if not isinstance(fit, Mapping):
        raise ConfigError(f"profile {where}: fit must be a mapping (what `recommend calibrate` wrote); delete it or "
                          "calibrate again")
    _check_classes(fit.get("classes"), where)
    engine = str(doc.get("engine", "vllm"))
    return EngineProfile(engine=engine, source=str(doc.get("source", where)), fit=fit, families=tuple(fams),
                         borrow_model_terms=_borrowing(doc.get("borrow_model_terms"), known, engine, where), **values)


def _borrowing(doc: Any, known: set[str], engine: str, where: str) -> BorrowedTerms | None:
    """``borrow_model_terms: {engine, parameters, reason}`` (:class:`BorrowedTerms`), checked: a shipped engine
    other than this one, and parameters the profile knows."""
    if doc is None:
        return None
    at = f"profile {where}: borrow_model_terms"
    params = doc.get("parameters") if isinstance(doc, Mapping) else None
    donor = doc.get("engine") if isinstance(doc, Mapping) else None
    if not isinstance(donor, str) or not isinstance(params, list) or not all(isinstance(p, str) for p in params):
        raise ConfigError(f"{at} needs engine (a name) and parameters (a list of names); delete it or fix it")
    unknown = sorted(set(params) - known)
    if unknown:
        raise ConfigError(f"{at}: unknown parameter(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    if donor == engine or not (profile_dir() / f"{donor}.yaml").exists():
        names = sorted(p.stem for p in profile_dir().glob("*.yaml") if p.stem != engine)
        raise ConfigError(f"{at}: engine {donor!r} is not another shipped engine; valid: {', '.join(names)}")
    return BorrowedTerms(donor, tuple(params), str(doc.get("reason") or ""))


def _check_classes(doc: Any, where: str) -> None:
    """``fit.classes`` (the error bands' evidence, ``recommender.search.bands``): a list of mappings with string
    ``family``, ``dtype``, ``model_class``, a whole ``rows`` >= 0 and ``held_out.median_ape_pct`` >= 0 where given."""
    if doc is None:
        return
    fix = "fix it or delete fit.classes (calibrate again to rewrite it)"
    if not isinstance(doc, list):
        raise ConfigError(f"profile {where}: fit.classes must be a list of mappings; {fix}")
    for i, c in enumerate(doc):
        at = f"profile {where}: fit.classes[{i}]"
        if not isinstance(c, Mapping) or not all(isinstance(c.get(k), str) for k in ("family", "dtype", "model_class")):
            raise ConfigError(f"{at} needs family, dtype and model_class (strings); {fix}")
        rows, ho = c.get("rows", 0), c.get("held_out") or {}
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
            raise ConfigError(f"{at}.rows {rows!r} is not a whole number >= 0; {fix}")
        m = ho.get("median_ape_pct") if isinstance(ho, Mapping) else ho
        if m is not None and (isinstance(m, bool) or not isinstance(m, (int, float)) or not 0 <= m < 1e6):
            raise ConfigError(f"{at}.held_out.median_ape_pct {m!r} is not a percentage >= 0; {fix}")


def _checked(params: Mapping[str, Any], known: set[str], where: str) -> tuple[tuple[str, float], ...]:
    """A family's (or release's) parameters, each known and inside its physical range, sorted by name."""
    for k, v in params.items():
        lo, hi = BOUNDS.get(k, (float("-inf"), float("inf")))
        if k not in known or not isinstance(v, (int, float)) or not lo <= float(v) <= hi:
            raise ConfigError(f"profile {where}.{k}={v!r} unknown or outside [{lo:g}, {hi:g}]")
    return tuple(sorted((k, float(v)) for k, v in params.items()))


def _figures(doc: Any, where: str) -> tuple[tuple[str, float], ...]:
    """A mapping of numbers (held-out figures), in file order; () when absent."""
    if doc is None:
        return ()
    if not isinstance(doc, Mapping) or not all(isinstance(v, (int, float)) for v in doc.values()):
        raise ConfigError(f"profile {where} must be a mapping of numbers")
    return tuple((str(k), float(v)) for k, v in doc.items())


def _releases(doc: Any, known: set[str], where: str) -> tuple[ReleaseFit, ...]:
    """``releases:`` of a family: a list of ``{before, rows, source, parameters}``, ``before`` a dotted release."""
    if doc is None:
        return ()
    if not isinstance(doc, list):
        raise ConfigError(f"profile {where}.releases must be a list of mappings with before and parameters")
    out = []
    for i, rd in enumerate(doc):
        before = str(rd.get("before") or "") if isinstance(rd, Mapping) else ""
        if release_key(before) is None:
            raise ConfigError(f"profile {where}.releases[{i}] needs before: a release such as '0.5.5'")
        out.append(ReleaseFit(before, int(rd.get("rows") or 0),
                              _checked(dict(rd.get("parameters") or {}), known, f"{where}.releases[{i}]"),
                              str(rd.get("source") or "")))
    return tuple(out)


def _models(doc: Any, known: set[str], where: str) -> tuple[ModelFit, ...]:
    """``models:`` of a family: a mapping of catalog model id -> ``{rows, source, parameters}``."""
    if doc is None:
        return ()
    if not isinstance(doc, Mapping) or not all(isinstance(v, Mapping) for v in doc.values()):
        raise ConfigError(f"profile {where}.models must map model ids to mappings with rows and parameters")
    return tuple(ModelFit(str(mid), int(md.get("rows") or 0),
                          _checked(dict(md.get("parameters") or {}), known, f"{where}.models.{mid}"),
                          str(md.get("source") or "")) for mid, md in sorted(doc.items()))


def load_profile(path: str | Path) -> EngineProfile:
    """A profile file (``recommend calibrate --out``): a mapping with a ``parameters`` mapping; any other YAML
    (a workload given by mistake) is refused instead of silently meaning the defaults."""
    doc = read_yaml_file(path, "profile")
    if not isinstance(doc, Mapping) or not isinstance(doc.get("parameters"), Mapping):
        raise ConfigError(f"profile {path} has no 'parameters' mapping; give a file written by `recommend calibrate --out`")
    return profile_from_doc(doc, str(path))


def profile_dir() -> Path:
    return catalog_dir() / "profiles"


@functools.lru_cache(maxsize=16)
def engine_profile(engine: str = "vllm") -> EngineProfile:
    """The shipped default profile for an engine (``catalogs/profiles/<engine>.yaml``)."""
    path = profile_dir() / f"{engine}.yaml"
    if not path.exists():
        names = sorted(p.stem for p in profile_dir().glob("*.yaml"))
        raise CatalogError(f"unknown engine {engine!r}; valid engines: {', '.join(names)}")
    return load_profile(path)


def resolve_profile(engine: str = "vllm", profile_file: str | Path | None = None) -> EngineProfile:
    """``--profile FILE`` wins over ``--engine NAME``."""
    return load_profile(profile_file) if profile_file else engine_profile(engine)
