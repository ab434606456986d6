"""The documented Python entry points (re-exported by ``recommender``).

Each function imports its library lazily, so ``import recommender`` (and the CLI, which imports the
package) stays fast: the search pulls in Optuna and SQLAlchemy, the load model NumPy and SciPy.
``recommend`` takes the arguments after the workload by keyword only, ``simulate`` those after ``cost`` and
``limits``, ``estimate`` keywords only. Every argument is checked as the CLI checks its flag, before any work: a wrong
type or a value out of the CLI's bounds raises :class:`~recommender.errors.ConfigError` in one line
(docs/python-api.md).
"""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Any

from recommender.bounded import MAX_SEED, MAX_VERIFY
from recommender.errors import ConfigError

if TYPE_CHECKING:
    from recommender.catalog import Catalog
    from recommender.load.protocols import LengthDistribution, Limits, StepCost
    from recommender.load.simulator import SimResult
    from recommender.perf.steady import Estimate
    from recommender.plan import Plan
    from recommender.profiles import EngineProfile
    from recommender.search.policy import SearchPolicy
    from recommender.workload import Workload



def _show(value: object) -> str:
    """``repr(value)`` cut to 40 characters (a 1 MB string is not echoed; repr escapes control characters)."""
    try:
        text = repr(value)
    except ValueError:  # an int of more than 4,300 digits has no str()
        return f"<{type(value).__name__} too long to show>"
    return text if len(text) <= 40 else text[:37] + "..."


