"""A MariaDB server of the test's own, for `SQLGuard(dialect="mysql")` on a real server: started as the current
user in a temporary directory, on a free loopback port, without grant tables (the tests' connections need none)."""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
from collections.abc import Sequence
from typing import Any

from fencelock.testing.servers._child import ProcessServer

INSTALL_HINT = "MariaDB is not installed: apt-get install mariadb-server (and pip install pymysql)"


def find_mariadb() -> tuple[str, str]:
    """The server binary and its data-directory installer; RuntimeError saying how to install them."""
    server = shutil.which("mariadbd") or shutil.which("mariadbd", path="/usr/sbin:/usr/local/sbin")
    install = shutil.which("mariadb-install-db")
    if server is None or install is None:
        raise RuntimeError(INSTALL_HINT)
    return server, install


class MariaDBServer(ProcessServer):
    program = "mariadbd"
    awaited = "accept a connection"
    start_timeout = 30.0
    poll_first = poll_later = 0.05

    def __init__(self) -> None:
        self.binary, self._install = find_mariadb()
        super().__init__(port=None, name="mariadb")
        self.data = os.path.join(self.dir, "data")
        self.log_path = os.path.join(self.dir, "server.log")
        self.user = getpass.getuser()

    def _prepare(self) -> None:
        if os.path.isdir(self.data):
            return
        subprocess.run([self._install, "--no-defaults", f"--datadir={self.data}", f"--user={self.user}",
                        "--auth-root-authentication-method=normal", "--skip-test-db"],
                       check=True, capture_output=True, timeout=60)

    def command_line(self) -> list[str]:
        return [self.binary, "--no-defaults", f"--datadir={self.data}", f"--user={self.user}",
                f"--port={self.port}", f"--bind-address={self.host}", f"--socket={os.path.join(self.dir, 'sock')}",
                "--skip-grant-tables", "--skip-log-bin", "--innodb-buffer-pool-size=32M",
                f"--pid-file={os.path.join(self.dir, 'mariadb.pid')}"]

    def log_paths(self) -> Sequence[str]:
        return (self.log_path,)

    def connect(self, **options: Any) -> Any:
        """A PyMySQL connection as root (no password: the server checks no grants), autocommit off."""
        import pymysql

        return pymysql.connect(**{"host": self.host, "port": self.port, "user": "root", "connect_timeout": 2,
                                  "autocommit": False, **options})

    def _ready(self) -> bool:
        try:
            conn = self.connect()
        except Exception:
            return False
        conn.close()
        return True
