"""Every call to a store's server bounded: a server that refuses, or accepts and never answers, is one line
within a stated time naming it (its password redacted), never a hang and never a traceback.

- MLflow over HTTP: MLflow's client reads MLFLOW_HTTP_REQUEST_TIMEOUT (seconds per connect and per read),
  MLFLOW_HTTP_REQUEST_MAX_RETRIES and MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR / _JITTER at every request. Its defaults
  (120 s, 7 retries, backoff 2) wait about four minutes for a closed port and over fifteen for a silent one;
  `bound_mlflow()` sets ours (HTTP_*), unless the user set their own.
- SQL servers (PostgreSQL through psycopg): libpq's connect_timeout bounds the whole start-up (TCP, TLS,
  authentication: a server that accepts and never answers), keepalives and tcp_user_timeout notice a peer that
  went away, statement_timeout ends a statement that never returns (a lock held for ever). MLflow's own engines
  get the connect timeout through PGCONNECT_TIMEOUT, and are created only after `probe_sql` saw the server
  answer (MLflow retries a failing engine ten times over about 100 s).
- SQLite: a file another process holds locked is waited for SQLITE_BUSY_S, then one line.

`mlflow_client(uri)` makes every MlflowClient of the orchestrator (through TrackingStore.open, which readies a
SQLite store first): bounded, and a call that cannot reach the store raises TrackingError naming it; an answer of
the server (an error it gives) passes through unchanged, but for a failure the caller names (a full disk:
TrackingFull). Optuna's storage and our own probes take `engine_kwargs`.

What the server answers is checked at every call too (`foreign_answer`): an answer that is not the MLflow REST API's
(an HTML page: a reverse proxy's login page, `python -m http.server`, a proxy's 502 page; plain text; JSON without
MLflow's `error_code`) is one TrackingError line naming the URI and what it answered, e.g. `cannot use the MLflow
tracking URI 'http://127.0.0.1:8080': it answers HTML (HTTP 501 at /api/2.0/mlflow/runs/search), not the MLflow REST
API (...)`, exit 2, never MLflow's exception with the page in it.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import sys
from typing import Any, Callable
from urllib.parse import urlsplit

from orchestrator.errors import TrackingError
from orchestrator.redact import redact_uri

# MLflow over HTTP: each attempt waits at most HTTP_TIMEOUT_S to connect and HTTP_TIMEOUT_S per read; two retries
# after 0 s and 2 s (+ jitter). A closed port answers in ~3 s, a silent server in MLFLOW_BOUND_S at most.
HTTP_TIMEOUT_S = 15
HTTP_RETRIES = 2
HTTP_BACKOFF_FACTOR = 1
HTTP_BACKOFF_JITTER = 0.5
MLFLOW_BOUND_S = 60  # (retries + 1) * timeout + backoff, rounded up: what the README promises
MLFLOW_HTTP_ENV = {"MLFLOW_HTTP_REQUEST_TIMEOUT": str(HTTP_TIMEOUT_S),
                   "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(HTTP_RETRIES),
                   "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": str(HTTP_BACKOFF_FACTOR),
                   "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": str(HTTP_BACKOFF_JITTER)}

# SQL servers through libpq (psycopg): the whole connection start-up, then each statement
DB_CONNECT_TIMEOUT_S = 10
DB_STATEMENT_TIMEOUT_S = 60
DB_BOUND_S = 15  # an unreachable or silent database server: one line within this (connect timeout + start-up)
_LIBPQ_BOUNDS = {"connect_timeout": DB_CONNECT_TIMEOUT_S, "keepalives": 1, "keepalives_idle": 10,
                 "keepalives_interval": 5, "keepalives_count": 3, "tcp_user_timeout": 30_000}
_LIBPQ_DRIVERS = ("psycopg", "psycopg2", "psycopg2cffi")

MLFLOW = "MLflow tracking URI"  # how error lines name an MLflow store

SQLITE_BUSY_S = 60  # a locked SQLite file is waited for this long (Optuna, MLflow and our probes alike)

_SQL_SCHEMES = ("sqlite", "postgresql", "postgres", "mysql", "mariadb", "mssql", "oracle")


def bound_mlflow() -> None:
    """MLflow's HTTP client (and libpq under MLflow's SQL stores) within our bounds, unless the user chose theirs;
    and MLflow's own "View run ... at: <tracking URI>" lines off (a server's URI with user-info would print its
    password onto standard output at every run's end; the commands print the runs page themselves, redacted)."""
    for name, value in MLFLOW_HTTP_ENV.items():
        os.environ.setdefault(name, value)
    os.environ.setdefault("PGCONNECT_TIMEOUT", str(DB_CONNECT_TIMEOUT_S))
    os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    # MLflow's SQL store logs every database error with its traceback, then raises it to us: the commands say it
    # in one line (a full disk, a locked file), so its log would only print the same failure again as 40 lines
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)


