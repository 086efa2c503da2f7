"""A tracking URI whose server answers something other than MLflow (issue 58, item 5): an HTML page (a reverse
proxy's login page, `python -m http.server`), plain text, JSON without MLflow's `error_code`. Every command that
talks to a tracking URI says so in one line naming the URI (redacted) and what it answered, exit 2 (a store that
cannot be used), instead of "internal error" (exit 70); one place judges it (orchestrator/storage/connections.py:
foreign_answer, at every call of the bounded client).

- every command (tests/orchestrator/test_network_bounds.py's MLFLOW_CASES: check, promote, promote --rollback,
  export, report, calibrate --experiment, ui, sweep) against a real `python -m http.server` in a process of its own;
- the same commands' first call, check and sweep, against a login page behind a redirect (302, then 200 HTML);
- generated answers (status, kind of body, a secret in the body) from an in-process server, through the bounded
  client: never MLflow's exception, one line, no secret; MLflow's own errors (JSON with `error_code`) still pass.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.commands.cli import main
from orchestrator.errors import TrackingError
from orchestrator.storage import connections, open_mlflow
from tests.mlflow_server import free_port
from tests.orchestrator.test_network_bounds import MLFLOW_CASES, STUDY
from tests.sweep_helpers import finished_sweep

PASSWORD = "PW-html-58-s3cr3t"
NOT_MLFLOW = "not the MLflow REST API"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A finished analytic sweep the commands are pointed away from."""
    return finished_sweep(tmp_path_factory.mktemp("not-mlflow"), STUDY)


@pytest.fixture(scope="module")
def http_server(tmp_path_factory):
    """`python -m http.server` on a free port (its folder: an empty one), as a user might have left running."""
    folder = tmp_path_factory.mktemp("www")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], cwd=folder,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):  # until it answers (it starts in well under a second)
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        else:
            pytest.fail("python -m http.server did not start")
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


class Answering:
    """An in-process HTTP server giving one answer to every GET and POST: (status, content type, body); a path
    `redirect` sends every other path there first (a proxy's login page)."""

    def __init__(self, status: int = 200, content_type: str = "text/html", body: bytes = b"", redirect: str = ""):
        self.answer = (status, content_type, body)
        self.redirect = redirect
        self.requests = 0
        self.authorizations: list[str] = []  # the Authorization header of each request ('' when none)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                outer.requests += 1
                outer.authorizations.append(self.headers.get("Authorization") or "")
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                if outer.redirect and not self.path.startswith(outer.redirect):
                    self.send_response(302)
                    self.send_header("Location", outer.redirect)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                status, ctype, body = outer.answer
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PATCH = do_DELETE = _answer

            def log_message(self, *args) -> None:  # quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> "Answering":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()


LOGIN_PAGE = b"<!DOCTYPE html><html><head><title>Sign in</title></head><body><form>...</form></body></html>"


def _uri(port: int) -> str:
    return f"http://alice:{PASSWORD}@127.0.0.1:{port}"


def _one_line(capsys, code: int, port: int) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line, got:\n{err[-3000:]}"
    line = lines[0]
    assert line.startswith("error: ") and "Traceback" not in err and "internal error" not in line, err[-3000:]
    assert PASSWORD not in err, line
    assert f"'http://***@127.0.0.1:{port}'" in line, f"the line does not name the URI, redacted: {line}"
    assert code == 2, (code, line)
    return line


def _nothing_written(world) -> None:
    import optuna

    assert not (world["root"] / "report-out").exists() and not (world["root"] / "cal.json").exists()
    names = {s.study_name for s in optuna.get_all_study_summaries(world["storage"], include_best_trial=False)}
    assert names == {STUDY}, names


