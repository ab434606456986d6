"""Re-planning history in a real database (SQLAlchemy Core): one row per run.

Columns: ``time_s`` (unix seconds), ``deployment`` (which fleet; several can share one DB), observed
workload, current and proposed plan (JSON as plan files hold it, :func:`recommender.plan.plan_document`,
version 2; rows written by older versions hold other plan JSON, which :func:`recommender.plan.load_plan`
reads too), ``decision`` ('changed' / 'unchanged' / 'error'),
``wanted`` ('up' / 'down' / 'none', or '' when no decision could be made), ``reason``, and the two
plans' USD per hour. The policy reads its cooldown and "N consecutive windows" state from here.

Each row also keeps ``run_id`` (a UUID, stamped into the plan.json a change writes) and the observed
time range ``window_start_s`` / ``window_end_s`` (overlapping ranges are not new evidence).

Decisions are serialised per deployment: :meth:`History.decision` opens one transaction that first
updates the deployment's row in ``replan_locks`` (a row lock on PostgreSQL, the database write lock on
SQLite), then reads the past runs, and commits the new row at the end, so two overlapping runs decide
one after the other and the second sees the first's window. The caller writes its files inside that
transaction; a kill before the commit leaves no row, and a plan.json whose stamp has no row is recorded
by the next run (:meth:`Transaction.has_run`).

``storage`` is any SQLAlchemy URL (``postgresql+psycopg://...``) or a file path, which means SQLite.
"""

from __future__ import annotations

import json
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from recommender.errors import ConfigError
from recommender.plan import Plan, plan_document
from recommender.replan.plans import stored_plan
from recommender.replan.policy import PastRun

DEFAULT_STORAGE = "recommender-history.db"

_meta = sa.MetaData()
runs = sa.Table(
    "replan_runs", _meta,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("time_s", sa.Float, nullable=False, index=True),
    sa.Column("deployment", sa.String(200), nullable=False, index=True),
    sa.Column("decision", sa.String(16), nullable=False),
    sa.Column("wanted", sa.String(8), nullable=False, default=""),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("usd_per_hour_current", sa.Float),
    sa.Column("usd_per_hour_proposed", sa.Float),
    sa.Column("observed", sa.JSON),
    sa.Column("current", sa.JSON),
    sa.Column("proposed", sa.JSON),
    sa.Column("run_id", sa.String(40), index=True),
    sa.Column("window_start_s", sa.Float),
    sa.Column("window_end_s", sa.Float),
)
locks = sa.Table(
    "replan_locks", _meta,
    sa.Column("deployment", sa.String(200), primary_key=True),
    sa.Column("decisions", sa.Integer, nullable=False, default=0),
)
_ADDED_COLUMNS = {"run_id": "VARCHAR(40)", "window_start_s": "FLOAT", "window_end_s": "FLOAT"}


def storage_url(storage: str | None) -> str:
    """A SQLAlchemy URL from ``--storage``: URLs pass through, paths become ``sqlite:///path``."""
    s = storage or DEFAULT_STORAGE
    return s if "://" in s else f"sqlite:///{s}"


def sqlite_path(url: str) -> Path | None:
    """The file behind a ``sqlite:///`` URL (None for other databases or in-memory SQLite)."""
    u = sa.engine.make_url(url)
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    return Path(u.database)


@dataclass(frozen=True)
class RunRecord:
    id: int
    time_s: float
    deployment: str
    decision: str
    wanted: str
    reason: str
    usd_per_hour_current: float | None
    usd_per_hour_proposed: float | None
    observed: Mapping[str, Any] | None
    current: Mapping[str, Any] | None
    proposed: Mapping[str, Any] | None
    run_id: str | None = None
    window_start_s: float | None = None
    window_end_s: float | None = None

    @property
    def window(self) -> tuple[float, float] | None:
        if self.window_start_s is None or self.window_end_s is None:
            return None
        return (self.window_start_s, self.window_end_s)

    @property
    def proposed_plan(self) -> Plan | None:
        """The proposal read back as a :class:`Plan` (None when there is none or it no longer reads as one)."""
        return stored_plan(self.proposed, f"history row {self.id} proposed plan")

    def past(self) -> PastRun:
        return PastRun(self.time_s, self.decision, self.wanted, self.proposed_plan, self.window)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "time_s": self.time_s, "deployment": self.deployment, "decision": self.decision,
                "wanted": self.wanted, "reason": self.reason, "usd_per_hour_current": self.usd_per_hour_current,
                "usd_per_hour_proposed": self.usd_per_hour_proposed, "observed": self.observed,
                "current": self.current, "proposed": self.proposed, "run_id": self.run_id,
                "window_start_s": self.window_start_s, "window_end_s": self.window_end_s}


