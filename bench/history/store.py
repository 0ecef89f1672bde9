"""The run history database: every ingested run's judged cells, fingerprints and performance
medians, in SQLite by default (`results/history.sqlite`, beside the run folders) or any database
SQLAlchemy reaches (PostgreSQL through psycopg for a team whose runners share one).

What goes in is derived by the bench's own reader and judge (open_results, bench.core.judge.judge,
diagnose_results) and shaped by bench.history.rows.entry_of; this module only stores and reads.

Concurrency. Several runners may ingest into one database at once, and a run may be ingested twice
(a retried CI step, `history ingest results/*` over folders already in). A run's rows are written in
one transaction that starts by inserting its `runs` row with ON CONFLICT DO NOTHING: the writer whose
insert lands writes the rest and commits; any other sees nothing inserted and writes nothing. So a
run is stored exactly once, whole. On SQLite every transaction is BEGIN IMMEDIATE (the write lock
up front, waited for up to LOCK_WAIT_S): the default deferred BEGIN would let two writers both read
and then fail to upgrade to the write lock ("database is locked") instead of waiting in turn.

Schema. `schema_version` holds one row per migration applied; opening the database applies the
missing ones in order, in one transaction, under a lock (SQLite's write lock, PostgreSQL's
transaction-scoped advisory lock), so two processes opening a new database at once neither both
migrate nor fail. A migration, once released, never changes: a new column or table is a new one.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import (
    Boolean,
    Column,
    Connection,
    Engine,
    Float,
    ForeignKeyConstraint,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    create_engine,
    event,
    func,
    insert,
    select,
    text,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, NoSuchModuleError, SQLAlchemyError

from bench.core.errors import EXIT_WRITE, RegbenchError
from bench.core.judge import judge
from bench.history.model import DEFAULT_WINDOW, CellHistory, cell_histories, series_of
from bench.history.rows import (
    FINGERPRINT_FIELDS,
    RunEntry,
    StoredCell,
    StoredFingerprint,
    StoredPerf,
    StoredRun,
    StoredRunValue,
    entry_of,
)
from bench.store.evidence import diagnose_results
from bench.store.publish import open_results
from bench.store.results import LOCK_NAME, FolderBusy

DEFAULT_NAME = "history.sqlite"
LOCK_WAIT_S = 60.0  # how long a writer waits for another's transaction (SQLite's busy timeout)
CONNECT_TIMEOUT_S = 10  # a database server that does not answer: an error, not a hang
# pg_advisory_xact_lock's key for migrations: any constant the other users of the database do not take.
_MIGRATION_LOCK = 0x72656762  # "regb"


class HistoryError(RegbenchError):
    """The history database cannot be opened, migrated, read or written."""


class TrendWriteError(RegbenchError):
    """The trend page could not be written."""

    exit_code = EXIT_WRITE


def default_url(results_root: Path) -> str:
    """The embedded database beside the run folders of a results root."""
    return f"sqlite:///{(results_root / DEFAULT_NAME).resolve()}"


# --- the schema, version by version ---------------------------------------------------------

def _schema_v1(md: MetaData) -> None:
    """The tables as version 1 made them. Frozen: a change is a new migration."""
    Table("runs", md,
          Column("run_id", String(255), nullable=False),
          Column("config_name", String(255), nullable=False),
          Column("started_at", Float, nullable=False),  # Unix time, as the records hold it
          Column("finished_at", Float, nullable=False),
          Column("exit_code", Integer, nullable=False),
          Column("interrupted", Boolean, nullable=False),
          Column("source", Text, nullable=False),
          Column("ingested_at", Float, nullable=False),
          PrimaryKeyConstraint("run_id", name="runs_pk"))
    Table("cells", md,
          Column("run_id", String(255), nullable=False),
          Column("cell_id", String(512), nullable=False),
          Column("model", String(255), nullable=False),
          Column("load_format", String(255), nullable=False),
          Column("platform", String(255), nullable=False),
          Column("image", String(255), nullable=False),
          Column("knob", String(255)),
          Column("verdict", String(16), nullable=False),
          Column("failures", Integer, nullable=False),
          Column("runs", Integer, nullable=False),
          Column("interval_low", Float),
          Column("interval_high", Float),
          Column("reasons", Text, nullable=False),  # JSON: reason -> runs showing it
          Column("signature", String(255)),
          PrimaryKeyConstraint("run_id", "cell_id", name="cells_pk"),
          ForeignKeyConstraint(["run_id"], ["runs.run_id"], name="cells_run_fk", ondelete="CASCADE"))
    Table("fingerprints", md,
          Column("run_id", String(255), nullable=False),
          Column("image", String(255), nullable=False),
          *(Column(name, Text) for name in FINGERPRINT_FIELDS),
          PrimaryKeyConstraint("run_id", "image", name="fingerprints_pk"),
          ForeignKeyConstraint(["run_id"], ["runs.run_id"], name="fingerprints_run_fk", ondelete="CASCADE"))
    Table("perf", md,
          Column("run_id", String(255), nullable=False),
          Column("cell_id", String(512), nullable=False),
          Column("metric", String(64), nullable=False),
          Column("median", Float, nullable=False),
          Column("runs", Integer, nullable=False),
          Column("samples", Integer, nullable=False),
          PrimaryKeyConstraint("run_id", "cell_id", "metric", name="perf_pk"),
          ForeignKeyConstraint(["run_id", "cell_id"], ["cells.run_id", "cells.cell_id"], name="perf_cell_fk",
                               ondelete="CASCADE"))


def _schema_v2(md: MetaData) -> None:
    """The table version 2 added: each fresh server's value of each metric, what the slowdown
    rule across runs resamples (the medians alone cannot give an interval). Frozen."""
    Table("perf_runs", md,
          Column("run_id", String(255), nullable=False),
          Column("cell_id", String(512), nullable=False),
          Column("metric", String(64), nullable=False),
          Column("repeat", Integer, nullable=False),
          Column("value", Float, nullable=False),
          PrimaryKeyConstraint("run_id", "cell_id", "metric", "repeat", name="perf_runs_pk"),
          ForeignKeyConstraint(["run_id", "cell_id"], ["cells.run_id", "cells.cell_id"], name="perf_runs_cell_fk",
                               ondelete="CASCADE"))


def _migrate_1(conn: Connection) -> None:
    md = MetaData()
    _schema_v1(md)
    md.create_all(conn)


def _migrate_2(conn: Connection) -> None:
    # Version 1's tables are declared too, for the foreign key to name; only the new one is created.
    md = MetaData()
    _schema_v1(md)
    _schema_v2(md)
    md.tables["perf_runs"].create(conn)


# (version, what it does, the migration): applied in order, each at most once per database.
# Runs stored before version 2 keep their medians and have no per-server values: the slowdown
# check leaves them out of its windows (ingest keeps a run as first stored, so they stay so).
MIGRATIONS: list[tuple[int, str, Callable[[Connection], None]]] = [
    (1, "runs, cells, fingerprints and performance medians per run", _migrate_1),
    (2, "performance values per fresh server, for slowdowns across runs", _migrate_2),
]
SCHEMA_VERSION = MIGRATIONS[-1][0]

# The tables as the code reads and writes them: the latest schema (version 1's and 2's).
META = MetaData()
_schema_v1(META)
_schema_v2(META)
RUNS, CELLS, FINGERPRINTS, PERF, PERF_RUNS = (
    META.tables[n] for n in ("runs", "cells", "fingerprints", "perf", "perf_runs"))
# Made before any migration, outside the migrations: it is where they are recorded.
VERSION_META = MetaData()
SCHEMA_VERSION_TABLE = Table(
    "schema_version", VERSION_META,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("description", Text, nullable=False),
    Column("applied_at", Float, nullable=False),
)


# --- opening --------------------------------------------------------------------------------

def _shown(url: URL) -> str:
    return url.render_as_string(hide_password=True)


def _engine(url: URL) -> Engine:
    if url.get_backend_name() == "sqlite":
        engine = create_engine(url, connect_args={"timeout": LOCK_WAIT_S})

        @event.listens_for(engine, "connect")
        def _connect(dbapi_connection, _record) -> None:
            # Transactions are begun by the listener below, not by the driver's guesswork.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA foreign_keys = ON")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _begin(conn) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    connect_args = {}
    if url.get_backend_name() == "postgresql" and "connect_timeout" not in url.query:
        connect_args["connect_timeout"] = CONNECT_TIMEOUT_S
    return create_engine(url, connect_args=connect_args, pool_pre_ping=True)


@dataclass
class History:
    engine: Engine
    url: URL
    migrated: list[int] = field(default_factory=list)  # the versions this open applied

    @property
    def shown(self) -> str:
        return _shown(self.url)

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def _transaction(self, what: str) -> Iterator[Connection]:
        try:
            with self.engine.begin() as conn:
                yield conn
        except IntegrityError:
            raise  # the caller's to read: a run stored by another writer
        except SQLAlchemyError as exc:
            raise HistoryError(f"history database {self.shown}: cannot {what}: {_first_line(exc)}") from None

    def schema_version(self) -> int:
        with self._transaction("read its schema version") as conn:
            return conn.execute(select(func.max(SCHEMA_VERSION_TABLE.c.version))).scalar() or 0

    def migrations(self) -> list[tuple[int, str, float]]:
        with self._transaction("read its schema version") as conn:
            rows = conn.execute(select(SCHEMA_VERSION_TABLE).order_by(SCHEMA_VERSION_TABLE.c.version)).all()
        return [(r.version, r.description, r.applied_at) for r in rows]

    def _migrate(self) -> None:
        with self._transaction("open it") as conn:
            if conn.dialect.name == "postgresql":
                # Held to the end of this transaction: a second opener waits here, then finds
                # every migration applied.
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
            VERSION_META.create_all(conn)
            current = conn.execute(select(func.max(SCHEMA_VERSION_TABLE.c.version))).scalar() or 0
            if current > SCHEMA_VERSION:
                raise HistoryError(f"history database {self.shown}: schema version {current} is newer than this "
                                   f"regbench's ({SCHEMA_VERSION}): upgrade regbench")
            for version, description, migrate in MIGRATIONS:
                if version > current:
                    migrate(conn)
                    conn.execute(insert(SCHEMA_VERSION_TABLE).values(
                        version=version, description=description, applied_at=time.time()))
                    self.migrated.append(version)

    # --- writing ----------------------------------------------------------------------------

    def add(self, entry: RunEntry) -> bool:
        """Stores a run, all its rows or none. False: the run id was there already (nothing written)."""
        run = entry.run
        try:
            with self._transaction(f"store run {run.run_id}") as conn:
                values = {**run.model_dump(), "ingested_at": time.time()}
                dialect = conn.dialect.name
                if dialect in ("sqlite", "postgresql"):
                    ins = (sqlite.insert(RUNS) if dialect == "sqlite" else postgresql.insert(RUNS))
                    # A concurrent writer of the same run: PostgreSQL waits on its row, then finds
                    # the conflict; SQLite's IMMEDIATE transactions take turns.
                    if conn.execute(ins.values(values).on_conflict_do_nothing(index_elements=["run_id"])).rowcount == 0:
                        return False
                else:
                    # Any other database: the unique key says it, and the transaction is rolled back.
                    conn.execute(insert(RUNS).values(values))
                if entry.cells:
                    conn.execute(insert(CELLS), [_cell_row(c) for c in entry.cells])
                if entry.fingerprints:
                    conn.execute(insert(FINGERPRINTS), [f.model_dump() for f in entry.fingerprints])
                if entry.perf:
                    conn.execute(insert(PERF), [p.model_dump() for p in entry.perf])
                if entry.values:
                    conn.execute(insert(PERF_RUNS), [v.model_dump() for v in entry.values])
        except IntegrityError as exc:
            if self.has_run(run.run_id):
                return False
            raise HistoryError(f"history database {self.shown}: cannot store run {run.run_id}: "
                               f"{_first_line(exc)}") from None
        return True

    def has_run(self, run_id: str) -> bool:
        with self._transaction("read it") as conn:
            return conn.execute(select(RUNS.c.run_id).where(RUNS.c.run_id == run_id)).first() is not None

    # --- reading ----------------------------------------------------------------------------

    def runs(self) -> list[StoredRun]:
        with self._transaction("read it") as conn:
            rows = conn.execute(select(*(RUNS.c[k] for k in StoredRun.model_fields))).mappings().all()
        return [StoredRun(**r) for r in rows]

    def cells(self, cell_id: str | None = None, cell_ids: Iterable[str] | None = None) -> list[StoredCell]:
        q = select(CELLS)
        if cell_id is not None:
            q = q.where(CELLS.c.cell_id == cell_id)
        if cell_ids is not None:
            q = q.where(CELLS.c.cell_id.in_(list(cell_ids)))
        with self._transaction("read it") as conn:
            rows = conn.execute(q).mappings().all()
        return [_stored_cell(r) for r in rows]

    def cell_ids(self) -> list[str]:
        with self._transaction("read it") as conn:
            return list(conn.execute(select(CELLS.c.cell_id).distinct().order_by(CELLS.c.cell_id)).scalars())

    def fingerprints(self) -> list[StoredFingerprint]:
        with self._transaction("read it") as conn:
            rows = conn.execute(select(FINGERPRINTS)).mappings().all()
        return [StoredFingerprint(**r) for r in rows]

    def perf(self, cell_id: str | None = None, cell_ids: Iterable[str] | None = None) -> list[StoredPerf]:
        q = select(PERF)
        if cell_id is not None:
            q = q.where(PERF.c.cell_id == cell_id)
        if cell_ids is not None:
            q = q.where(PERF.c.cell_id.in_(list(cell_ids)))
        with self._transaction("read it") as conn:
            rows = conn.execute(q).mappings().all()
        return [StoredPerf(**r) for r in rows]

    def run_values(self, cell_id: str | None = None, cell_ids: Iterable[str] | None = None) -> list[StoredRunValue]:
        q = select(PERF_RUNS)
        if cell_id is not None:
            q = q.where(PERF_RUNS.c.cell_id == cell_id)
        if cell_ids is not None:
            q = q.where(PERF_RUNS.c.cell_id.in_(list(cell_ids)))
        with self._transaction("read it") as conn:
            rows = conn.execute(q).mappings().all()
        return [StoredRunValue(**r) for r in rows]

    def histories(self, cell_id: str | None = None, window: int = DEFAULT_WINDOW,
                  thresholds: dict[str, float] | None = None, by: str = "time") -> list[CellHistory]:
        """Every cell's history, or `cell_id`'s; out of time order (`by`) every series', or the
        series `cell_id` names (itself, or any cell of it)."""
        if by != "time" and cell_id is not None:
            series = series_of(cell_id)
            ids = [c for c in self.cell_ids() if series_of(c) == series]
            return cell_histories(self.runs(), self.cells(cell_ids=ids), self.fingerprints(),
                                  self.perf(cell_ids=ids), self.run_values(cell_ids=ids), window, thresholds, by)
        return cell_histories(self.runs(), self.cells(cell_id), self.fingerprints(), self.perf(cell_id),
                              self.run_values(cell_id), window, thresholds, by)


def _cell_row(c: StoredCell) -> dict:
    row = c.model_dump(exclude={"interval", "reasons"})
    row["verdict"] = c.verdict.value
    row["interval_low"], row["interval_high"] = c.interval if c.interval is not None else (None, None)
    row["reasons"] = json.dumps(c.reasons, sort_keys=True)
    return row


def _stored_cell(r) -> StoredCell:
    row = dict(r)
    low, high = row.pop("interval_low"), row.pop("interval_high")
    row["interval"] = (low, high) if low is not None and high is not None else None
    row["reasons"] = json.loads(row["reasons"])
    return StoredCell(**row)


def _first_line(exc: BaseException) -> str:
    # SQLAlchemy appends the statement and a link to its docs: the driver's own first line says it.
    orig = getattr(exc, "orig", None)
    lines = str(orig if orig is not None else exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def open_history(url: str, create: bool = True) -> History:
    """Connects, and brings the schema up to date. `create=False`: an SQLite file that is not
    there is an error (a view of a history nothing was ingested into) rather than a new file."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise HistoryError(f"--history {url!r}: not a database URL (e.g. sqlite:///results/history.sqlite, "
                           "postgresql+psycopg://regbench@db.example/regbench)") from None
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        path = Path(parsed.database)
        if not path.exists():
            if not create:
                raise HistoryError(f"no history at {path}: ingest a results folder first (regbench history ingest DIR)")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise HistoryError(f"cannot create {path.parent}: {exc.strerror or exc}") from None
    try:
        engine = _engine(parsed)
    except (NoSuchModuleError, ImportError) as exc:
        raise HistoryError(f"history database {_shown(parsed)}: no driver for it here: {exc}") from None
    history = History(engine=engine, url=parsed)
    try:
        history._migrate()
    except HistoryError:
        engine.dispose()
        raise
    except SQLAlchemyError as exc:
        engine.dispose()
        raise HistoryError(f"history database {_shown(parsed)}: cannot open it: {_first_line(exc)}") from None
    return history