@pytest.fixture
def one_try(monkeypatch):
    """MLflow's client without retries (a 5xx answer would be asked again after a back-off)."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(MLFLOW_CASES), ids=list(MLFLOW_CASES))
def test_python_http_server_as_tracking_uri_is_one_line_for_every_command(case, world, http_server, capsys):
    capsys.readouterr()
    code = main(MLFLOW_CASES[case](world, _uri(http_server)))
    line = _one_line(capsys, code, http_server)
    assert "it answers HTML (HTTP 50" in line or "it answers HTML (HTTP 404" in line, line
    assert NOT_MLFLOW in line, line
    _nothing_written(world)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", ["check", "sweep", "calibrate --experiment"])
def test_a_login_page_behind_a_redirect_is_one_line(case, world, capsys, one_try):
    with Answering(200, "text/html; charset=utf-8", LOGIN_PAGE, redirect="/login") as server:
        capsys.readouterr()
        code = main(MLFLOW_CASES[case](world, _uri(server.port)))
        line = _one_line(capsys, code, server.port)
        assert server.requests >= 2, "the command never reached the server: this test would prove nothing"
    assert "it answers HTML (HTTP 200" in line and NOT_MLFLOW in line, line
    _nothing_written(world)


@pytest.mark.timeout(60)
def test_credentials_refused_by_a_proxy_say_so(world, capsys, one_try):
    body = b"<html><body>401 Authorization Required</body></html>"
    with Answering(401, "text/html", body) as server:
        capsys.readouterr()
        line = _one_line(capsys, main(MLFLOW_CASES["check"](world, _uri(server.port))), server.port)
    assert "it answers HTML (HTTP 401" in line and "credentials" in line, line


# ---- the rule, over generated answers ---------------------------------------------------------------------------
def _mlflow_version() -> tuple[int, int]:
    from importlib.metadata import version

    major, minor = version("mlflow").split(".")[:2]
    return int(major), int(minor)


# answers MLflow's client retries (mlflow/utils/request_utils.py), then fails as for a server that does not answer
RETRIED = (408, 429, 500, 502, 503, 504)
# from MLflow 3.18 its client returns the last answer once the retries are spent (rest_utils.call_endpoint:
# raise_on_status=False), so a retried status's page is judged like any other answer
RETRIED_ANSWER_IS_READ = _mlflow_version() >= (3, 18)
SECRET = "tok-" + "Zq8xW2vR7nK4pL9s" * 2
_KINDS = {
    "html": ("text/html", lambda text: f"<!doctype html><html><body><p>{text}</p></body></html>"),
    "html fragment": ("text/html", lambda text: f"<head><title>{text}</title></head>"),
    "text": ("text/plain", lambda text: f"{text}\nsecond line"),
    "json without error_code": ("application/json", lambda text: json.dumps({"detail": text})),
}
_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=80).filter(
    lambda t: t.strip() and "error_code" not in t and "<" not in t)


def _body(kind: str, text: str, with_secret: bool) -> bytes:
    text = f"{text} Authorization: Bearer {SECRET}" if with_secret else text
    return _KINDS[kind][1](text).encode()


@settings(max_examples=max(10, settings.default.max_examples // 12), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(status=st.sampled_from([200, 400, 401, 403, 404, 405, 418, 500, 501, 502, 503]),
       kind=st.sampled_from(sorted(_KINDS)), text=_TEXT, with_secret=st.booleans())
def test_any_answer_that_is_not_mlflows_is_one_tracking_error_line(status, kind, text, with_secret, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    if status == 200 and kind == "json without error_code":
        status = 404  # a JSON object with 200 is a success to MLflow's client: nothing to judge
    with Answering(status, _KINDS[kind][0], _body(kind, text, with_secret)) as server:
        uri = _uri(server.port)
        with pytest.raises(TrackingError) as raised:
            open_mlflow(uri).search_experiments(max_results=1)
    line = str(raised.value)
    assert "\n" not in line and SECRET not in line and PASSWORD not in line, line
    if status in RETRIED and not RETRIED_ANSWER_IS_READ:  # MLflow < 3.18 asks again, then gives up without the body
        assert line == f"cannot use the MLflow tracking URI 'http://***@127.0.0.1:{server.port}': too many {status} " \
                       "error responses", line
        return
    shown = f"'http://***@127.0.0.1:{server.port}'"
    assert line.startswith(f"cannot use the MLflow tracking URI {shown}: it answers "), line
    assert NOT_MLFLOW in line, line
    expected = {"html": "HTML", "html fragment": "HTML", "text": "text", "json without error_code": "JSON"}[kind]
    assert f"it answers {expected}" in line, line
    if kind != "json without error_code":
        assert f"HTTP {status}" in line, line
    assert ("credentials" in line) == (status in (401, 403) and kind != "json without error_code"), line


@pytest.mark.timeout(60)
def test_mlflows_own_errors_still_pass_through(monkeypatch):
    """A JSON error with MLflow's `error_code` is MLflow answering: the caller judges it (a run that is not there)."""
    from mlflow.exceptions import RestException

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    body = json.dumps({"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "Run 'x' not found"}).encode()
    with Answering(404, "application/json", body) as server:
        with pytest.raises(RestException):
            open_mlflow(_uri(server.port)).get_run("x")
    assert connections.foreign_answer(ValueError("API request to endpoint /x failed with error code 501 != 200. "
                                                 "Response body: '<html>'")) is None  # only MLflow's exceptions