def _plan_json(plan: Plan | None) -> dict[str, Any] | None:
    return None if plan is None else plan_document(plan)


def _row(time_s: float, deployment: str, decision: str, wanted: str, reason: str,
         observed: Mapping[str, Any] | None, current: Plan | None, proposed: Plan | None,
         usd_per_hour_current: float | None = None, usd_per_hour_proposed: float | None = None,
         run_id: str | None = None, window: tuple[float, float] | None = None) -> dict[str, Any]:
    return dict(time_s=time_s, deployment=deployment, decision=decision, wanted=wanted, reason=reason,
                usd_per_hour_current=usd_per_hour_current, usd_per_hour_proposed=usd_per_hour_proposed,
                observed=_jsonable(observed), current=_plan_json(current), proposed=_plan_json(proposed),
                run_id=run_id or uuid.uuid4().hex, window_start_s=None if window is None else float(window[0]),
                window_end_s=None if window is None else float(window[1]))


def _select(deployment: str | None, limit: int | None, since_s: float | None) -> Any:
    q = sa.select(runs).order_by(runs.c.time_s.desc(), runs.c.id.desc())
    if deployment is not None:
        q = q.where(runs.c.deployment == deployment)
    if since_s is not None:
        q = q.where(runs.c.time_s >= since_s)
    if limit is not None:
        q = q.limit(limit)
    return q


class Transaction:
    """Reads and the new row inside one :meth:`History.decision` transaction (lock held)."""

    def __init__(self, conn: sa.Connection, deployment: str) -> None:
        self.conn = conn
        self.deployment = deployment

    def list(self, *, limit: int | None = None, since_s: float | None = None) -> list[RunRecord]:
        return [RunRecord(**dict(r._mapping)) for r in self.conn.execute(_select(self.deployment, limit, since_s))]

    def last_change(self) -> RunRecord | None:
        q = (sa.select(runs).where(runs.c.deployment == self.deployment, runs.c.decision == "changed")
             .order_by(runs.c.time_s.desc(), runs.c.id.desc()).limit(1))
        r = self.conn.execute(q).first()
        return RunRecord(**dict(r._mapping)) if r is not None else None

    def has_run(self, run_id: str) -> bool:
        return self.conn.execute(sa.select(runs.c.id).where(runs.c.run_id == run_id).limit(1)).first() is not None

    def record(self, **kw: Any) -> int:
        """Insert one run of this deployment (keywords of :meth:`History.record`); returns its id."""
        res = self.conn.execute(runs.insert().values(**_row(deployment=self.deployment, **kw)))
        return int(res.inserted_primary_key[0])  # type: ignore[index]  # always set for an INSERT


