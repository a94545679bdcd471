"""The deployment of docs/deployment.md end to end: ``cookbook/deploy_fastapi.py`` under ``uvicorn
--workers 2`` on a private PostgreSQL server (``pg_cluster`` in tests/conftest.py), driven over HTTP.

Every request opens its own connection, so the kernel hands requests to both workers; each response
names its worker (``X-Worker-Pid``). The tests check that every message of a user is recalled by every
worker, that users never see each other's messages, that a deletion is seen by the other worker, that
bad requests get 4xx JSON errors and that SIGTERM shuts the server down cleanly (every worker runs its
lifespan shutdown and closes its database connections).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from functools import partial
from pathlib import Path
from typing import Any

import pytest

for _module in ("fastapi", "uvicorn", "httpx"):
    pytest.importorskip(_module, reason=f"{_module} is not installed (pip install fastapi uvicorn httpx)")

import httpx  # noqa: E402

from tests.support import ROOT  # noqa: E402

WORKERS = 2
START_TIMEOUT = 60.0
# Distinctive words: each message is found by its own text and by no other message's.
WORDS = [
    "amber", "basil", "cedar", "delta", "ember", "falcon", "garnet", "harbor",
    "indigo", "juniper", "kelp", "lantern", "meadow", "nickel", "orchid", "pepper",
    "quartz", "raven", "saffron", "tundra", "umber", "violet", "willow", "xenon",
]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``uvicorn cookbook.deploy_fastapi:app --workers 2`` in its own process group.

    Args:
        db_url: the ``HIERMEM_DB`` URL.
        log: file receiving uvicorn's output.
    """

    def __init__(self, db_url: str, log: Path) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        env = {**os.environ, "HIERMEM_DB": db_url, "HIERMEM_EMBEDDER": "hash", "HIERMEM_MEMORY": "segtree"}
        env.update(TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
        cmd = [sys.executable, "-m", "uvicorn", "cookbook.deploy_fastapi:app"]
        cmd += ["--workers", str(WORKERS), "--host", "127.0.0.1", "--port", str(self.port)]
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.pids: set[int] = set()

    def log_tail(self) -> str:
        """The end of uvicorn's output, for failure messages."""
        return self.log.read_text(errors="replace")[-3000:]

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """One request on a new connection; records the worker that answered."""
        r = httpx.request(method, self.base + path, timeout=30.0, headers={"Connection": "close"}, **kw)
        if "X-Worker-Pid" in r.headers:
            self.pids.add(int(r.headers["X-Worker-Pid"]))
        return r

    def wait_ready(self) -> None:
        """Wait until both workers have answered ``/healthz`` (concurrent requests reach both)."""
        deadline = time.monotonic() + START_TIMEOUT
        with ThreadPoolExecutor(8) as pool:
            while len(self.pids) < WORKERS:
                assert self.proc.poll() is None, f"uvicorn exited:\n{self.log_tail()}"
                assert time.monotonic() < deadline, f"the workers did not all answer:\n{self.log_tail()}"
                try:
                    for r in pool.map(lambda _: self.request("GET", "/healthz"), range(8)):
                        assert r.status_code == 200 and r.json() == {"status": "ok"}
                except httpx.TransportError:
                    time.sleep(0.2)

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM to the process group (uvicorn and its workers); SIGKILL after ``timeout`` seconds.
        Returns uvicorn's exit code."""
        if self.proc.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        with suppress(ProcessLookupError):  # anything left in the group (a worker whose parent died)
            os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.wait(10)


@pytest.fixture
def start_server(pg_cluster: Any, tmp_path: Path) -> Iterator[Callable[[], tuple[Server, str]]]:
    """Starts the app on a new database; returns (server, database name). Always terminated."""
    servers: list[Server] = []

    def start() -> tuple[Server, str]:
        db = pg_cluster.create_database()
        server = Server(pg_cluster.url(db, connect_timeout="3"), tmp_path / f"uvicorn-{len(servers)}.log")
        servers.append(server)
        server.wait_ready()
        return server, db

    try:
        yield start
    finally:
        for server in servers:
            server.terminate()


@pytest.fixture(scope="module")
def module_server(pg_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for the module's HTTP tests (each test uses its own users)."""
    db = pg_cluster.create_database()
    server = Server(
        pg_cluster.url(db, connect_timeout="3"), tmp_path_factory.mktemp("deploy") / "uvicorn.log"
    )
    try:
        server.wait_ready()
        yield server
    finally:
        server.terminate()


def _add(server: Server, user: str, text: str, **extra: str) -> tuple[str, int]:
    r = server.request("POST", f"/users/{user}/messages", json={"text": text, **extra})
    assert r.status_code == 201, r.text
    return str(r.json()["id"]), int(r.headers["X-Worker-Pid"])


def _recall(server: Server, user: str, q: str, **params: Any) -> tuple[list[dict[str, Any]], int]:
    r = server.request("GET", f"/users/{user}/recall", params={"q": q, **params})
    assert r.status_code == 200, r.text
    return r.json()["hits"], int(r.headers["X-Worker-Pid"])


def _found(server: Server, user: str, mid: str, text: str) -> int:
    """Recall ``text``: its message must be a hit; returns the worker's pid."""
    hits, pid = _recall(server, user, text)
    assert any(h["source_ids"] == [mid] and h["text"] == text for h in hits), hits
    return pid


def _until_every_worker(server: Server, check: Callable[[], int], limit: int = 200) -> None:
    """Run ``check`` (which returns the pid that answered) until every worker has passed it."""
    seen: set[int] = set()
    for _ in range(limit):
        seen.add(check())
        if seen >= server.pids and len(seen) == WORKERS:
            return
    pytest.fail(f"only workers {sorted(seen)} of {sorted(server.pids)} answered in {limit} requests")


# --------------------------------------------------------------------------- tests
def test_every_worker_recalls_every_message_of_its_user_only(module_server: Server) -> None:
    server = module_server
    users = ("alice", "bob")
    ids: dict[str, dict[str, str]] = {u: {} for u in users}  # message id -> text
    adders: dict[str, set[int]] = {u: set() for u in users}  # the workers that added to the user

    def add(job: tuple[str, int]) -> None:
        user, n = job
        text = f"{user} note {n}: the {WORDS[n % 24]} {WORDS[-1 - n % 24]} key is {user}{n:03d}"
        mid, pid = _add(server, user, text, speaker=user)
        ids[user][mid] = text
        adders[user].add(pid)

    with ThreadPoolExecutor(8) as pool:  # both users' adds at once, spread over both workers
        list(pool.map(add, [(u, n) for n in range(12) for u in users]))
    for u in users:  # until both workers have written to each user's namespace
        for n in range(12, 100):
            if len(adders[u]) == WORKERS:
                break
            add((u, n))
        assert len(adders[u]) == WORKERS, f"one worker took every add of {u}: {adders[u]}"

    def recalled(user: str, mid: str, text: str) -> int:
        hits, pid = _recall(server, user, text, k=10)
        leaf = [h for h in hits if h["text"] == f"{user}: {text}"]
        assert leaf and leaf[0]["source_ids"] == [mid], (pid, hits)
        for other in users:  # a user's hits only ever draw on that user's messages
            if other != user:
                assert not any(set(h["source_ids"]) & set(ids[other]) for h in hits), hits
                assert not any(other in h["text"] for h in hits), hits
        return pid

    def one_message(job: tuple[str, str, str]) -> None:
        _until_every_worker(server, lambda: recalled(*job))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one_message, [(u, mid, t) for u in users for mid, t in ids[u].items()]))

    # the other user's exact texts find nothing of theirs; an unknown user has no memories
    for user, other in (("alice", "bob"), ("bob", "alice")):
        for text in list(ids[other].values())[:3]:
            hits, _ = _recall(server, user, text)
            assert hits and not any(set(h["source_ids"]) & set(ids[other]) for h in hits)
    assert _recall(server, "nobody", next(iter(ids["alice"].values())))[0] == []