def scheme(url: str) -> str:
    """`postgresql` of `postgresql+psycopg://...`; '' for a plain path."""
    return urlsplit(url).scheme.split("+")[0].lower()


def is_sql(url: str) -> bool:
    return scheme(url) in _SQL_SCHEMES


def engine_kwargs(url: str) -> dict[str, Any]:
    """SQLAlchemy create_engine keyword arguments (Optuna's RDBStorage engine_kwargs) that bound every connection
    and statement of `url`; a bound the URL sets itself (`?connect_timeout=30`, or PGCONNECT_TIMEOUT) is kept."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    backend, driver = parsed.get_backend_name(), parsed.get_driver_name()
    if backend == "sqlite":
        return {"connect_args": {"timeout": SQLITE_BUSY_S}}
    if backend == "postgresql" and driver in _LIBPQ_DRIVERS:
        given = set(parsed.query)
        if os.environ.get("PGCONNECT_TIMEOUT"):  # libpq reads it itself: the user's (or bound_mlflow's) setting
            given.add("connect_timeout")
        args: dict[str, Any] = {k: v for k, v in _LIBPQ_BOUNDS.items() if k not in given}
        if "options" not in given:  # a server-side bound: a statement (or a lock wait) that never ends
            args["options"] = f"-c statement_timeout={DB_STATEMENT_TIMEOUT_S * 1000}"
        return {"connect_args": args, "pool_pre_ping": True}
    return {}


def sql_engine(url: str):
    """A SQLAlchemy engine of `url` under the bounds (engine_kwargs)."""
    import sqlalchemy

    return sqlalchemy.create_engine(url, **engine_kwargs(url))


def probe_sql(url: str, what: str, error: type[Exception] = TrackingError) -> None:
    """Connect to a database server once, within the bounds; one line (`unreachable`, an `error`) when it cannot
    be reached. SQLite files are not probed here (sqlite_files.py reads them)."""
    if scheme(url) in ("", "sqlite") or not is_sql(url):
        return
    import sqlalchemy

    try:
        engine = sql_engine(url)
        try:
            with engine.connect() as conn:
                conn.execute(sqlalchemy.text("SELECT 1"))
        finally:
            engine.dispose()
    except Exception as exc:  # noqa: BLE001 -- a missing driver, a refused or silent server: it cannot be used
        raise unreachable(url, exc, what, error) from None


def unreachable(url: str, exc: BaseException, what: str = MLFLOW, error: type[Exception] = TrackingError
                ) -> Exception:
    """One line: the store (`what` and its URL, redacted), and the innermost cause's first line (redacted before
    it is cut); an answer that is not MLflow's, what it answered (`foreign_answer`)."""
    answered = foreign_answer(exc)
    if answered is not None:
        return error(f"cannot use the {what} {redact_uri(url)!r}: {answered}")
    if no_answer(exc):  # the transport's own words (the wrappers of requests, MLflow, SQLAlchemy say less)
        why = redact_uri(root_line(exc))[:300]
    else:
        text = str(exc).strip().splitlines()
        why = redact_uri(text[0])[:300] if text else type(exc).__name__
    if _timed_out(exc):
        why = f"no answer ({why})"
    return error(f"cannot use the {what} {redact_uri(url)!r}: {why}")


def _timed_out(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, TimeoutError) or "timeout" in type(seen).__name__.lower():
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def root_line(exc: BaseException) -> str:
    """The first line of the innermost cause (the wrappers of requests, MLflow and SQLAlchemy say less)."""
    while (inner := exc.__cause__ or exc.__context__) is not None:
        exc = inner
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def no_answer(exc: BaseException) -> bool:
    """Did this failure come from a store that could not be reached or did not answer (as opposed to an answer
    it gave)? Connection and timeout errors of requests/urllib3, socket errors, a database that cannot be
    connected to or used."""
    import requests

    try:
        import urllib3.exceptions as u3
        transport: tuple[type[BaseException], ...] = (requests.RequestException, u3.HTTPError)
    except ImportError:  # pragma: no cover -- requests always brings urllib3
        transport = (requests.RequestException,)
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, transport) or _db_unusable(seen):
            return True
        if isinstance(seen, OSError) and seen.errno in _NETWORK_ERRNOS:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


# MLflow's client (mlflow/utils/rest_utils.py: verify_rest_response) on an answer whose body is not a JSON object:
# "API request to endpoint E failed with error code 501 != 200. Response body: '...'", or, for a 200,
# "API request to endpoint was successful but the response body was not in a valid JSON format. Response body: '...'"
_NOT_JSON = re.compile(r"^API request to endpoint (?:(?P<endpoint>\S+) failed with error code (?P<status>\d+) != \d+|"
                       r"was successful but the response body was not in a valid JSON format)\. "
                       r"Response body: '(?P<body>.*)'\s*$", re.S)