def _int_arg(fn: str, name: str, value: object, *, low: int, high: int | None = None, hint: str) -> int:
    """``value`` as an int in [low, high]; a bool, float or string is refused (``trials=1.5`` is not 1)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{fn}({name}={_show(value)}): {name} takes an int, not {type(value).__name__}; {hint}")
    n = int(value)
    if n < low or (high is not None and n > high):
        raise ConfigError(f"{fn}({name}={_show(n)}): {hint}")
    return n


def _positive_arg(fn: str, name: str, value: object, *, hint: str) -> float:
    """``value`` as a finite number above 0 (an int or a float; a bool or string is refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{fn}({name}={_show(value)}): {name} takes a number, not {type(value).__name__}; {hint}")
    x = float(value)
    if not (math.isfinite(x) and x > 0):
        raise ConfigError(f"{fn}({name}={_show(value)}): {hint}")
    return x


def _instance_arg(fn: str, name: str, value: object, cls: type, hint: str) -> None:
    if not isinstance(value, cls):
        article = "an" if cls.__name__[:1] in "AEIOU" else "a"
        raise ConfigError(f"{fn}({name}={_show(value)}): {name} takes {article} {cls.__name__}, not "
                          f"{type(value).__name__}; {hint}")


def _storage_arg(storage: object) -> str:
    """An Optuna storage as the CLI's ``--storage`` takes it (:func:`recommender.bounded.check_storage`), a str."""
    from recommender.bounded import check_storage

    if not isinstance(storage, str):
        raise ConfigError(f"recommend(storage={_show(storage)}): storage takes a str (a database URL or a journal "
                          f"file name), not {type(storage).__name__}")
    check_storage(storage, label=f"recommend(storage={_show(storage)})")
    return storage


def recommend(workload: Workload, *, seed: int = 0, trials: int | None = None, timeout_s: float | None = None,
              top: int = 5, verify: int | None = None, storage: str | None = None,
              profile: EngineProfile | None = None, policy: SearchPolicy | None = None,
              catalog: Catalog | None = None, warm_start: Plan | None = None) -> Plan:
    """The ranked Pareto plan for ``workload`` (what ``recommend --workload FILE`` prints).

    ``trials`` / ``timeout_s`` default to the search policy's; ``verify`` is how many top plans the
    simulator checks (policy default 3, 0 = off). The arguments are held to the CLI's bounds (``seed`` 0 to
    2**32 - 1, ``trials`` and ``top`` at least 1, ``timeout_s`` above 0, ``verify`` 0 to 1000) and types: a
    mistake raises :class:`~recommender.errors.ConfigError` before the search. Raises
    :class:`~recommender.errors.InfeasibleError` or :class:`~recommender.errors.DoesNotFitError` when nothing fits.
    """
    from recommender.catalog import Catalog
    from recommender.plan import Plan
    from recommender.profiles import EngineProfile
    from recommender.search.planner import SearchSettings
    from recommender.search.planner import recommend as _recommend
    from recommender.search.policy import SearchPolicy
    from recommender.workload import Workload

    fn = "recommend"
    _instance_arg(fn, "workload", workload, Workload, "read one with recommender.load_workload('workload.yaml')")
    seed = _int_arg(fn, "seed", seed, low=0, high=MAX_SEED, hint=f"give an integer from 0 to {MAX_SEED}")
    if trials is not None:
        trials = _int_arg(fn, "trials", trials, low=1,
                          hint="give a positive number of trials (or None for the search policy's default)")
    if timeout_s is not None:
        timeout_s = _positive_arg(fn, "timeout_s", timeout_s,
                                 hint="give a positive number of seconds (or None for the search policy's default)")
    top = _int_arg(fn, "top", top, low=1, hint="give how many plans to return, at least 1")
    if verify is not None:
        verify = _int_arg(fn, "verify", verify, low=0, high=MAX_VERIFY,
                          hint=f"give how many plans to verify, from 0 (off) to {MAX_VERIFY} (or None for the search "
                               "policy's default)")
    if storage is not None:
        storage = _storage_arg(storage)
    for name, value, cls, hint in (
            ("profile", profile, EngineProfile, "e.g. recommender.profiles.engine_profile('vllm')"),
            ("policy", policy, SearchPolicy, "e.g. recommender.search.policy.load_search_policy()"),
            ("catalog", catalog, Catalog, "e.g. recommender.catalog.default_catalog()"),
            ("warm_start", warm_start, Plan, "e.g. recommender.load_plan('plan.json')")):
        if value is not None:
            _instance_arg(fn, name, value, cls, hint)
    settings = SearchSettings(seed=seed, trials=trials, timeout_s=timeout_s, storage=storage, top=top, verify=verify)
    return _recommend(workload, settings=settings, profile=profile, policy=policy, catalog=catalog,
                      warm_start=warm_start)


def _estimate_request_args(given: dict[str, Any]) -> dict[str, Any]:
    """``estimate``'s arguments checked against :class:`recommender.estimator.EstimateRequest`'s fields: names and
    types (an int where the field is an int, a bool for a switch, ...); the values' bounds are the estimator's."""
    import dataclasses
    import difflib
    import types
    import typing

    from recommender.estimator import EstimateRequest

    hints = typing.get_type_hints(EstimateRequest)
    names = [f.name for f in dataclasses.fields(EstimateRequest)]
    out: dict[str, Any] = {}
    for name, value in given.items():
        if name not in hints:
            close = difflib.get_close_matches(name, names, n=1)
            raise ConfigError(f"estimate({name}=...): unknown argument" + (
                f"; did you mean {close[0]!r}?" if close else f"; the arguments are {', '.join(names)}"))
        hint = hints[name]
        allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        if value is None and type(None) in allowed:
            out[name] = None
            continue
        if isinstance(value, bool):  # a bool is an int to Python, never a count or a size here
            if bool not in allowed:
                raise ConfigError(f"estimate({name}={value}): {name} takes {_names(allowed)}, not bool")
            out[name] = value
        elif name == "concurrency" and isinstance(value, numbers.Integral):
            out[name] = str(int(value))  # an integer, or "max", as --concurrency reads it
        elif int in allowed and isinstance(value, numbers.Integral):
            out[name] = int(value)
        elif float in allowed and isinstance(value, numbers.Real):
            out[name] = float(value)
        elif str in allowed and isinstance(value, str):
            out[name] = value
        else:
            raise ConfigError(f"estimate({name}={_show(value)}): {name} takes {_names(allowed)}, not "
                              f"{type(value).__name__}")
    return out


def _names(types_: tuple[Any, ...]) -> str:
    """``(int, NoneType)`` -> 'int or None'."""
    return " or ".join("None" if t is type(None) else getattr(t, "__name__", str(t)) for t in types_)


def estimate(*, model: str, gpu: str, tp: int = 1, replicas: int = 1, weight_dtype: str | None = None,
             kv_dtype: str = "bf16", **load: Any) -> Estimate:
    """One configuration explained (what ``recommend estimate`` prints): memory, step times, latency,
    throughput and cost. ``load`` takes the other fields of
    :class:`recommender.estimator.EstimateRequest` (``batch``, ``concurrency``, ``context_tokens``,
    ``prompt_tokens``, ``output_tokens``, ``engine``, ``max_num_seqs``, ``checkpoint`` (``--checkpoint``: a repo, ""
    for the model's own quantized at load, None for the catalog's), ...). An unknown argument or one of the
    wrong type (``tp="2"``) raises :class:`~recommender.errors.ConfigError`, as do values the CLI refuses. On a GPU
    without a catalog price and no ``usd_per_gpu_hour``, the cost fields are nan (unknown, not free)."""
    from recommender.estimator import EstimateRequest, estimate_request

    args = _estimate_request_args(dict(model=model, gpu=gpu, tp=tp, replicas=replicas, weight_dtype=weight_dtype,
                                       kv_dtype=kv_dtype, **load))
    return estimate_request(EstimateRequest(**args))[2]


def simulate(cost: StepCost, limits: Limits, *, arrival_rate_per_s: float | None, prompt: LengthDistribution | None,
             output: LengthDistribution | None, n_requests: int, seed: int = 0, **options: Any) -> SimResult:
    """Replay ``n_requests`` seeded requests through the vLLM-like scheduler simulator (one aggregated pool).
    ``options``: ``replicas`` (1), ``shared_prefix_fraction`` (0), ``trace`` (rows ``(arrival_s,
    prompt_tokens, output_tokens)`` replayed instead of the rate and lengths; ``n_requests`` 0 replays them all) and
    :func:`recommender.load.simulate`'s keywords (``burstiness``, ``warmup_requests``, ``sample_interval_s``).
    ``n_requests`` (1 to ``RECOMMENDER_MAX_REQUESTS``, default 2,000,000) and ``seed`` (0 to 2**32 - 1) are held to
    the CLI's bounds."""
    from recommender.bounded import max_requests
    from recommender.load import PoolSpec, Replay, Traffic
    from recommender.load import simulate as _simulate

    fn = "simulate"
    trace = options.pop("trace", None)
    cap = max_requests()
    n_requests = _int_arg(fn, "n_requests", n_requests, low=0 if trace is not None else 1, high=cap,
                          hint=f"give between 1 and {cap:,} requests (raise the limit with RECOMMENDER_MAX_REQUESTS)")
    seed = _int_arg(fn, "seed", seed, low=0, high=MAX_SEED, hint=f"give an integer from 0 to {MAX_SEED}")
    if arrival_rate_per_s is not None:
        arrival_rate_per_s = _positive_arg(fn, "arrival_rate_per_s", arrival_rate_per_s,
                                          hint="give a positive, finite number of requests per second")
    pool = PoolSpec(cost=cost, limits=limits, replicas=int(options.pop("replicas", 1)))
    fraction = float(options.pop("shared_prefix_fraction", 0.0))
    if trace is not None:
        load: Traffic | Replay = Replay(rows=tuple(trace), shared_prefix_fraction=fraction)
    elif arrival_rate_per_s is None or prompt is None or output is None:
        raise ConfigError("simulate needs arrival_rate_per_s, prompt and output length distributions (or a trace)")
    else:
        load = Traffic(rate_per_s=arrival_rate_per_s, prompt=prompt, output=output, shared_prefix_fraction=fraction)
    return _simulate(pool, load, n_requests=n_requests, seed=seed, **options)
