"""Re-planning history in a real database (SQLAlchemy Core): one row per run.

Columns: ``time_s`` (unix seconds), ``deployment`` (which fleet; several can share one DB), observed
workload, current and proposed plan (JSON), ``decision`` ('changed' / 'unchanged' / 'error'),
``wanted`` ('up' / 'down' / 'none', or '' when no decision could be made), ``reason``, and the two
plans' USD per hour. The policy reads its cooldown and "N consecutive windows" state from here.

``storage`` is any SQLAlchemy URL (``postgresql+psycopg://...``) or a file path, which means SQLite.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

from recommender.errors import ConfigError
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
)


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

    def past(self) -> PastRun:
        return PastRun(self.time_s, self.decision, self.wanted, self.proposed)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "time_s": self.time_s, "deployment": self.deployment, "decision": self.decision,
                "wanted": self.wanted, "reason": self.reason, "usd_per_hour_current": self.usd_per_hour_current,
                "usd_per_hour_proposed": self.usd_per_hour_proposed, "observed": self.observed,
                "current": self.current, "proposed": self.proposed}


class History:
    """The runs table behind one SQLAlchemy URL (created on first use)."""

    def __init__(self, storage: str | None = None) -> None:
        self.url = storage_url(storage)
        path = sqlite_path(self.url)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.engine = sa.create_engine(self.url)
            _meta.create_all(self.engine)
        except (SQLAlchemyError, ImportError, ValueError) as e:
            raise ConfigError(f"history storage {self.url!r} cannot be opened ({str(e).splitlines()[0]}); pass "
                              f"--storage with a SQLAlchemy URL or a file path") from None

    def record(self, *, time_s: float, deployment: str, decision: str, wanted: str, reason: str,
               observed: Mapping[str, Any] | None, current: Mapping[str, Any] | None,
               proposed: Mapping[str, Any] | None, usd_per_hour_current: float | None = None,
               usd_per_hour_proposed: float | None = None) -> int:
        """Insert one run; returns its id."""
        row = dict(time_s=time_s, deployment=deployment, decision=decision, wanted=wanted, reason=reason,
                   usd_per_hour_current=usd_per_hour_current, usd_per_hour_proposed=usd_per_hour_proposed,
                   observed=_jsonable(observed), current=_jsonable(current), proposed=_jsonable(proposed))
        with self.engine.begin() as conn:
            res = conn.execute(runs.insert().values(**row))
            return int(res.inserted_primary_key[0])

    def list(self, *, deployment: str | None = None, limit: int | None = None,
             since_s: float | None = None) -> list[RunRecord]:
        """Runs newest first (optionally one deployment, at most ``limit``, not older than ``since_s``)."""
        q = sa.select(runs).order_by(runs.c.time_s.desc(), runs.c.id.desc())
        if deployment is not None:
            q = q.where(runs.c.deployment == deployment)
        if since_s is not None:
            q = q.where(runs.c.time_s >= since_s)
        if limit is not None:
            q = q.limit(limit)
        with self.engine.connect() as conn:
            return [RunRecord(**dict(r._mapping)) for r in conn.execute(q)]

    def last_change(self, deployment: str) -> RunRecord | None:
        q = (sa.select(runs).where(runs.c.deployment == deployment, runs.c.decision == "changed")
             .order_by(runs.c.time_s.desc(), runs.c.id.desc()).limit(1))
        with self.engine.connect() as conn:
            r = conn.execute(q).first()
        return RunRecord(**dict(r._mapping)) if r is not None else None

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
