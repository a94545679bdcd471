"""A private PostgreSQL server for the tests: a throw-away cluster in a temporary directory, reached only
through a Unix socket in that directory (no TCP port is opened).

``initdb`` and ``postgres`` refuse to run as root; as root (CI) the server runs as the ``postgres``
system user (``runuser -u postgres``), which owns the temporary directory. The binaries are found with
``HIERMEM_PG_BINDIR``, ``pg_config --bindir``, the ``PATH`` or Debian's ``/usr/lib/postgresql/*/bin``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["PgCluster", "find_bindir", "server_user"]

_NEEDED = ("initdb", "pg_ctl", "postgres")


def _complete(d: Path) -> bool:
    return all((d / b).is_file() and os.access(d / b, os.X_OK) for b in _NEEDED)


def find_bindir() -> Path | None:
    """The directory of the PostgreSQL server binaries, or ``None`` when there is none."""
    env = os.environ.get("HIERMEM_PG_BINDIR")
    if env:
        return Path(env) if _complete(Path(env)) else None
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=30)
            if out.returncode == 0 and out.stdout.strip():
                candidates.append(Path(out.stdout.strip()))
        except (OSError, subprocess.SubprocessError):
            pass
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(os.path.realpath(initdb)).parent)

    def version(p: str) -> tuple[int, ...]:
        part = Path(p).parent.name
        return tuple(int(x) for x in part.split(".") if x.isdigit()) or (0,)

    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)]
    return next((c for c in candidates if _complete(c)), None)


def server_user() -> str | None:
    """The user to run the server as: ``None`` for the current user, ``"postgres"`` when running as
    root. Raises ``LookupError`` as root without a ``postgres`` system user."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise LookupError(
            "running as root and there is no 'postgres' system user to run the server as"
        ) from None
    return "postgres"


class PgCluster:
    """A PostgreSQL cluster in a temporary directory; :meth:`start`, :meth:`stop`, :meth:`url`.

    Args:
        bindir: the directory of ``initdb``, ``pg_ctl`` and ``postgres``.
    """

    USER = "hiermem"
    PORT = 5432

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.run_as = server_user()
        self.root = Path(tempfile.mkdtemp(prefix="hiermem-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self._dbs = 0
        if self.run_as is not None:
            pw = pwd.getpwnam(self.run_as)
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        os.chmod(self.root, 0o700)
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            self.USER,
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )

    def _run(self, binary: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bindir / binary), *args]
        if self.run_as is not None:
            cmd = ["runuser", "-u", self.run_as, "--", *cmd]
        out = subprocess.run(cmd, cwd=self.root, capture_output=True, text=True, timeout=120)
        if check and out.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{binary} {' '.join(args)} failed: {out.stdout}\n{out.stderr}\n{log}")
        return out

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        opts = (
            f"-k {self.root} -c listen_addresses='' -p {self.PORT} -c fsync=off -c full_page_writes=off "
            "-c max_connections=200"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", opts, "-w", "-t", "120", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast`` or ``immediate``); a stopped server is left as it is."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "120", "stop", check=False)

    def url(self, dbname: str = "postgres", **params: str) -> str:
        """The libpq URL of database ``dbname`` on this server (Unix socket)."""
        extra = "".join(f"&{k}={v}" for k, v in params.items())
        return f"postgresql://{self.USER}@/{dbname}?host={self.root}&port={self.PORT}{extra}"

    def create_database(self) -> str:
        """Create a new, empty database; returns its name."""
        import psycopg

        self._dbs += 1
        name = f"test_{os.getpid()}_{self._dbs}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return name

    def execute(self, dbname: str, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        """Run one statement as the superuser in ``dbname``; returns the rows it produced."""
        import psycopg

        with psycopg.connect(self.url(dbname), autocommit=True) as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description else []

    def destroy(self) -> None:
        """Stop the server and remove the directory."""
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
