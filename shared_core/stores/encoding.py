"""Row encoding shared by every store: how a memory becomes rows and how rows become a memory again.

Both backends store the same rows; only their SQL differs:

- a node is one row ``(id, parent, children, text, span_first, span_last, is_leaf, level, data,
  message)``: ``children`` an ordered JSON list, ``text`` UTF-8 bytes (lone surrogates a model may have
  produced survive as ``surrogatepass`` bytes), ``is_leaf`` 0 or 1, ``data`` a JSON object, ``message``
  the message's JSON or ``NULL``;
- a vector is ``(id, vec)``: the L2-normalised vector as little-endian float32 bytes;
- the memory's metadata are ``(key, value)`` rows with JSON values: ``format``, ``memory_format``,
  ``kind``, ``config``, ``dim``, ``state``, ``usage``, ``root``, ``next_id``, ``n_inserted``.

JSON is ASCII (``ensure_ascii``), so a value never holds a NUL byte or a lone surrogate that a database
would refuse. Nothing is ever unpickled: every value read is checked before it reaches the memory.

This module knows the memory only through its attributes (``_store``, ``_index``, ``_pending``,
``_get_state`` ...); it never imports :mod:`shared_core.memories.base`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..search.index import NodeIndex, normalize_rows
from ..tree.nodes import Node
from ..types import PersistenceError, Usage, VersionMismatchError

if TYPE_CHECKING:
    from ..memories.base import HierarchicalMemory

__all__ = [
    "MEMORY_FORMAT",
    "NODE_COLUMNS",
    "Changes",
    "apply_changes",
    "check_memory_format",
    "decode_meta",
    "dumps",
    "full_rows",
    "node_row",
    "pending_changes",
    "restore_rows",
    "vec_blob",
]

#: Version of the memory's plain-data format (``HierarchicalMemory.FORMAT_VERSION``).
MEMORY_FORMAT = 1

NODE_COLUMNS = (
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
#: Metadata keys every complete store holds.
REQUIRED_META = frozenset({"format", "memory_format", "kind", "config", "root", "next_id", "n_inserted"})


# --------------------------------------------------------------------------- values
def dumps(value: Any) -> str:
    """ASCII JSON of ``value`` (lone surrogates are escaped, never a bind error)."""
    return json.dumps(value, ensure_ascii=True, separators=(",", ":"))


def enc_text(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def dec_text(raw: Any) -> str:
    if isinstance(raw, memoryview):
        raw = raw.tobytes()
    if isinstance(raw, str):
        return raw
    if not isinstance(raw, bytes):
        raise PersistenceError(f"a node text of type {type(raw).__name__} is stored")
    return raw.decode("utf-8", "surrogatepass")


def node_row(node: Node) -> tuple[Any, ...]:
    """The row of ``node``, in :data:`NODE_COLUMNS` order."""
    return (
        node.id,
        node.parent,
        dumps(list(node.children)),
        enc_text(node.text),
        int(node.span[0]),
        int(node.span[1]),
        int(bool(node.is_leaf)),
        int(node.level),
        dumps(node.data),
        dumps(node.message.to_dict()) if node.message is not None else None,
    )


def decode_node(row: Sequence[Any]) -> dict[str, Any]:
    """The plain-data node (``Node.to_dict()`` shape) of a row in :data:`NODE_COLUMNS` order.

    Raises:
        PersistenceError: a malformed value.
    """
    nid, parent, children, text, s0, s1, is_leaf, level, data, message = row
    out = {
        "id": int(nid),
        "parent": None if parent is None else int(parent),
        "children": json.loads(children),
        "text": dec_text(text),
        "span": [int(s0), int(s1)],
        "is_leaf": bool(is_leaf),
        "level": int(level),
        "data": json.loads(data),
        "message": None if message is None else json.loads(message),
    }
    if not isinstance(out["children"], list) or not isinstance(out["data"], dict):
        raise PersistenceError(f"node {nid} has malformed children or data")
    if out["message"] is not None and not isinstance(out["message"], dict):
        raise PersistenceError(f"node {nid} has a malformed message")
    return out


def vec_blob(vec: np.ndarray) -> bytes:
    """The stored form of a vector: L2-normalised little-endian float32 bytes."""
    v = normalize_rows(np.asarray(vec, dtype=np.float32).reshape(1, -1))[0]
    return v.astype("<f4").tobytes()


def decode_vectors(dim: Any, rows: Iterable[Sequence[Any]]) -> dict[int, np.ndarray]:
    """Vectors by node id from ``(id, vec)`` rows.

    Raises:
        PersistenceError: a missing dimension, a blob of the wrong length or a non-finite value.
    """
    rows = list(rows)
    if not rows:
        return {}
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise PersistenceError("the vector dimension is missing")
    out = {}
    for nid, blob in rows:
        if isinstance(blob, memoryview):
            blob = blob.tobytes()
        if not isinstance(blob, bytes) or len(blob) != 4 * dim:
            raise PersistenceError(f"the vector of node {nid} is not {dim} float32 values")
        v = np.frombuffer(blob, dtype="<f4").astype(np.float32)
        if not np.isfinite(v).all():
            raise PersistenceError(f"the vector of node {nid} holds non-finite values")
        out[int(nid)] = v
    return out


def decode_meta(rows: Iterable[Sequence[Any]], location: str, layout: int) -> dict[str, Any] | None:
    """Decode and check the ``(key, value)`` metadata rows of a store.

    Args:
        rows: the rows.
        location: the store's name for messages (a path or a URL without password).
        layout: the store layout version this backend reads (the ``format`` key).

    Returns:
        The metadata, or ``None`` when there are no rows (a new store).

    Raises:
        PersistenceError: malformed or incomplete metadata.
        VersionMismatchError: another store layout.
    """
    rows = list(rows)
    if not rows:
        return None
    try:
        meta = {str(k): json.loads(v) for k, v in rows}
    except (TypeError, ValueError, RecursionError) as e:
        raise PersistenceError(
            f"The metadata of {location} is not valid JSON ({e}); the store is corrupt."
        ) from None
    if not set(meta) >= REQUIRED_META:
        raise PersistenceError(
            f"{location} lacks {', '.join(sorted(REQUIRED_META - set(meta)))}; it is not a complete "
            "hiermem store."
        )
    if meta["format"] != layout:
        raise VersionMismatchError(
            f"{location} uses store layout {meta['format']!r}; this hiermem reads layout {layout}. "
            "Open it with the hiermem version that wrote it and rebuild the memory from its messages."
        )
    if not isinstance(meta["kind"], str) or not isinstance(meta["config"], dict):
        raise PersistenceError(f"{location} has a malformed kind or config; the store is corrupt.")
    return meta


def check_memory_format(meta: dict[str, Any], memory_format: int, location: str) -> None:
    """Raise :class:`VersionMismatchError` when the store holds another memory format version."""
    if meta["memory_format"] != memory_format:
        raise VersionMismatchError(
            f"{location} holds memory format {meta['memory_format']!r}; this hiermem reads {memory_format}."
        )


# --------------------------------------------------------------------------- memory -> rows
def scalars(mem: HierarchicalMemory) -> dict[str, Any]:
    st = mem._store
    return {"root": st.root, "next_id": st.next_id, "n_inserted": st.n_inserted}


def full_rows(
    mem: HierarchicalMemory, layout: int
) -> tuple[list[tuple[Any, ...]], list[tuple[int, bytes]], dict[str, Any]]:
    """Every node row, every vector row and the whole metadata of ``mem`` (for a first write).

    Raises:
        TypeError, ValueError: the memory holds data that is not JSON-serialisable.
    """
    st = mem._store
    ids = [i for i in sorted(st.nodes) if st.nodes[i].text]
    vecs = mem._index.get(ids) if (mem._index is not None and ids) else np.zeros((0, 1), np.float32)
    rows = [node_row(st.nodes[i]) for i in sorted(st.nodes)]
    vrows = [(i, vec_blob(v)) for i, v in zip(ids, vecs)]
    meta = {
        "format": layout,
        "memory_format": mem.FORMAT_VERSION,
        "kind": mem.kind,
        "config": mem._config(),
        "dim": mem._index.dim if mem._index is not None else None,
        "state": mem._get_state(),
        "usage": mem._usage.to_dict(),
        **scalars(mem),
    }
    return rows, vrows, meta


@dataclass
class Changes:
    """What one transaction of a memory writes.

    Attributes:
        rows: node rows created or changed (:data:`NODE_COLUMNS` order).
        gone: ids of removed nodes.
        vectors: ``(id, vec)`` rows of nodes whose text changed.
        drop_vectors: ids whose vector goes (removed nodes and nodes left without text).
        meta: metadata to upsert (state, usage, dim and the store's counters).
    """

    rows: list[tuple[Any, ...]] = field(default_factory=list)
    gone: list[int] = field(default_factory=list)
    vectors: list[tuple[int, bytes]] = field(default_factory=list)
    drop_vectors: list[int] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)


def pending_changes(mem: HierarchicalMemory) -> Changes:
    """The rows the open transaction of ``mem`` writes: nodes touched, created or removed, vectors of
    nodes whose text changed, state, usage and counters.

    Raises:
        PersistenceError: a node with text has no vector (an internal error).
        TypeError, ValueError: the memory holds data that is not JSON-serialisable.
    """
    st = mem._store
    touched = set(st._saved)  # every node created, changed or removed in the open transaction
    ch = Changes()
    ch.gone = [i for i in sorted(touched) if i not in st.nodes]
    ch.drop_vectors = list(ch.gone)
    for i in sorted(st.changed):
        node = st.nodes.get(i)
        if node is None:
            continue
        if node.text:
            pending = mem._pending.get(i)
            if pending is None or pending[0] != node.text:
                raise PersistenceError(f"node {i} has no vector for its text (an internal error)")
            ch.vectors.append((i, vec_blob(pending[1])))
        else:
            ch.drop_vectors.append(i)
    dim = mem._index.dim if mem._index is not None else None
    if dim is None and ch.vectors:
        dim = len(ch.vectors[0][1]) // 4
    usage = (mem._usage + mem._tx_usage).to_dict()
    ch.rows = [node_row(st.nodes[i]) for i in sorted(touched) if i in st.nodes]
    ch.meta = {"state": mem._get_state(), "usage": usage, "dim": dim, **scalars(mem)}
    dumps(ch.meta)  # not JSON-serialisable: fail here, before the database is touched
    return ch


def cleared_meta(mem: HierarchicalMemory) -> dict[str, Any]:
    """The metadata of ``mem`` after ``clear()`` (configuration and usage stay)."""
    return {"state": mem._initial_state(), "root": None, "next_id": 0, "n_inserted": 0, "dim": None}


# --------------------------------------------------------------------------- rows -> memory
def _index_of(dim: Any, ids: list[int], vectors: dict[int, np.ndarray]) -> NodeIndex | None:
    if not ids:
        if vectors:
            raise PersistenceError("vectors are stored for nodes without text")
        return None
    if set(vectors) != set(ids):
        raise PersistenceError("the stored vectors do not match the nodes with text")
    index = NodeIndex(int(dim))
    index.upsert(ids, np.stack([vectors[i] for i in ids]).astype(np.float32))
    return index


def _state_usage(meta: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    state = meta.get("state") or {}
    usage = meta.get("usage") or {}
    if not isinstance(state, dict) or not isinstance(usage, dict):
        raise PersistenceError("state or usage is not an object")
    return state, usage


def restore_rows(
    mem: HierarchicalMemory,
    meta: dict[str, Any],
    node_rows: Iterable[Sequence[Any]],
    vector_rows: Iterable[Sequence[Any]],
    location: str,
) -> None:
    """Rebuild ``mem``'s node store, state, usage and FAISS index from a store's rows.

    Raises:
        PersistenceError: the rows are malformed or inconsistent (``mem`` is then unchanged).
    """
    try:
        nodes = [decode_node(r) for r in node_rows]
        next_id = int(meta["next_id"])
        if nodes and next_id <= max(n["id"] for n in nodes):
            raise PersistenceError("the next node id is not above every stored id")
        tree = {"root": meta["root"], "next_id": next_id, "n_inserted": meta["n_inserted"], "nodes": nodes}
        vectors = decode_vectors(meta.get("dim"), vector_rows)
        index = _index_of(meta.get("dim"), sorted(n["id"] for n in nodes if n["text"]), vectors)
        state, usage = _state_usage(meta)
    except PersistenceError as e:
        raise PersistenceError(f"The store {location} is corrupt: {e}") from None
    except (TypeError, ValueError, KeyError, RecursionError) as e:
        raise PersistenceError(f"The store {location} is corrupt: {type(e).__name__}: {e}") from None
    try:
        mem._restore({"tree": tree, "state": state, "usage": usage}, index)
    except PersistenceError:
        raise
    except Exception as e:
        raise PersistenceError(
            f"The store {location} holds a malformed memory: {type(e).__name__}: {e}"
        ) from None


def _unregister_leaf(st: Any, node: Node) -> None:
    idx = node.span[0]
    if st.leaf_at.get(idx) == node.id:
        del st.leaf_at[idx]
        if idx < len(st.source_at):
            st.source_at[idx] = None
    if node.message is not None and node.message.id is not None:
        lst = st.by_source.get(node.message.id, [])
        if node.id in lst:
            lst.remove(node.id)
        if not lst:
            st.by_source.pop(node.message.id, None)


def apply_changes(
    mem: HierarchicalMemory,
    meta: dict[str, Any],
    node_rows: Iterable[Sequence[Any]],
    gone: Iterable[int],
    vector_rows: Iterable[Sequence[Any]],
    location: str,
) -> None:
    """Bring ``mem`` up to date with the changes other writers committed: the node rows changed since
    the state ``mem`` holds, the ids removed since, the vectors written since and the current metadata.

    Everything is decoded and checked before ``mem`` is touched; the node store's bookkeeping (leaves
    by insertion index and by source id), the FAISS index, the lexical index, the algorithm state and
    the usage counters are then updated in place, at a cost proportional to the change.

    Raises:
        PersistenceError: malformed rows (``mem`` is then unchanged).
    """
    try:
        nodes = [Node.from_dict(decode_node(r)) for r in node_rows]
        gone_ids = {int(i) for i in gone}
        root = meta["root"]
        root = None if root is None else int(root)
        next_id, n_inserted = int(meta["next_id"]), int(meta["n_inserted"])
        vectors = decode_vectors(meta.get("dim"), vector_rows)
        state, usage_d = _state_usage(meta)
        usage = Usage(**usage_d)
        for n in nodes:
            if n.is_leaf and not 0 <= n.span[0] < n_inserted:
                raise PersistenceError(f"leaf {n.id} has an insertion index outside the tree")
            if n.text and n.id not in vectors and (mem._index is None or n.id not in mem._index):
                raise PersistenceError(f"node {n.id} has text but no vector")
    except PersistenceError as e:
        raise PersistenceError(f"The store {location} is corrupt: {e}") from None
    except (TypeError, ValueError, KeyError, RecursionError) as e:
        raise PersistenceError(f"The store {location} is corrupt: {type(e).__name__}: {e}") from None
    st = mem._store
    changed = {n.id for n in nodes}
    forgotten = _forgotten_by_others(mem, nodes, gone_ids - changed)
    for nid in gone_ids | changed:
        old = st.nodes.get(nid)
        if old is None:
            continue
        if old.is_leaf:
            _unregister_leaf(st, old)
        if nid in gone_ids and nid not in changed:
            del st.nodes[nid]
    st.root, st.next_id, st.n_inserted = root, next_id, n_inserted
    if len(st.source_at) < n_inserted:
        st.source_at.extend([None] * (n_inserted - len(st.source_at)))
    sources: set[str] = set()
    for n in nodes:
        st.nodes[n.id] = n
        if n.is_leaf:
            st.leaf_at[n.span[0]] = n.id
            st.source_at[n.span[0]] = n.message.id if n.message is not None else None
            if n.message is not None and n.message.id is not None:
                st.by_source.setdefault(n.message.id, []).append(n.id)
                sources.add(n.message.id)
    for s in sources:  # leaves of one source id in insertion order
        st.by_source[s].sort(key=lambda i: st.nodes[i].span[0])
    textless = {n.id for n in nodes if not n.text}
    drop = (gone_ids - changed) | textless
    if mem._index is not None:
        mem._index.remove(sorted(i for i in drop if i in mem._index))
    live = sorted(i for i in vectors if i in st.nodes and st.nodes[i].text)
    if live:
        if mem._index is None:
            mem._index = NodeIndex(int(meta["dim"]))
        mem._index.upsert(live, np.stack([vectors[i] for i in live]))
    st.note_changes(gone_ids | changed)
    mem._vectors_written(set(live) | drop)
    mem._set_state(state)
    mem._usage = usage
    if mem._lexical is not None:
        mem._lex_dirty |= {i for i in changed if st.nodes[i].text}
        mem._lex_removed |= drop
    mem._version += 1
    mem._query_memo = None
    if forgotten:  # another process deleted messages: this process's caches forget them too
        mem._forget_texts(forgotten, {i for i in changed if st.nodes[i].text}, drop)


def _forgotten_by_others(mem: HierarchicalMemory, nodes: list[Node], gone: set[int]) -> list[str]:
    """The texts whose sentences the caches of ``mem`` must forget when another process's changes
    remove the leaves ``gone`` and write ``nodes``: each removed leaf's text and message text, and, for a
    memory whose internal texts are not made of its messages' sentences (``forget_rewritten``), the
    previous text of every internal node removed or rewritten (as the deleting process itself forgets,
    see :meth:`~shared_core.memories.forgetting.Forgetting._forgotten_texts`)."""
    st = mem._store
    out = [
        t
        for i in sorted(gone)
        if (n := st.nodes.get(i)) is not None and n.is_leaf
        for t in (n.text, n.message.text if n.message else "")
        if t
    ]
    if out and mem.forget_rewritten:
        new = {n.id: n.text for n in nodes}
        for i in sorted(gone | set(new)):
            old = st.nodes.get(i)
            if old is not None and not old.is_leaf and old.text and new.get(i) != old.text:
                out.append(old.text)
    return out