def test_a_delete_is_seen_by_the_other_worker(module_server: Server) -> None:
    server = module_server
    texts = [f"carol fact {i}: {WORDS[i]} {WORDS[i + 5]} {WORDS[i + 10]}" for i in range(6)]
    ids = [_add(server, "carol", t)[0] for t in texts]
    for mid, text in zip(ids, texts):  # every worker has carol's memory open and up to date
        _until_every_worker(server, partial(_found, server, "carol", mid, text))

    r = server.request("DELETE", f"/users/carol/messages/{ids[0]}")
    assert r.status_code == 200 and r.json() == {"deleted": 1}, r.text
    deleter = int(r.headers["X-Worker-Pid"])

    def gone() -> int:
        hits, pid = _recall(server, "carol", texts[0])
        assert not any(ids[0] in h["source_ids"] for h in hits), (pid, deleter, hits)
        assert any(h["source_ids"] == [ids[1]] for h in _recall(server, "carol", texts[1])[0])
        return pid

    _until_every_worker(server, gone)

    def deleted_again() -> int:
        r = server.request("DELETE", f"/users/carol/messages/{ids[0]}")
        assert r.status_code == 404 and r.json()["error"] == "NodeNotFoundError", r.text
        return int(r.headers["X-Worker-Pid"])

    _until_every_worker(server, deleted_again)


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "error"),
    [
        ("POST", "/users/dave/messages", {"text": "   "}, 400, "InvalidInputError"),
        ("POST", "/users/dave/messages", {"speaker": "dave"}, 422, None),
        ("POST", "/users/dave/messages", {"text": 42}, 422, None),
        (
            "POST",
            "/users/%01dave/messages",
            {"text": "a control character in the user"},
            400,
            "InvalidInputError",
        ),
        ("GET", "/users/dave/recall?q=dogs&policy=no_such_policy", None, 400, "UnknownPolicyError"),
        ("GET", "/users/dave/recall?q=dogs&k=0", None, 422, None),
        ("GET", "/users/dave/recall", None, 422, None),
        ("DELETE", "/users/dave/messages/no-such-id", None, 404, "NodeNotFoundError"),
        ("DELETE", "/users/nobody-at-all/messages/no-such-id", None, 404, "NodeNotFoundError"),
    ],
)
def test_bad_requests_get_json_errors(
    module_server: Server, method: str, path: str, body: Any, status: int, error: str | None
) -> None:
    _add(module_server, "dave", "dave likes dogs")  # the user exists, so the policy is checked
    r = module_server.request(method, path, json=body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    payload = r.json()
    assert payload["detail"], payload
    if error is not None:
        assert payload["error"] == error and isinstance(payload["detail"], str), payload


def test_sigterm_shuts_every_worker_down_cleanly(
    start_server: Callable[[], tuple[Server, str]], pg_cluster: Any
) -> None:
    server, db = start_server()
    mid, _ = _add(server, "erin", "erin keeps bees")
    count = "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
    assert pg_cluster.execute(db, count, (db,))[0][0] >= WORKERS  # every worker holds connections

    assert server.terminate() == 0, server.log_tail()
    log = server.log.read_text(errors="replace")
    assert log.count("Application shutdown complete.") == WORKERS, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    deadline = time.monotonic() + 10
    while pg_cluster.execute(db, count, (db,))[0][0] and time.monotonic() < deadline:
        time.sleep(0.1)  # a closed connection's server process may take a moment to exit
    assert pg_cluster.execute(db, count, (db,))[0][0] == 0, "a worker left its connections open"
    stored = "SELECT count(*) FROM hiermem.nodes WHERE message LIKE %s"
    assert pg_cluster.execute(db, stored, (f'%"{mid}"%',))[0][0] == 1  # the acknowledged add is stored
