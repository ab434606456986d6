"""Optuna encoding of the search: the study the user sees (storage, ``--workers``, dashboard).

Every candidate the shape search (``recommender.search.shapes``) evaluates is recorded as a completed
trial: params = the candidate (categorical distributions over the space's choices), values = the
objectives, constraints under Optuna's ``constraints:<name>`` system attributes (values <= 0 are
satisfied). ``run_study`` is the sampler-driven alternative (NSGA-II over the same encoding), kept for
comparison in the tests and the benchmark.
"""

from __future__ import annotations

import logging
import multiprocessing
import time
from pathlib import Path
from typing import Any, Sequence

import optuna

from recommender import progress
from recommender.errors import ConfigError
from recommender.search.evaluate import Evaluation, SearchContext, evaluate
from recommender.search.policy import StudySettings
from recommender.search.space import Candidate, SpaceChoices

optuna.logging.set_verbosity(logging.WARNING)


def candidate_from_params(p: dict[str, Any]) -> Candidate:
    dis = bool(p.get("disaggregated", False))
    return Candidate(
        gpu=p["gpu"], tp=int(p["tp"]), weight_dtype=p["weight_dtype"], kv_dtype=p["kv_dtype"],
        max_num_seqs=int(p["max_num_seqs"]), max_num_batched_tokens=int(p["max_num_batched_tokens"]),
        disaggregated=dis, decode_gpu=p.get("decode_gpu", "") if dis else "",
        decode_tp=int(p.get("decode_tp", 0)) if dis else 0, pp=int(p.get("pp", 1)),
        dp=int(p.get("data_parallel_size", 1)), ep=bool(p.get("enable_expert_parallel", False)),
        mtp=int(p.get("num_speculative_tokens", 0)),
    )


def params_of(c: Candidate) -> dict[str, Any]:
    d: dict[str, Any] = {"gpu": c.gpu, "tp": c.tp, "weight_dtype": c.weight_dtype, "kv_dtype": c.kv_dtype,
                         "max_num_seqs": c.max_num_seqs, "max_num_batched_tokens": c.max_num_batched_tokens,
                         "disaggregated": c.disaggregated}
    if c.disaggregated:
        d.update(decode_gpu=c.decode_gpu, decode_tp=c.decode_tp)
    if c.pp > 1:
        d["pp"] = c.pp
    if c.dp > 1 or c.ep:  # MoE layouts only: dense trials keep their encoding
        d.update(data_parallel_size=c.dp, enable_expert_parallel=c.ep)
    if c.mtp:  # models with MTP heads only
        d["num_speculative_tokens"] = c.mtp
    return d


def suggest(trial: optuna.Trial, ch: SpaceChoices) -> Candidate:
    """A sampler's candidate (``run_study``, the comparison search): plain TP layouts only; the shape search
    covers the MoE layouts (``ch.layouts``)."""
    p: dict[str, Any] = {
        "gpu": trial.suggest_categorical("gpu", ch.gpus),
        "tp": trial.suggest_categorical("tp", ch.tps),
        "weight_dtype": trial.suggest_categorical("weight_dtype", ch.weight_dtypes),
        "kv_dtype": trial.suggest_categorical("kv_dtype", ch.kv_dtypes),
        "max_num_seqs": trial.suggest_categorical("max_num_seqs", ch.max_num_seqs),
        "max_num_batched_tokens": trial.suggest_categorical("max_num_batched_tokens", ch.budgets),
    }
    if ch.disaggregation:
        p["disaggregated"] = trial.suggest_categorical("disaggregated", (False, True))
        if p["disaggregated"]:
            p["decode_gpu"] = trial.suggest_categorical("decode_gpu", ch.gpus) if ch.pd_heterogeneous else p["gpu"]
            p["decode_tp"] = trial.suggest_categorical("decode_tp", ch.tps)
    return candidate_from_params(p)