class History:
    """The runs table behind one SQLAlchemy URL (created on first use)."""

    def __init__(self, storage: str | None = None) -> None:
        self.url = storage_url(storage)
        path = sqlite_path(self.url)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        try:
            kw: dict[str, Any] = {"connect_args": {"timeout": 120}} if self.url.startswith("sqlite") else {}
            self.engine = sa.create_engine(self.url, **kw)
            self._create()
        except (SQLAlchemyError, ImportError, ValueError) as e:
            raise ConfigError(f"history storage {self.url!r} cannot be opened ({str(e).splitlines()[0]}); pass "
                              f"--storage with a SQLAlchemy URL or a file path") from None

    def _create(self) -> None:
        """Create the tables (a concurrent creator may win the race: then retry once) and add the columns
        an older version of the table lacks."""
        for attempt in range(3):
            try:
                _meta.create_all(self.engine)
                break
            except SQLAlchemyError:
                if attempt == 2:
                    raise
                time.sleep(0.2 * (attempt + 1))
        have = {c["name"] for c in sa.inspect(self.engine).get_columns("replan_runs")}
        missing = [c for c in _ADDED_COLUMNS if c not in have]
        if missing:
            with self.engine.begin() as conn:
                for c in missing:
                    conn.execute(sa.text(f"ALTER TABLE replan_runs ADD COLUMN {c} {_ADDED_COLUMNS[c]}"))

    def record(self, *, time_s: float, deployment: str, decision: str, wanted: str, reason: str,
               observed: Mapping[str, Any] | None, current: Plan | None,
               proposed: Plan | None, usd_per_hour_current: float | None = None,
               usd_per_hour_proposed: float | None = None, run_id: str | None = None,
               window: tuple[float, float] | None = None) -> int:
        """Insert one run; returns its id."""
        row = _row(time_s, deployment, decision, wanted, reason, observed, current, proposed, usd_per_hour_current,
                   usd_per_hour_proposed, run_id, window)
        with self.engine.begin() as conn:
            res = conn.execute(runs.insert().values(**row))
            return int(res.inserted_primary_key[0])  # type: ignore[index]  # always set for an INSERT

    @contextmanager
    def decision(self, deployment: str) -> Iterator[Transaction]:
        """One transaction holding ``deployment``'s decision lock (see the module docstring); commits on
        a normal exit, rolls back on an exception."""
        self._ensure_lock_row(deployment)
        with self.engine.begin() as conn:
            conn.execute(locks.update().where(locks.c.deployment == deployment)
                         .values(decisions=locks.c.decisions + 1))
            yield Transaction(conn, deployment)

    def _ensure_lock_row(self, deployment: str) -> None:
        name = self.engine.dialect.name
        if name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            stmt: Any = pg_insert(locks).values(deployment=deployment, decisions=0).on_conflict_do_nothing()
        elif name == "sqlite":
            from sqlalchemy.dialects.sqlite import insert as sqlite_insert

            stmt = sqlite_insert(locks).values(deployment=deployment, decisions=0).on_conflict_do_nothing()
        else:
            with self.engine.connect() as conn:
                if conn.execute(sa.select(locks.c.deployment).where(locks.c.deployment == deployment)).first():
                    return
            stmt = locks.insert().values(deployment=deployment, decisions=0)
        try:
            with self.engine.begin() as conn:
                conn.execute(stmt)
        except IntegrityError:
            pass  # another run inserted it first

    def list(self, *, deployment: str | None = None, limit: int | None = None,
             since_s: float | None = None) -> list[RunRecord]:
        """Runs newest first (optionally one deployment, at most ``limit``, not older than ``since_s``)."""
        with self.engine.connect() as conn:
            return [RunRecord(**dict(r._mapping)) for r in conn.execute(_select(deployment, limit, since_s))]

    def deployments(self, limit: int = 10) -> Sequence[tuple[str, int]]:
        """(deployment, runs) of the deployments with the most runs, at most ``limit``, most runs first."""
        n = sa.func.count(runs.c.id)
        q = sa.select(runs.c.deployment, n).group_by(runs.c.deployment).order_by(n.desc(), runs.c.deployment).limit(limit)
        with self.engine.connect() as conn:
            return [(str(d), int(c)) for d, c in conn.execute(q)]

    def last_change(self, deployment: str) -> RunRecord | None:
        with self.engine.connect() as conn:
            return Transaction(conn, deployment).last_change()

    def dispose(self) -> None:
        self.engine.dispose()


def _jsonable(doc: Mapping[str, Any] | None) -> Any:
    """Round-trip through json so numpy scalars and tuples become plain JSON."""
    return None if doc is None else json.loads(json.dumps(doc, default=_default))


def _default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def records_to_dicts(records: Sequence[RunRecord], full: bool = False) -> list[dict[str, Any]]:
    """Summaries for ``recommend history --format json`` (``full`` adds the JSON documents)."""
    out = []
    for r in records:
        d = r.to_dict()
        if not full:
            for k in ("observed", "current", "proposed"):
                d.pop(k)
            obs = r.observed or {}
            d["observed_rate_per_s"] = obs.get("arrival_rate_per_s")
            d["forecast_rate_per_s"] = obs.get("forecast_rate_per_s")
        out.append(d)
    return out
