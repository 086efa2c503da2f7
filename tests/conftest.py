"""Shared test setup: environment every real component needs on a CPU-only machine, and what makes the suite fast
without changing what it checks (issue 33): Hypothesis profiles, template MLflow stores.

Under pytest-xdist (scripts/test.sh passes -n): every worker has its own temp folders (tmp_path) and free ports
(tests.mlflow_server.free_port); tests that share one resource carry `xdist_group` marks and run on one worker
(`--dist loadgroup`): "slurm" (the emulated cluster), "postgres" (the session's PostgreSQL cluster, the `postgres`
fixture), "wheel" (one built wheel and its venvs).
"""

import os
import signal
import sys
import time

import pytest
from hypothesis import settings

# Property tests draw their example count from the profile: the full suite (CI) 300 per property; the inner
# loop (scripts/test.sh --fast passes --hypothesis-profile=fast) the same properties on few examples; a
# nightly-size run (scripts/test.sh --deep) on thousands.
settings.register_profile("full", max_examples=300)
settings.register_profile("fast", max_examples=25)
settings.register_profile("deep", max_examples=3000)
settings.load_profile("full")

# Real Ray locally/in CI without token auth or telemetry; trainer ranks single-threaded on 2 cores.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
# A bug must fail its test, not hide behind the CLI's tidy `error: internal error: ...` line (orchestrator/
# crashlog.py): in-process and in every CLI process a test starts, an unexpected exception is raised as it is.
# Should the line still appear in a test's captured output, the test fails (pytest_runtest_makereport below).
os.environ.setdefault("MOE_AUTOTUNE_INTERNAL_ERRORS", "raise")
INTERNAL_ERROR_LINE = "error: internal error:"
from tests import store_templates  # noqa: E402
from tests.mlflow_server import mlflow_server  # noqa: E402,F401  (a real `mlflow server` on 127.0.0.1)
from tests.workers import run_temp_root  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _mlflow_store_template(tmp_path_factory):
    """Every fresh SQLite MLflow store of the session is a copy of one migrated template (tests/store_templates.py);
    the commands a test starts keep their own template (orchestrator/storage/mlflow_template.py) in the run's temp
    folder,
    never in the user's cache."""
    from orchestrator.storage.mlflow_template import CACHE_ENV

    store_templates.install(run_temp_root(tmp_path_factory) / "store-templates")
    os.environ.setdefault(CACHE_ENV, str(run_temp_root(tmp_path_factory) / "moe-autotune-cache"))
    yield


@pytest.fixture(scope="session")
def postgres():
    """One throwaway PostgreSQL cluster (tests/postgres_server.py) for the tests of this worker that need one; each
    test makes its own databases. Those tests carry xdist_group("postgres"): one worker, one cluster per run."""
    from tests.postgres_server import PostgresServer, server_bin

    try:
        import psycopg  # SQLAlchemy's PostgreSQL driver: the `team` extra
    except ImportError:
        psycopg = None
    if server_bin() is None or psycopg is None:
        reason = "PostgreSQL or psycopg is not installed (scripts/setup.sh installs postgresql and the team extra)"
        if os.environ.get("CI"):
            pytest.fail(reason)  # CI installs both: a missing install step must not pass as a skip
        pytest.skip(reason)
    with PostgresServer() as server:
        yield server


@pytest.fixture
def sweep_spec(tmp_path):
    """The one way a test builds a sweep spec: `sweep_spec(name, *bases, root=None, **changes)` is
    tests/sweep_helpers.spec_data (tiny-moe, analytic, its stores and trial directories in the test's tmp_path, or in
    `root`) with the dicts `bases` (a module's own defaults, in order) and then `changes` replacing whole fields.
    A dict: `parse_spec` it for the SweepSpec a sweep runs, `write_spec` it for the CLI."""
    from tests.sweep_helpers import spec_data

    def make(name: str = "sweep", *bases: dict, root=None, **changes) -> dict:
        merged: dict = {}
        for base in bases:
            merged.update(base)
        return spec_data(tmp_path if root is None else root, name, **{**merged, **changes})

    return make


_MLFLOW_URI_VARS = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")


@pytest.fixture(autouse=True)
def _mlflow_uri_per_test():
    """An in-process `promote` or `confirm` points MLflow's process-wide URIs at its store and exports them;
    each test starts as a fresh CLI process would, from the environment it was given."""
    saved = {k: os.environ.get(k) for k in _MLFLOW_URI_VARS}
    yield
    if "mlflow" in sys.modules:
        import mlflow

        mlflow.set_tracking_uri(None)
        mlflow.set_registry_uri(None)
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


# the stop handlers and the unraisable hook this process had before any test ran a command in it
_STOP_HANDLERS = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
_UNRAISABLE_HOOK = sys.unraisablehook


@pytest.fixture(autouse=True)
def _stop_handlers_restored():
    """An in-process command installs the handlers a stop (Ctrl-C, SIGTERM) runs: during a sweep they unwind it
    (orchestrator/commands/interrupts.py), once it returned they exit at once (exiting.py). After each test the
    process gets back the ones it had before any test (a module's fixture may run a command too): a worker stopped
    at the end of the run printed a KeyboardInterrupt's traceback from an exit hook."""
    yield
    for signum, handler in _STOP_HANDLERS.items():
        if handler is not None:  # None: installed outside Python, nothing a test changes
            signal.signal(signum, handler)
    sys.unraisablehook = _UNRAISABLE_HOOK


_CLOCKS = ("perf_counter", "monotonic", "time", "sleep")


@pytest.fixture(autouse=True)
def _clocks_left_as_found():
    """A test that patches the clock leaves it as it found it: a clock left patched would stand still, or race, for
    every later test of its worker (a budget never running out, a deadline always past)."""
    before = {name: getattr(time, name) for name in _CLOCKS}
    yield
    left = [name for name in _CLOCKS if getattr(time, name) is not before[name]]
    assert not left, f"the test left time.{', time.'.join(left)} patched"


@pytest.fixture(autouse=True)
def _records_made_in_process(monkeypatch):
    """An in-process sweep makes its MLflow records in the test's process, as it does on a pytest-xdist worker
    (whose second thread keeps any writer from being forked), with TEST_WORKERS=0 too: a test's patches of the
    tracker then reach every record. The forked writer is tested in processes of its own
    (tests/orchestrator/test_write_behind.py), and every CLI sweep a test starts runs with it."""
    monkeypatch.setattr("orchestrator.tracking.writer_process.WriterProcess.start",
                        classmethod(lambda cls, serve: None))


def pytest_configure(config):
    config.addinivalue_line("markers", "internal_error_expected: the test itself makes the CLI report an internal "
                                       "error (tests/orchestrator/test_internal_errors.py); any other test that "
                                       "shows the line fails")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test whose captured output shows the internal-error line fails, whatever it asserted."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.passed or item.get_closest_marker("internal_error_expected"):
        return
    shown = report.capstdout + report.capstderr + report.caplog
    if INTERNAL_ERROR_LINE in shown:
        line = next(ln for ln in shown.splitlines() if INTERNAL_ERROR_LINE in ln)
        report.outcome = "failed"
        report.longrepr = f"the CLI reported an internal error (a bug behind a tidy line): {line.strip()}"
