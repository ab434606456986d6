"""Suite-wide conventions.

* ``@pytest.mark.slow``: tests over a few seconds. Skipped in a plain local ``pytest`` run, run when the
  environment has ``CI`` set (``.ci/run`` runs with ``CI=true``) or with ``--runslow``.
* ``postgres_url`` fixture: a SQLAlchemy URL of a real, empty PostgreSQL database. ``.ci/run`` starts a
  server and exports ``RECOMMENDER_TEST_POSTGRES_URL``; under CI a missing server is a failure, locally a skip.
"""

from __future__ import annotations

import os
import uuid

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", default=False, help="run tests marked slow")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: takes more than a few seconds; runs under CI=true or --runslow")
    config.addinivalue_line("markers", "postgres: needs the real PostgreSQL server that .ci/run starts")


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--runslow") or _in_ci():
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow (CI runs it)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def postgres_url() -> str:
    """A fresh database on the server named by ``$RECOMMENDER_TEST_POSTGRES_URL`` (admin URL)."""
    admin = os.environ.get("RECOMMENDER_TEST_POSTGRES_URL")
    if not admin:
        if _in_ci():
            pytest.fail("CI: RECOMMENDER_TEST_POSTGRES_URL is not set; .ci/run must start PostgreSQL")
        pytest.skip("no PostgreSQL server (set RECOMMENDER_TEST_POSTGRES_URL; .ci/run does)")
    import sqlalchemy as sa

    name = "t_" + uuid.uuid4().hex[:12]
    engine = sa.create_engine(admin, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    base = admin.rsplit("/", 1)[0]
    return f"{base}/{name}"


@pytest.fixture(autouse=True)
def _no_terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests see whole lines (as a pipe does) unless they set COLUMNS themselves: a shell that exports COLUMNS
    would otherwise fit every command's output to the developer's terminal and break exact-text assertions."""
    monkeypatch.delenv("COLUMNS", raising=False)