# --- ingesting a results folder ---------------------------------------------------------------

def entry_from_folder(path: Path) -> RunEntry:
    """A results folder read and judged as `regbench report` would, as history rows."""
    results = open_results(path)
    data = results.load()
    summary = judge(data)
    diagnosis = diagnose_results(results.path, data.config, summary, data.runs, data.requests, data.fingerprints)
    return entry_of(summary, diagnosis, data.fingerprints, str(results.path), data.runs, data.requests)


def _being_written(path: Path) -> bool:
    """Whether a bench holds the folder's writer lock (bench.store.results.writer_lock). Probed
    with a shared lock on a read-only descriptor: the folder may be an archive we cannot write."""
    try:
        fd = os.open(path / LOCK_NAME, os.O_RDONLY)
    except OSError:
        return False  # no lock file: no bench ever held it, or a folder from before it
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError as exc:
        return exc.errno in (errno.EWOULDBLOCK, errno.EACCES)
    finally:
        os.close(fd)  # releases the lock the test took, if it got it


def write_page(path: Path, page: str) -> None:
    """The trend page, whole: written beside its final name and renamed, so a reader (a CI step
    uploading it) never sees half a page."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise TrendWriteError(f"cannot write the trend page {path}: {exc.strerror or exc}") from None


def ingest(history: History, path: Path) -> tuple[str, bool]:
    """(run id, whether it was stored now: False when it was there already). A run still being
    written is refused: stored once by its id, a half-done run would stand for it for good."""
    if _being_written(path):
        raise FolderBusy(f"{path} is being written by a bench still running: ingest it when that ends")
    entry = entry_from_folder(path)
    return entry.run.run_id, history.add(entry)