_HTML = re.compile(r"<\s*(?:!doctype\s+html|html|head|body|title)\b", re.I)
_CREDENTIALS_REFUSED = (401, 403, 407)


def foreign_answer(exc: BaseException) -> str | None:
    """What a server answered, when it is not the MLflow REST API (whose every answer, error or not, is a JSON
    object, and whose errors carry an `error_code`): `it answers HTML (HTTP 501 at /api/...), not the MLflow REST
    API (...)`; None for any other failure (MLflow's own errors, a server that could not be reached)."""
    if "mlflow.exceptions" not in sys.modules:  # no MLflow call was made: nothing MLflow answered (nor its import)
        return None
    from mlflow.exceptions import MlflowException, RestException

    seen: BaseException | None = exc
    while seen is not None and not isinstance(seen, MlflowException):
        seen = seen.__cause__ or seen.__context__
    if seen is None:
        return None
    if isinstance(seen, RestException):
        body = getattr(seen, "json", None)
        if not isinstance(body, dict) or "error_code" in body:
            return None  # MLflow's own error (RESOURCE_DOES_NOT_EXIST, ...): the caller's to judge
        return _describe("JSON", None, "", _excerpt(str(body)))
    found = _NOT_JSON.match(str(seen))
    if found is None:
        return None
    status = int(found.group("status") or 200)
    body = found.group("body")
    if _HTML.search(body[:4096]):
        kind, quoted = "HTML", ""
    elif not body.strip():
        kind, quoted = "an empty body", ""
    else:
        kind, quoted = "text", _excerpt(body.strip().splitlines()[0])
    return _describe(kind, status, found.group("endpoint") or "", quoted)


def _excerpt(text: str) -> str:
    from search_spaces.inputs import excerpt  # quoted, one line, secrets masked, cut

    return excerpt(text)


def _describe(kind: str, status: int | None, endpoint: str, quoted: str) -> str:
    where = " ".join(x for x in (f"HTTP {status}" if status else "", f"at {endpoint}" if endpoint else "") if x)
    where = ": ".join(x for x in (where, quoted) if x)
    hint = ("are the credentials right? give them as the URI's user-info or in MLFLOW_TRACKING_USERNAME and "
            "MLFLOW_TRACKING_PASSWORD" if status in _CREDENTIALS_REFUSED else
            "is it an MLflow tracking server's URI? a reverse proxy's login page or another web server answers there")
    return f"it answers {kind}{f' ({where})' if where else ''}, not the MLflow REST API ({hint})"


_NETWORK_ERRNOS = {errno.ECONNREFUSED, errno.ECONNRESET, errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH,
                   errno.ECONNABORTED, errno.EPIPE}


def _db_unusable(exc: BaseException) -> bool:
    import sqlalchemy.exc

    return isinstance(exc, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError))


class BoundedClient:
    """An MlflowClient under the bounds: a call that cannot reach the store raises TrackingError (one line naming
    the store); a failure `known` names (e.g. a full disk: TrackingStore.open) raises what it returns; whatever
    else the store answers (including its errors) passes through."""

    def __init__(self, uri: str, known: Callable[[BaseException], Exception | None] | None = None):
        from mlflow import MlflowClient

        bound_mlflow()
        self.uri = uri
        self._known = known
        self._client = MlflowClient(tracking_uri=uri, registry_uri=uri)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def bounded(*args: Any, **kwargs: Any) -> Any:
            try:
                return attr(*args, **kwargs)
            except TrackingError:
                raise
            except Exception as exc:
                known = self._known(exc) if self._known else None
                if known is not None:
                    raise known from None
                if no_answer(exc) or foreign_answer(exc) is not None:  # unreachable, or not MLflow answering
                    raise unreachable(self.uri, exc) from None
                raise
        return bounded


def mlflow_client(uri: str, known: Callable[[BaseException], Exception | None] | None = None) -> BoundedClient:
    """The orchestrator's MlflowClient of `uri` (tracking and registry), bounded. A database server behind the
    URI is probed first (MLflow would retry it for ~100 s); a SQLite file is left to mlflow_sqlite.py."""
    bound_mlflow()
    probe_sql(uri, MLFLOW)
    try:
        return BoundedClient(uri, known)
    except TrackingError:
        raise
    except Exception as exc:  # noqa: BLE001 -- e.g. an unknown scheme, an unusable file: the URI cannot be used
        raise unreachable(uri, exc) from None
