"""Durable store: every acknowledged change of a memory committed to an embedded SQLite database.

A memory with a durable store writes each ``add`` / ``delete`` / ``clear`` to SQLite in ONE transaction
before the change is acknowledged (before ``add`` returns): the nodes the transaction created, changed or
removed (parent, ordered children, text, span, level, data, message), the vectors of the nodes whose text
changed (float32 blobs), the algorithm state (JSON), the usage counters and the store's counters. When
the SQLite write fails, the in-memory transaction is rolled back and :class:`PersistenceError` is
raised, so memory and disk never disagree. After a crash (even ``SIGKILL`` in the middle of a write),
reopening the store gives exactly the acknowledged messages: SQLite's write-ahead log makes every commit
all-or-nothing.

Use::

    mem = SegTreeMem.open("memory.sqlite", embedder=emb)       # create, or reopen with the stored config
    mem.add("I adopted a dog named Luna")                       # durable when add returns
    mem.close_store()
    mem = HierarchicalMemory.open("memory.sqlite", embedder=emb)  # reopen, dispatching on the stored kind

    mem = HAT(embedder=emb, M=4); mem.attach_store("hat.sqlite")  # attach to an existing instance

The memory classes' constructors do not take a ``store=`` argument themselves (the base class accepts
``store`` for subclasses that forward it); :meth:`HierarchicalMemory.open` and
:meth:`HierarchicalMemory.attach_store` work for every memory.

Database layout (``PRAGMA journal_mode=WAL``, ``locking_mode=EXCLUSIVE``, ``synchronous=FULL`` by
default)::

    meta(key TEXT PRIMARY KEY, value TEXT)      JSON values: format, memory_format, kind, config, dim,
                                                state, usage, root, next_id, n_inserted, seq (the
                                                change sequence: one more per committed write)
    nodes(id INTEGER PRIMARY KEY, parent, children (JSON list, ordered), text (UTF-8 BLOB),
          span_first, span_last, is_leaf, level, data (JSON), message (JSON or NULL))
    vectors(id INTEGER PRIMARY KEY, vec BLOB)   L2-normalised little-endian float32, dim * 4 bytes

Usage counters are stored with every commit; the ``seconds`` of an ``add`` is measured after its commit,
so after a reopen it may differ from the in-memory figure by the duration of the last add.

One process (one memory) writes a store at a time: the connection holds SQLite's exclusive lock until
:meth:`HierarchicalMemory.close_store`, so a second opener gets :class:`PersistenceError` instead of
silently diverging. ``synchronous="NORMAL"`` keeps every acknowledged change across a process crash but
may lose the last ones on power loss; ``"FULL"`` (default) survives both at one ``fsync`` per change.

A store is data, never code: values are JSON and float32 blobs (nothing is unpickled), the schema is
checked on open (a trigger, view or unknown table is refused), and ``trusted_schema`` is off.

Forgetting: ``secure_delete`` is on (removed rows are overwritten with zeros) and a transaction that
removed nodes (a ``delete``, a ``clear``) is followed by a ``wal_checkpoint(TRUNCATE)``, so a deleted
message's text does not stay in the database file or its write-ahead log.

References:
    SQLite documentation: "Write-Ahead Logging", "PRAGMA locking_mode", "PRAGMA synchronous",
    "Atomic Commit In SQLite".
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from .index import NodeIndex, normalize_rows
from .persist import check_embedder_dim
from .types import InvalidInputError, PersistenceError, VersionMismatchError

if TYPE_CHECKING:
    from .base import HierarchicalMemory
    from .models.base import LLM, Embedder

__all__ = ["FORMAT", "SYNCHRONOUS", "DurableStore", "attach_store", "open_memory"]

M = TypeVar("M", bound="HierarchicalMemory")

#: Version of the database layout.
FORMAT = 1
#: Accepted values of ``synchronous``.
SYNCHRONOUS = ("FULL", "NORMAL", "EXTRA")

_NODE_COLUMNS = (
    "id",
    "parent",
    "children",
    "text",
    "span_first",
    "span_last",
    "is_leaf",
    "level",
    "data",
    "message",
)
_TABLES = {
    "meta": ("key", "value"),
    "nodes": _NODE_COLUMNS,
    "vectors": ("id", "vec"),
}
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS nodes (id INTEGER PRIMARY KEY, parent INTEGER, children TEXT NOT NULL, "
    "text BLOB NOT NULL, span_first INTEGER NOT NULL, span_last INTEGER NOT NULL, is_leaf INTEGER NOT NULL, "
    "level INTEGER NOT NULL, data TEXT NOT NULL, message TEXT)",
    "CREATE TABLE IF NOT EXISTS vectors (id INTEGER PRIMARY KEY, vec BLOB NOT NULL)",
)
_INSERT_NODE = f"INSERT OR REPLACE INTO nodes ({', '.join(_NODE_COLUMNS)}) VALUES ({', '.join('?' * 10)})"


def _dumps(value: Any) -> str:
    # ASCII JSON: lone surrogates a model may have produced are escaped, never a bind error.
    return json.dumps(value, ensure_ascii=True, separators=(",", ":"))


def _enc_text(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _dec_text(raw: Any) -> str:
    if isinstance(raw, str):
        return raw
    if not isinstance(raw, bytes):
        raise PersistenceError(f"A node text of type {type(raw).__name__} is stored; the store is corrupt.")
    return raw.decode("utf-8", "surrogatepass")


def _node_row(node: Any) -> tuple[Any, ...]:
    return (
        node.id,
        node.parent,
        _dumps(list(node.children)),
        _enc_text(node.text),
        int(node.span[0]),
        int(node.span[1]),
        int(bool(node.is_leaf)),
        int(node.level),
        _dumps(node.data),
        _dumps(node.message.to_dict()) if node.message is not None else None,
    )


def _vec_blob(vec: np.ndarray) -> bytes:
    v = normalize_rows(np.asarray(vec, dtype=np.float32).reshape(1, -1))[0]
    return v.astype("<f4").tobytes()


class DurableStore:
    """One SQLite database holding one memory (see the module docstring for the layout).

    Args:
        path: the database file (created with its parent directories when absent).
        synchronous: ``"FULL"`` (default; an acknowledged change survives power loss), ``"EXTRA"`` or
            ``"NORMAL"`` (survives a process crash; the last changes may be lost on power loss).
        timeout: seconds to wait for another connection's lock before giving up, default 2.0.

    Raises:
        InvalidInputError: an unknown ``synchronous`` value.
        PersistenceError: the path is a directory, not an SQLite database, not a hiermem store, or in
            use by another process.

    References:
        SQLite "Write-Ahead Logging" and "Atomic Commit In SQLite".
    """

    def __init__(self, path: str | Path, *, synchronous: str = "FULL", timeout: float = 2.0) -> None:
        if not isinstance(synchronous, str) or synchronous.upper() not in SYNCHRONOUS:
            raise InvalidInputError(f"synchronous must be one of {SYNCHRONOUS}, got {synchronous!r}.")
        path = Path(path)
        if path.is_dir():
            raise PersistenceError(
                f"{path} is a directory; give the path of a database file, e.g. mem.sqlite."
            )
        self.path = path
        self.synchronous = synchronous.upper()
        self._lock = threading.Lock()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._conn: sqlite3.Connection | None = sqlite3.connect(
                str(path), timeout=float(timeout), isolation_level=None, check_same_thread=False
            )
        except (OSError, sqlite3.Error) as e:
            raise PersistenceError(f"Cannot open the store {path}: {e}") from None
        try:
            self._setup()
            self._seq = self._stored_seq()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ connection
    @property
    def conn(self) -> sqlite3.Connection:
        """The open SQLite connection (raises :class:`PersistenceError` once closed)."""
        if self._conn is None:
            raise PersistenceError(f"The store {self.path} is closed; reopen it.")
        return self._conn

    def _setup(self) -> None:
        c = self.conn
        try:
            c.execute("PRAGMA trusted_schema=OFF")
            c.execute("PRAGMA locking_mode=EXCLUSIVE")
            mode = c.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise PersistenceError(
                    f"Cannot use write-ahead logging on {self.path} (journal mode {mode})."
                )
            c.execute(f"PRAGMA synchronous={self.synchronous}")
            c.execute("PRAGMA secure_delete=ON")  # deleted rows are overwritten, not left in free space
            self._check_schema()
            with self._tx():  # the first write takes the exclusive lock, held until close()
                for stmt in _SCHEMA:
                    c.execute(stmt)
        except sqlite3.OperationalError as e:
            if "locked" in str(e) or "busy" in str(e):
                raise PersistenceError(
                    f"The store {self.path} is in use by another memory or process (one writer per store); "
                    "close it there first (close_store())."
                ) from None
            raise PersistenceError(f"Cannot open the store {self.path}: {e}") from None
        except sqlite3.DatabaseError as e:
            raise PersistenceError(
                f"{self.path} is not a hiermem store (SQLite says: {e}); give a new path or a store made by "
                "attach_store() / open()."
            ) from None

    def _check_schema(self) -> None:
        rows = self.conn.execute("SELECT type, name FROM sqlite_master").fetchall()
        for kind, name in rows:
            if kind == "table" and name in _TABLES:
                continue
            if kind == "index" and str(name).startswith("sqlite_autoindex_"):
                continue
            raise PersistenceError(
                f"{self.path} holds an unexpected {kind} {name!r}; it is not a hiermem store "
                "(refusing to use a database with triggers, views or other tables)."
            )
        for table, cols in _TABLES.items():
            if any(name == table for _, name in rows):
                have = tuple(r[1] for r in self.conn.execute(f"PRAGMA table_info({table})").fetchall())
                if have != cols:
                    raise PersistenceError(
                        f"Table {table!r} of {self.path} has columns {have}, expected {cols}; "
                        "the store is corrupt or not a hiermem store."
                    )

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            yield c
        except BaseException:
            with suppress(sqlite3.Error):
                c.execute("ROLLBACK")
            raise
        try:
            c.execute("COMMIT")
        except BaseException:
            with suppress(sqlite3.Error):
                if c.in_transaction:  # a failed COMMIT can leave the transaction open
                    c.execute("ROLLBACK")
            raise

    def close(self) -> None:
        """Close the connection (releases the lock; idempotent)."""
        with self._lock:
            c, self._conn = self._conn, None
        if c is not None:
            with suppress(sqlite3.Error):
                c.close()

    def __repr__(self) -> str:
        return f"DurableStore({str(self.path)!r}, synchronous={self.synchronous!r})"

    # ------------------------------------------------------------------ change sequence
    def _stored_seq(self) -> int:
        """The committed change sequence number (``meta.seq``; 0 for a new store or one without it)."""
        try:
            row = self.conn.execute("SELECT value FROM meta WHERE key = 'seq'").fetchone()
        except sqlite3.Error as e:
            raise PersistenceError(f"Cannot read {self.path}: {e}") from None
        if row is None:
            return 0
        try:
            seq = json.loads(row[0])
        except (TypeError, ValueError):
            seq = None
        if isinstance(seq, bool) or not isinstance(seq, int):
            raise PersistenceError(f"The change sequence of {self.path} is malformed; the store is corrupt.")
        return seq

    @property
    def seq(self) -> int:
        """Number of the last committed write (every ``add``, ``delete``, ``clear`` and initial write)."""
        return self._seq

    def landed(self, seq: int) -> bool:
        """After a write raised: whether the write numbered ``seq`` was committed all the same.

        An exception can arrive after SQLite's ``COMMIT`` returned (``KeyboardInterrupt`` between two
        bytecodes); the stored change sequence tells. A transaction still open is rolled back here. Any
        failure to read counts as not landed.

        Args:
            seq: the number the write was to get (:attr:`seq` + 1 before it started).

        Returns:
            ``True`` when the database holds that write.
        """
        try:
            c = self.conn
            if c.in_transaction:
                c.execute("ROLLBACK")
                return False
            done = self._stored_seq() == seq
        except Exception:
            return False
        if done:
            self._seq = seq
        return done

    # ------------------------------------------------------------------ reading
    def meta(self) -> dict[str, Any] | None:
        """The stored metadata (decoded JSON), or ``None`` for a new, empty store.

        Raises:
            PersistenceError: malformed metadata.
            VersionMismatchError: written by another layout or memory format version.
        """
        from .base import HierarchicalMemory

        try:
            rows = self.conn.execute("SELECT key, value FROM meta").fetchall()
        except sqlite3.Error as e:
            raise PersistenceError(f"Cannot read {self.path}: {e}") from None
        if not rows:
            return None
        try:
            meta = {str(k): json.loads(v) for k, v in rows}
        except (TypeError, ValueError, RecursionError) as e:
            raise PersistenceError(
                f"The metadata of {self.path} is not valid JSON ({e}); the store is corrupt."
            ) from None
        need = {"format", "memory_format", "kind", "config", "root", "next_id", "n_inserted"}
        if not need <= set(meta):
            raise PersistenceError(
                f"{self.path} lacks {', '.join(sorted(need - set(meta)))}; "
                "it is not a complete hiermem store."
            )
        if meta["format"] != FORMAT:
            raise VersionMismatchError(
                f"{self.path} uses store layout {meta['format']!r}; this hiermem reads layout {FORMAT}. "
                "Open it with the hiermem version that wrote it and rebuild the memory from its messages."
            )
        if meta["memory_format"] != HierarchicalMemory.FORMAT_VERSION:
            raise VersionMismatchError(
                f"{self.path} holds memory format {meta['memory_format']!r}; this hiermem reads "
                f"{HierarchicalMemory.FORMAT_VERSION}."
            )
        if not isinstance(meta["kind"], str) or not isinstance(meta["config"], dict):
            raise PersistenceError(f"{self.path} has a malformed kind or config; the store is corrupt.")
        return meta

    def load_into(self, mem: HierarchicalMemory, meta: dict[str, Any]) -> None:
        """Rebuild ``mem``'s node store, state and FAISS index from the database.

        Raises:
            PersistenceError: the stored tree or vectors are malformed or inconsistent.
        """
        try:
            rows = self.conn.execute(f"SELECT {', '.join(_NODE_COLUMNS)} FROM nodes ORDER BY id").fetchall()
            vrows = self.conn.execute("SELECT id, vec FROM vectors").fetchall()
        except sqlite3.Error as e:
            raise PersistenceError(f"Cannot read {self.path}: {e}") from None
        try:
            nodes = []
            for nid, parent, children, text, s0, s1, is_leaf, level, data, message in rows:
                nodes.append(
                    {
                        "id": int(nid),
                        "parent": None if parent is None else int(parent),
                        "children": json.loads(children),
                        "text": _dec_text(text),
                        "span": [int(s0), int(s1)],
                        "is_leaf": bool(is_leaf),
                        "level": int(level),
                        "data": json.loads(data),
                        "message": None if message is None else json.loads(message),
                    }
                )
                if not isinstance(nodes[-1]["children"], list) or not isinstance(nodes[-1]["data"], dict):
                    raise PersistenceError(f"node {nid} has malformed children or data")
            next_id = int(meta["next_id"])
            if nodes and next_id <= max(n["id"] for n in nodes):
                raise PersistenceError("the next node id is not above every stored id")
            tree = {
                "root": meta["root"],
                "next_id": next_id,
                "n_inserted": meta["n_inserted"],
                "nodes": nodes,
            }
            index = self._index(meta, [n["id"] for n in nodes if n["text"]], vrows)
            state = meta.get("state") or {}
            usage = meta.get("usage") or {}
            if not isinstance(state, dict) or not isinstance(usage, dict):
                raise PersistenceError("state or usage is not an object")
        except PersistenceError as e:
            raise PersistenceError(f"The store {self.path} is corrupt: {e}") from None
        except (TypeError, ValueError, KeyError, RecursionError) as e:
            raise PersistenceError(f"The store {self.path} is corrupt: {type(e).__name__}: {e}") from None
        try:
            mem._restore({"tree": tree, "state": state, "usage": usage}, index)
        except PersistenceError:
            raise
        except Exception as e:
            raise PersistenceError(
                f"The store {self.path} holds a malformed memory: {type(e).__name__}: {e}"
            ) from None

    def _index(self, meta: dict[str, Any], ids: list[int], vrows: list[Any]) -> NodeIndex | None:
        if not ids:
            if vrows:
                raise PersistenceError("vectors are stored for nodes without text")
            return None
        dim = meta.get("dim")
        if not isinstance(dim, int) or dim < 1:
            raise PersistenceError("the vector dimension is missing")
        vec = {}
        for nid, blob in vrows:
            if not isinstance(blob, bytes) or len(blob) != 4 * dim:
                raise PersistenceError(f"the vector of node {nid} is not {dim} float32 values")
            vec[int(nid)] = np.frombuffer(blob, dtype="<f4")
        if set(vec) != set(ids):
            raise PersistenceError("the stored vectors do not match the nodes with text")
        mat = np.stack([vec[i] for i in ids]).astype(np.float32)
        if not np.isfinite(mat).all():
            raise PersistenceError("a stored vector holds non-finite values")
        index = NodeIndex(dim)
        index.upsert(ids, mat)
        return index

    # ------------------------------------------------------------------ writing
    def _write_meta(self, c: sqlite3.Connection, items: dict[str, Any]) -> None:
        c.executemany(
            "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
            [(k, _dumps(v)) for k, v in items.items()],
        )

    @staticmethod
    def _scalars(mem: HierarchicalMemory) -> dict[str, Any]:
        st = mem._store
        return {"root": st.root, "next_id": st.next_id, "n_inserted": st.n_inserted}

    def initialize(self, mem: HierarchicalMemory) -> None:
        """Write the whole of ``mem`` (config, state, every node and vector) in one transaction.

        Raises:
            PersistenceError: the write failed (nothing is written).
        """
        from .base import HierarchicalMemory

        st = mem._store
        ids = [i for i in sorted(st.nodes) if st.nodes[i].text]
        vecs = mem._index.get(ids) if (mem._index is not None and ids) else np.zeros((0, 1), np.float32)
        with self._guard("write the memory to"):
            rows = [_node_row(st.nodes[i]) for i in sorted(st.nodes)]
            seq = self._seq + 1
            with self._tx() as c:
                c.execute("DELETE FROM nodes")
                c.execute("DELETE FROM vectors")
                c.execute("DELETE FROM meta")
                c.executemany(_INSERT_NODE, rows)
                c.executemany(
                    "INSERT INTO vectors (id, vec) VALUES (?, ?)",
                    [(i, _vec_blob(v)) for i, v in zip(ids, vecs)],
                )
                self._write_meta(
                    c,
                    {
                        "format": FORMAT,
                        "memory_format": HierarchicalMemory.FORMAT_VERSION,
                        "kind": mem.kind,
                        "config": mem._config(),
                        "dim": mem._index.dim if mem._index is not None else None,
                        "state": mem._get_state(),
                        "usage": mem._usage.to_dict(),
                        **self._scalars(mem),
                        "seq": seq,
                    },
                )
            self._seq = seq

    def commit(self, mem: HierarchicalMemory) -> None:
        """Write the open transaction of ``mem`` (called by ``HierarchicalMemory._commit`` before the
        in-memory commit): nodes touched, created or removed, vectors of nodes whose text changed,
        state, usage and counters, in one SQLite transaction.

        Raises:
            PersistenceError: the write failed; nothing is written and the caller rolls back.
        """
        st = mem._store
        touched = set(st._saved)  # every node created, changed or removed in the open transaction
        upsert = [st.nodes[i] for i in sorted(touched) if i in st.nodes]
        gone = [i for i in sorted(touched) if i not in st.nodes]
        new_vecs: list[tuple[int, bytes]] = []
        drop_vecs = list(gone)
        for i in sorted(st.changed):
            node = st.nodes.get(i)
            if node is None:
                continue
            if node.text:
                pending = mem._pending.get(i)
                if pending is None or pending[0] != node.text:
                    raise PersistenceError(f"node {i} has no vector for its text (an internal error)")
                new_vecs.append((i, _vec_blob(pending[1])))
            else:
                drop_vecs.append(i)
        dim = mem._index.dim if mem._index is not None else None
        if dim is None and new_vecs:
            dim = len(new_vecs[0][1]) // 4
        usage = (mem._usage + mem._tx_usage).to_dict()
        with self._guard("commit the change to"):
            rows = [_node_row(n) for n in upsert]
            meta = {"state": mem._get_state(), "usage": usage, "dim": dim, **self._scalars(mem)}
            meta["seq"] = seq = self._seq + 1
            with self._tx() as c:
                c.executemany("DELETE FROM nodes WHERE id = ?", [(i,) for i in gone])
                c.executemany(_INSERT_NODE, rows)
                c.executemany("DELETE FROM vectors WHERE id = ?", [(i,) for i in drop_vecs])
                c.executemany("INSERT OR REPLACE INTO vectors (id, vec) VALUES (?, ?)", new_vecs)
                self._write_meta(c, meta)
            self._seq = seq
        if gone:
            self._forget_old_pages()

    def clear(self, mem: HierarchicalMemory) -> None:
        """Forget every node and vector (``HierarchicalMemory.clear``); config and usage stay.

        Raises:
            PersistenceError: the write failed (nothing is written).
        """
        with self._guard("clear"):
            meta = {"state": mem._initial_state(), "root": None, "next_id": 0, "n_inserted": 0, "dim": None}
            meta["seq"] = seq = self._seq + 1
            with self._tx() as c:
                c.execute("DELETE FROM nodes")
                c.execute("DELETE FROM vectors")
                self._write_meta(c, meta)
            self._seq = seq
        self._forget_old_pages()

    def _forget_old_pages(self) -> None:
        """After nodes were removed: move the log into the database and truncate it, so the old page
        images of forgotten texts do not linger in the ``-wal`` file. The commit is already durable; a
        failure here is not an error (the next checkpoint retries)."""
        with suppress(sqlite3.Error):
            self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    @contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        try:
            yield
        except PersistenceError:
            raise
        except sqlite3.Error as e:
            raise PersistenceError(
                f"Could not {what} the store {self.path}: {e}. The memory is unchanged; free disk space or "
                "check the file, then retry."
            ) from None
        except (TypeError, ValueError) as e:
            raise PersistenceError(
                f"Could not {what} the store {self.path}: the memory holds data that is not "
                f"JSON-serialisable ({e}). The memory is unchanged."
            ) from None


# --------------------------------------------------------------------------- memory integration
def _check_config(mem: HierarchicalMemory, meta: dict[str, Any], path: Path) -> None:
    if meta["kind"] != mem.kind:
        raise PersistenceError(
            f"{path} holds a {meta['kind']} memory, not a {mem.kind} one; open it with "
            "HierarchicalMemory.open(path) or use another path."
        )
    mine = json.loads(_dumps(mem._config()))
    stored = json.loads(_dumps(mem.stored_config(meta["config"])))
    if mine != stored:
        diff = sorted(k for k in set(mine) | set(stored) if mine.get(k) != stored.get(k))
        raise PersistenceError(
            f"{path} was created with another configuration ({', '.join(diff)} differ); open it with "
            f"{type(mem).__name__}.open(path) to use the stored configuration."
        )


def attach_store(mem: HierarchicalMemory, store: DurableStore) -> None:
    """Bind ``store`` to ``mem``: load the stored memory into an empty ``mem``, or write ``mem`` into a
    new store. Call with ``mem``'s lock held; on success ``mem._durable`` is ``store``.

    Raises:
        PersistenceError: both hold a memory, or the stored kind / config / dimension differ from
            ``mem``'s, or the store is corrupt.
    """
    meta = store.meta()
    if meta is None:
        store.initialize(mem)
    else:
        if mem._store.nodes or mem._store.n_inserted:
            raise PersistenceError(
                f"{store.path} already holds a memory and this one is not empty; attach a new path, or open "
                "the stored memory with HierarchicalMemory.open(path)."
            )
        _check_config(mem, meta, store.path)
        dim = meta.get("dim")
        if isinstance(dim, int):
            check_embedder_dim(mem, dim, f"{store.path} holds", "open")
        store.load_into(mem, meta)
    mem._durable = store


def open_memory(
    cls: type[M],
    path: str | Path,
    *,
    embedder: Embedder | None = None,
    llm: LLM | None = None,
    synchronous: str = "FULL",
    **kwargs: Any,
) -> M:
    """Open (or create) the memory stored at ``path`` (see :meth:`HierarchicalMemory.open`)."""
    from . import memory_classes

    store = DurableStore(path, synchronous=synchronous)
    try:
        meta = store.meta()
        if meta is None:
            if cls.kind == "memory":
                raise InvalidInputError(
                    f"{store.path} is a new store; create it with a memory class, e.g. "
                    "SegTreeMem.open(path, embedder=...)."
                )
            mem = cls(embedder, llm, **kwargs)
        else:
            klass: type[HierarchicalMemory] | None = (
                cls if cls.kind == meta["kind"] else memory_classes().get(meta["kind"])
            )
            if klass is None:
                raise PersistenceError(f"{store.path} holds an unknown memory kind {meta['kind']!r}.")
            if cls.kind not in ("memory", klass.kind):
                raise PersistenceError(
                    f"{store.path} holds a {meta['kind']} memory; open it with {klass.__name__}.open or "
                    "HierarchicalMemory.open."
                )
            config = klass.stored_config(meta["config"])
            clash = sorted(k for k, v in kwargs.items() if k in config and json.loads(_dumps(v)) != config[k])
            if clash:
                raise InvalidInputError(
                    f"{store.path} was created with {', '.join(f'{k}={config[k]!r}' for k in clash)}; "
                    "the stored configuration is kept: drop these arguments or use a new path."
                )
            extra = {k: v for k, v in kwargs.items() if k not in config}
            try:
                mem = klass(embedder, llm, **config, **extra)  # type: ignore[assignment]
            except (TypeError, InvalidInputError) as e:
                raise PersistenceError(f"The stored config does not fit {klass.__name__}: {e}") from None
        with mem._lock:
            attach_store(mem, store)
    except BaseException:
        store.close()
        raise
    return mem  # type: ignore[return-value]
