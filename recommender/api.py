"""The documented Python entry points (re-exported by ``recommender``).

Each function imports its library lazily, so ``import recommender`` (and the CLI, which imports the
package) stays fast: the search pulls in Optuna and SQLAlchemy, the load model NumPy and SciPy.
Arguments after the first are keyword-only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from recommender.catalog import Catalog
    from recommender.load.protocols import LengthDistribution, Limits, StepCost
    from recommender.load.simulator import SimResult
    from recommender.perf.steady import Estimate
    from recommender.plan import Plan
    from recommender.profiles import EngineProfile
    from recommender.search.policy import SearchPolicy
    from recommender.workload import Workload


def recommend(workload: Workload, *, seed: int = 0, trials: int | None = None, timeout_s: float | None = None,
              top: int = 5, verify: int | None = None, storage: str | None = None,
              profile: EngineProfile | None = None, policy: SearchPolicy | None = None,
              catalog: Catalog | None = None, warm_start: Plan | None = None) -> Plan:
    """The ranked Pareto plan for ``workload`` (what ``recommend --workload FILE`` prints).

    ``trials`` / ``timeout_s`` default to the search policy's; ``verify`` is how many top plans the
    simulator checks (policy default 3, 0 = off). Raises :class:`~recommender.errors.InfeasibleError`
    or :class:`~recommender.errors.DoesNotFitError` when nothing fits.
    """
    from recommender.search.planner import SearchSettings
    from recommender.search.planner import recommend as _recommend

    settings = SearchSettings(seed=seed, trials=trials, timeout_s=timeout_s, storage=storage, top=top, verify=verify)
    return _recommend(workload, settings=settings, profile=profile, policy=policy, catalog=catalog,
                      warm_start=warm_start)


def estimate(*, model: str, gpu: str, tp: int = 1, replicas: int = 1, weight_dtype: str | None = None,
             kv_dtype: str = "bf16", **load: Any) -> Estimate:
    """One configuration explained (what ``recommend estimate`` prints): memory, step times, latency,
    throughput and cost. ``load`` takes the other fields of
    :class:`recommender.estimator.EstimateRequest` (``batch``, ``concurrency``, ``context_tokens``,
    ``prompt_tokens``, ``output_tokens``, ``engine``, ``max_num_seqs``, ...)."""
    from recommender.estimator import EstimateRequest, estimate_request

    req = EstimateRequest(model=model, gpu=gpu, tp=tp, replicas=replicas, weight_dtype=weight_dtype,
                          kv_dtype=kv_dtype, **load)
    return estimate_request(req)[2]


def simulate(cost: StepCost, limits: Limits, *, arrival_rate_per_s: float | None, prompt: LengthDistribution | None,
             output: LengthDistribution | None, n_requests: int, seed: int = 0, **options: Any) -> SimResult:
    """Replay ``n_requests`` seeded requests through the vLLM-like scheduler simulator (one aggregated pool).
    ``options``: ``replicas`` (1), ``shared_prefix_fraction`` (0), ``trace`` (rows ``(arrival_s,
    prompt_tokens, output_tokens)`` replayed instead of the rate and lengths) and
    :func:`recommender.load.simulate`'s keywords (``burstiness``, ``warmup_requests``, ``sample_interval_s``)."""
    from recommender.errors import ConfigError
    from recommender.load import PoolSpec, Replay, Traffic
    from recommender.load import simulate as _simulate

    pool = PoolSpec(cost=cost, limits=limits, replicas=int(options.pop("replicas", 1)))
    fraction = float(options.pop("shared_prefix_fraction", 0.0))
    trace = options.pop("trace", None)
    if trace is not None:
        load: Traffic | Replay = Replay(rows=tuple(trace), shared_prefix_fraction=fraction)
    elif arrival_rate_per_s is None or prompt is None or output is None:
        raise ConfigError("simulate needs arrival_rate_per_s, prompt and output length distributions (or a trace)")
    else:
        load = Traffic(rate_per_s=arrival_rate_per_s, prompt=prompt, output=output, shared_prefix_fraction=fraction)
    return _simulate(pool, load, n_requests=n_requests, seed=seed, **options)
