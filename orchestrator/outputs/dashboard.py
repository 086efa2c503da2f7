"""`moe-autotune dashboard`: optuna-dashboard on a sweep's study, its storage opened as the sweep opens it.

Our storage URLs (the default `journal:///optuna.journal`) are not Optuna's: its own tools read a journal only with
`--storage-class`. So the storage is opened here (orchestrator/storage: a missing file or study is one line, nothing is
created) and handed to optuna-dashboard's WSGI app, served on 127.0.0.1 by the standard library's WSGI server (what
`optuna_dashboard.run_server` does, with a port that is taken refused in one line and a clean stop). It serves until
Ctrl-C, SIGTERM or SIGHUP, then exits 0. optuna-dashboard comes with the `dashboard` extra
(`pip install 'moe-autotune[dashboard]'`).
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import signal
import threading
from typing import Any, Iterator
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from search_spaces.errors import SpecError

from orchestrator.redact import redact_uri
from orchestrator.storage import studies
from orchestrator.userio import echo

HOST = "127.0.0.1"
INSTALL = "pip install 'moe-autotune[dashboard]' (or optuna-dashboard)"


class _Quiet(WSGIRequestHandler):
    """No line per request on standard error (the browser polls the study every few seconds)."""

    def log_message(self, format: str, *args: Any) -> None:
        return


def dashboard_app(storage: Any) -> Any:
    """optuna-dashboard's WSGI app on an opened Optuna storage; one line when it is not installed."""
    try:
        import optuna_dashboard
    except ImportError:
        raise SpecError(f"optuna-dashboard is not installed: {INSTALL}") from None
    return optuna_dashboard.wsgi(storage)


def serve(storage_url: str, study_name: str | None, port: int) -> int:
    """Serve optuna-dashboard on the study `study_name` (default: the newest) of `storage_url` until a signal; 0."""
    if importlib.util.find_spec("optuna_dashboard") is None:  # said before the storage is opened
        raise SpecError(f"optuna-dashboard is not installed: {INSTALL}")
    store = studies.open_existing_storage(storage_url)  # missing: one line, and nothing is created
    name = studies.study_named(store, storage_url, study_name)
    study_id = store.get_study_id_from_name(name)
    server = _bind(port, dashboard_app(store))
    with server, _stop_on_signals() as stop:
        # the requests are served by a thread of their own: a signal lands in this one, which only waits, never
        # inside a request (whose handler would swallow it), and the server is shut down between two requests
        worker = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                  name="optuna-dashboard", daemon=True)
        worker.start()
        try:
            echo(f"optuna-dashboard of study {name!r} in {redact_uri(storage_url)}:")
            echo(f"http://{HOST}:{port}/dashboard/studies/{study_id}")
            echo("Ctrl-C stops it")
            while worker.is_alive() and not stop.wait(0.5):
                pass
        finally:
            server.shutdown()
            worker.join()
    return 0


def _bind(port: int, app: Any) -> WSGIServer:
    try:
        return make_server(HOST, port, app, handler_class=_Quiet)
    except OSError as exc:
        taken = "is in use" if exc.errno == errno.EADDRINUSE else "cannot be listened on"
        raise SpecError(f"--port {port}: {HOST}:{port} {taken} ({exc.strerror}); pick another port") from None


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """Ctrl-C, SIGTERM and SIGHUP set the yielded event, whatever the parent left them as (a shell's background job
    starts with SIGINT ignored); the previous handlers are back afterwards."""
    stop = threading.Event()
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, lambda _signum, _frame: stop.set()) for s in signals}
    try:
        yield stop
    finally:
        for s, old in previous.items():
            signal.signal(s, old)
