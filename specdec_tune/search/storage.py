"""Where studies live: a storage URL checked and opened with one-line errors (never a password),
and a lock that every worker of one storage sees.

The lock makes "is there a free slot? then start a trial" and "who runs the final round?" atomic
across processes and hosts. It is a PostgreSQL advisory lock (MySQL: GET_LOCK) on a connection of
its own, or a file lock next to a SQLite database, so it goes away with its holder: the server
drops a dead client's session (on loopback at once; from a vanished host once TCP keepalive gives
up, about 30 s with the settings below), the kernel drops a dead process's file lock.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import SpecDecError
from ..urls import redact_url, scrub

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

URL_HELP = "use sqlite:///PATH or postgresql+psycopg://USER:PASSWORD@HOST[:PORT]/DB"
# The driver each backend's extra installs, and how to get it.
DRIVERS = {
    "postgresql": ("psycopg", "pip install 'specdec-tune[postgres]' (psycopg 3)"),
    "mysql": ("pymysql", "pip install pymysql"),
}


def redact(url: str) -> str:
    """Never write or print a database password (urls.redact_url)."""
    return redact_url(url)


def _clean(text: str, url: str) -> str:
    """The first line of a driver's message, without any secret of the URL even if echoed."""
    return scrub((scrub(text, url).strip().splitlines() or [""])[0], url)


def check_url(url: str) -> str:
    """The URL to open: parsed, its dialect known and its driver importable (else SpecDecError).
    A bare `postgresql://` means psycopg 3, the driver of the `postgres` extra."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        u = make_url(url)
    except (ArgumentError, ValueError):
        raise SpecDecError(f"--storage '{redact(url)}' is not a database URL: {URL_HELP}") from None
    if u.drivername == "postgresql":
        u = u.set(drivername="postgresql+psycopg")
        url = u.render_as_string(hide_password=False)
    try:
        dialect = u.get_dialect()
    except NoSuchModuleError:
        raise SpecDecError(f"--storage: unknown database dialect '{u.drivername}': {URL_HELP}") from None
    try:
        dialect.import_dbapi()
    except ImportError:
        driver, install = DRIVERS.get(u.get_backend_name(), ("", ""))
        hint = f"the driver {u.get_driver_name()} is not installed"
        if install and u.get_driver_name() == driver:
            hint += f": {install}"
        elif install:
            hint += f": install it, or {install} and use {u.get_backend_name()}+{driver}://"
        raise SpecDecError(f"--storage '{redact(url)}': {hint}") from None
    return url


def engine_kwargs(url: str) -> dict[str, Any]:
    if url.startswith("sqlite"):
        # Wait for another process's write lock instead of failing at once.
        return {"connect_args": {"timeout": 60}}
    if url.startswith("postgresql"):
        # Fail fast on an unreachable host; notice a dead connection within about 30 s.
        return {"connect_args": {"connect_timeout": 10, "keepalives_idle": 15, "keepalives_interval": 5}}
    return {}


# Opening a storage is tried four times, RETRY_S, 2 RETRY_S, 3 RETRY_S apart: a server that is still
# starting, or workers creating the tables at the same time.
RETRY_S = 0.25


def open_storage(
    url: str,
    heartbeat_s: int | None = None,
    grace_s: int | None = None,
    on_lost: Callable[[optuna.Study, FrozenTrial], None] | None = None,
) -> Any:
    """An Optuna RDBStorage (creating its tables), or one SpecDecError line saying why not."""
    import inspect

    import optuna
    from sqlalchemy.exc import OperationalError

    url = check_url(url)
    kwargs: dict[str, Any] = {"engine_kwargs": engine_kwargs(url)}
    if heartbeat_s is not None:
        kwargs.update(heartbeat_interval=heartbeat_s, grace_period=grace_s)
        if on_lost is not None:  # renamed in Optuna 4.9
            params = inspect.signature(optuna.storages.RDBStorage).parameters
            name = "heartbeat_stale_trial_callback"
            kwargs[name if name in params else "failed_trial_callback"] = on_lost
    last: Exception | None = None
    for attempt in range(4):
        try:
            return optuna.storages.RDBStorage(url, **kwargs)
        except OperationalError as exc:  # unreachable, wrong password, no such database
            last = exc
            message = _clean(str(getattr(exc, "orig", None) or exc), url)
            if "authentication" in message or "does not exist" in message:
                break
        except Exception as exc:  # workers creating the tables at the same time race
            last = exc
        time.sleep(RETRY_S * (attempt + 1))
    message = _clean(str(getattr(last, "orig", None) or last), url)
    raise SpecDecError(f"cannot open Optuna storage '{redact(url)}': {message}") from None


def _lock_key(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


class StorageLock:
    """A named mutex shared by every worker of one storage; released when its holder dies.

    Storages without a lock (e.g. an in-memory SQLite) get a no-op lock: then a trial that lost
    the race for the last slot is ended as pruned and not counted (see `tuner`).
    """

    def __init__(self, url: str, name: str) -> None:
        self.url, self.name, self.key = url, name, _lock_key(name)
        self.held = False
        self._conn: Any = None
        self._file: Any = None

    # One attempt; True when this worker now holds the lock.
    def _try(self) -> bool:
        if self.url.startswith("sqlite"):
            return self._try_file()
        if self.url.startswith(("postgresql", "mysql")):
            from sqlalchemy import text

            if self._conn is None:
                self._connect()
            if self.url.startswith("postgresql"):
                sql, args = "SELECT pg_try_advisory_lock(:k)", {"k": self.key}
            else:
                sql, args = "SELECT GET_LOCK(:n, 0)", {"n": f"specdec-{self.key}"}
            return bool(self._conn.execute(text(sql), args).scalar())
        return True

    def _connect(self) -> None:
        from sqlalchemy import create_engine, text
        from sqlalchemy.pool import NullPool

        engine = create_engine(self.url, poolclass=NullPool, **engine_kwargs(self.url))
        self._conn = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        if self.url.startswith("postgresql"):
            # The server notices a vanished holder (a host gone) and drops its lock within ~30 s.
            for k, v in (("idle", 15), ("interval", 5), ("count", 3)):
                self._conn.execute(text(f"SET tcp_keepalives_{k} = {v}"))

    def _try_file(self) -> bool:
        import fcntl

        db = self.url.split("///", 1)[1] if "///" in self.url else ""
        if not db or db == ":memory:":
            return True
        if self._file is None:
            folder = Path(f"{db}.locks")
            folder.mkdir(parents=True, exist_ok=True)
            self._file = open(folder / f"{self.key & 0xFFFFFFFFFFFF:012x}.lock", "a+")  # noqa: SIM115
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    def acquire(self, timeout_s: float | None = None, poll_s: float = 0.1) -> bool:
        """Wait for the lock (at most `timeout_s`); False when the wait timed out."""
        if self.held:
            return True
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._try():
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(poll_s)
        self.held = True
        return True

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        if self._file is not None:
            import fcntl

            fcntl.flock(self._file, fcntl.LOCK_UN)
        elif self._conn is not None:
            from sqlalchemy import text

            sql = "SELECT pg_advisory_unlock(:k)" if self.url.startswith("postgresql") else None
            try:
                if sql:
                    self._conn.execute(text(sql), {"k": self.key})
                else:
                    self._conn.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": f"specdec-{self.key}"})
            except Exception:  # a broken connection: the server dropped the lock with it
                self._conn = None

    def close(self) -> None:
        self.release()
        for handle in (self._conn, self._file):
            if handle is not None:
                handle.close()
        self._conn = self._file = None