def distributions(ch: SpaceChoices) -> dict[str, Any]:
    """The categorical distribution of each parameter (P/D parameters only on disaggregated trials)."""
    from optuna.distributions import CategoricalDistribution as Cat

    d: dict[str, Any] = {"gpu": Cat(ch.gpus), "tp": Cat(ch.tps), "weight_dtype": Cat(ch.weight_dtypes),
                         "kv_dtype": Cat(ch.kv_dtypes), "max_num_seqs": Cat(ch.max_num_seqs),
                         "max_num_batched_tokens": Cat(ch.budgets), "disaggregated": Cat((False, True)),
                         "decode_gpu": Cat(ch.gpus), "decode_tp": Cat(ch.tps), "pp": Cat((1, 2, 4)),
                         "data_parallel_size": Cat(tuple(sorted({1, *(dp for dp, _ in ch.layouts)}))),
                         "enable_expert_parallel": Cat((False, True)),
                         "num_speculative_tokens": Cat((0, *ch.mtp))}
    return d


def frozen_trial(ctx: SearchContext, dists: dict[str, Any], ev: Evaluation) -> optuna.trial.FrozenTrial:
    """One evaluation as a completed trial (see the module docstring)."""
    params = params_of(ev.candidate)
    attrs = {f"constraints:{n}": float(v) for n, v in zip(ctx.constraint_names, ev.constraints)}
    return optuna.trial.create_trial(
        params=params, distributions={k: dists[k] for k in params}, values=[float(v) for v in ev.objectives],
        system_attrs=attrs, user_attrs={"key": ev.candidate.key, "feasible": ev.feasible, "gpus": ev.gpus_total})


def record(study: optuna.Study, ctx: SearchContext, ch: SpaceChoices, evaluations: Sequence[Evaluation]) -> None:
    """Add the evaluations to the study as completed trials (one batch)."""
    dists = distributions(ch)
    study.add_trials([frozen_trial(ctx, dists, ev) for ev in evaluations])


def completed_candidates(study: optuna.Study, *, keep: int | None = None) -> tuple[list[Candidate], int]:
    """(candidates worth evaluating in this process, completed trials in the study: this run's, other
    workers' and earlier runs').

    With ``keep``, only what the ranking can use is returned: every feasible trial on the stored Pareto
    front (by the stored objective values) and the ``keep`` cheapest feasible trials (ranked rows, the
    verification's fallbacks); every trial when none is feasible (the error then names the closest plan).
    Re-evaluating all of another worker's trials in the main process would cost what the worker saved."""
    trials = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        try:
            trials.append((candidate_from_params(t.params), t))
        except (KeyError, TypeError, ValueError):
            continue  # a trial from another encoding; not ours to rank
    feasible = sorted(((tuple(t.values), c) for c, t in trials if t.user_attrs.get("feasible") and t.values),
                      key=lambda vc: vc[0])
    if keep is None or not feasible:
        return [c for c, _ in trials], len(trials)
    chosen = [c for _, c in feasible[:keep]]
    front: list[tuple[float, ...]] = []
    for v, c in feasible:  # lexicographic order: only an earlier point can dominate a later one
        if not any(f != v and all(a <= b for a, b in zip(f, v)) for f in front):
            front.append(v)
            chosen.append(c)
    return chosen, len(trials)


def check_journal(path: str) -> None:
    """A journal file that exists must be a regular file whose complete lines are JSON objects with one of
    Optuna's ``op_code`` values (its records; an unknown one ends in Optuna's "Should not reach" assertion); garbage appended or a line cut in the middle is one ConfigError naming the
    file and the line (Optuna itself would fail with an AssertionError or a bare JSON message). A last line
    without its newline is a write in progress and is left to Optuna, as Optuna does."""
    import json

    from recommender.bounded import read_file_bytes

    p = Path(path)
    if not p.exists():
        return
    from optuna.storages.journal._storage import JournalOperation

    op_codes = {int(o.value) for o in JournalOperation}
    data = read_file_bytes(p, "--storage journal file")
    lines = data.split(b"\n")
    for i, raw in enumerate(lines[:-1], start=1):
        try:
            rec = json.loads(raw)
        except ValueError:
            rec = None
        if not isinstance(rec, dict) or rec.get("op_code") not in op_codes or isinstance(rec.get("op_code"), bool):
            raise ConfigError(f"--storage journal file {path} line {i} is not an Optuna journal record (garbage or a "
                              f"cut line); restore the file or start a new one")


