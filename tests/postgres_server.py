"""A real PostgreSQL server for tests: a throwaway cluster (initdb) in a temp dir, on 127.0.0.1 and a free port.

Debian's postgresql package (scripts/setup.sh installs it) puts the server binaries in
/usr/lib/postgresql/<version>/bin. The server refuses to run as root, so as root the cluster belongs to the
package's `postgres` user (runuser); otherwise to the user running the tests. Trust authentication on loopback
only: the cluster lives as long as the test session and holds nothing but the tests' studies.

    with PostgresServer() as pg:
        pg.create_database("optuna")   # postgresql://postgres@127.0.0.1:PORT/optuna
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.mlflow_server import free_port

SUPERUSER = "postgres"


def server_bin() -> Path | None:
    """The newest installed PostgreSQL's server binaries, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(found[-1]).parent if found else None


class PostgresServer:
    def __init__(self, root: Path | None = None):
        # its own directory under the system temp dir: pytest's are private to the test user, and the server
        # user (postgres, when the tests run as root) must reach its data directory
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="moe-autotune-pg-"))
        self.port = free_port()
        self.bin = server_bin()
        if self.bin is None:
            raise RuntimeError("PostgreSQL's server binaries are not installed (scripts/setup.sh installs postgresql)")
        self.data = self.root / "data"

    def _argv(self, tool: str, *args: str) -> list[str]:
        argv = [str(self.bin / tool), *args]
        if os.geteuid() == 0:  # the server refuses root: run it as the package's own user
            return ["runuser", "-u", SUPERUSER, "--", *argv]
        return argv

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run(self._argv(tool, *args), check=True, capture_output=True, timeout=120)

    def start(self) -> "PostgresServer":
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            user = pwd.getpwnam(SUPERUSER)
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self.root.chmod(0o700)
        self._run("initdb", "-D", str(self.data), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8")
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.root / "server.log"), "-w",
                  "-t", "60", "start")
        return self

    def create_database(self, name: str) -> str:
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", SUPERUSER, name)
        return self.url(name)

    def url(self, database: str) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def stop(self) -> None:
        if self.data.exists():
            subprocess.run(self._argv("pg_ctl", "-D", str(self.data), "-m", "immediate", "stop"),
                           capture_output=True, timeout=60)

    def __enter__(self) -> "PostgresServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