def open_storage(url: str | None) -> Any:
    """An Optuna storage: None (in memory), an RDB URL, a journal file path ending in .log, or a bare
    file name, which becomes SQLite (``study.db`` -> ``sqlite:///study.db``)."""
    if not url or "://" in url:
        return url
    if url.endswith(".log"):
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        check_journal(url)
        return JournalStorage(JournalFileBackend(url))
    return f"sqlite:///{url}"


def make_study(ctx: SearchContext, settings: StudySettings, directions: int) -> optuna.Study:
    # constraints reach the sampler through Trial.set_constraint (Optuna >= 5; values <= 0 are feasible)
    sampler = optuna.samplers.NSGAIISampler(population_size=ctx.policy.population_size, seed=settings.seed)
    return optuna.create_study(
        directions=["minimize"] * directions, sampler=sampler, storage=open_storage(settings.storage),
        study_name=settings.study_name, load_if_exists=settings.storage is not None,
    )


def _set_constraints(trial: optuna.Trial, ctx: SearchContext, ev: Evaluation) -> None:
    for name, value in zip(ctx.constraint_names, ev.constraints):
        trial.set_constraint(name, float(value))


def run_study(ctx: SearchContext, ch: SpaceChoices, settings: StudySettings,
              enqueue: Sequence[Candidate] = ()) -> tuple[optuna.Study, list[Evaluation]]:
    """Run the study in this process (and ``workers - 1`` more sharing ``storage``)."""
    study = make_study(ctx, settings, len(ctx.objective_names))
    for c in enqueue:
        study.enqueue_trial(params_of(c), skip_if_exists=True)
    evaluations: list[Evaluation] = []

    def objective(trial: optuna.Trial) -> Sequence[float]:
        c = suggest(trial, ch)
        ev = evaluate(ctx, c)
        _set_constraints(trial, ctx, ev)
        trial.set_user_attr("key", c.key)
        evaluations.append(ev)
        return ev.objectives

    trials = settings.trials or ctx.policy.trials
    timeout = settings.timeout_s or ctx.policy.timeout_s
    if settings.workers > 1:
        if settings.storage is None:
            raise ValueError("--workers > 1 needs --storage (a SQLite file or an RDB/journal URL) to share trials")
        per = max(1, trials // settings.workers)
        procs = [multiprocessing.get_context("spawn").Process(
            target=_worker, args=(ctx, ch, settings, i + 1, per, timeout)) for i in range(settings.workers - 1)]
        for pr in procs:
            pr.start()
        with progress.bar("search (this worker)", total=per, unit="trial") as bar:
            study.optimize(objective, n_trials=per, timeout=timeout, callbacks=[progress.optuna_callback(bar)])
        for pr in procs:
            pr.join()
        # re-evaluate what the other workers found (cheap: cached analytic model)
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            evaluations.append(evaluate(ctx, candidate_from_params(t.params)))
    else:
        with progress.bar("search", total=trials, unit="trial") as bar:
            study.optimize(objective, n_trials=trials, timeout=timeout, callbacks=[progress.optuna_callback(bar)])
    return study, evaluations


def _worker(ctx: SearchContext, ch: SpaceChoices, settings: StudySettings, index: int, trials: int, timeout: float) -> None:
    s = StudySettings(seed=settings.seed + index, storage=settings.storage, study_name=settings.study_name)
    study = make_study(ctx, s, len(ctx.objective_names))

    def objective(trial: optuna.Trial) -> Sequence[float]:
        c = suggest(trial, ch)
        ev = evaluate(ctx, c)
        _set_constraints(trial, ctx, ev)
        return ev.objectives

    study.optimize(objective, n_trials=trials, timeout=timeout)


def now() -> float:
    return time.perf_counter()
