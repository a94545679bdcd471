"""Session, user and namespace isolation of the adapters: no text of one session or user reaches another.

* LlamaIndex ``HierMemBlock``: one memory per ``Memory.session_id`` (in process and on disk), an explicit
  ``memory=`` never shared between sessions.
* LlamaIndex indices / retrievers / vector store: ``filters``, ``node_ids`` and ``doc_ids`` scope what is
  returned, summaries included.
* LangGraph ``HierMemStore``: namespaces and prefix searches agree with LangGraph's ``InMemoryStore``; a
  factory can never make two namespaces share a memory; a string is never split into a namespace.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.store.base import InvalidNamespaceError, PutOp
from langgraph.store.memory import InMemoryStore
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.llms import MockLLM
from llama_index.core.memory import Memory, VectorMemoryBlock
from llama_index.core.schema import Document, TextNode
from llama_index.core.vector_stores.types import (
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
)
from llama_index.core.vector_stores.utils import build_metadata_filter_fn

from langchain_hiermem.store import HierMemStore
from llamaindex_hiermem import (
    HierMemBlock,
    HierMemIndex,
    HierMemRetriever,
    SegTreeIndex,
    SessionMismatchError,
)
from llamaindex_hiermem.retrievers import metadata_matcher
from shared_core import SegTreeMem
from shared_core.namespaces import MemoryStore
from shared_core.types import InvalidInputError, ModelError
from tests.support.memory import KINDS, LLM_FREE_POLICIES, HashEmbedder, make_memory

EMB = HashEmbedder()
SECRET = "alice: my secret pin is 4242"
FILLER = [
    "I like green tea in the morning",
    "The weather is nice today",
    "My cat sleeps a lot",
    "Tell me a joke about trains",
    "I am reading a long novel",
]


def seg() -> SegTreeMem:
    return SegTreeMem(EMB, relevance="dense")


def user(text: str, **extra: Any) -> ChatMessage:
    return ChatMessage(role="user", content=text, additional_kwargs=dict(extra))


def leaf_texts(mem) -> list[str]:
    nodes = mem.to_dict()["tree"]["nodes"]
    return [n["text"] for n in sorted((n for n in nodes if n["is_leaf"]), key=lambda n: n["span"][0])]


# =========================================================================== HierMemBlock
async def test_memory_of_one_session_never_reaches_another_through_a_chat_engine():
    """The issue's repro end to end: LlamaIndex's real Memory and chat engine, MockLLM echoing its prompt."""
    block = HierMemBlock(memory_factory=seg, similarity_top_k=5, max_tokens=300)

    def engine(session: str) -> SimpleChatEngine:
        memory = Memory.from_defaults(session_id=session, token_limit=60, memory_blocks=[block])
        return SimpleChatEngine.from_defaults(llm=MockLLM(), memory=memory)

    alice, bob = engine("alice"), engine("bob")
    await alice.achat(SECRET)
    for text in FILLER:  # pushes the secret out of alice's short-term queue into the block
        await alice.achat(text)

    bob_sees = str(await bob.achat("what is the secret pin?"))  # MockLLM echoes the whole prompt
    assert "4242" not in bob_sees
    alice_sees = str(await alice.achat("what is the secret pin?"))
    assert "<hierarchical_memory>" in alice_sees and "4242" in alice_sees
    assert block.sessions() == ["alice"]  # bob's turns are all still short-term
    assert SECRET in leaf_texts(block.session_memory("alice"))


async def test_block_reads_only_the_session_memory_passes():
    block = HierMemBlock(memory_factory=seg)
    await block.aput([user(SECRET)], session_id="alice")
    await block.aput([user("bob: my dog is called Rex")], session_id="bob")
    query = [user("what is my secret pin or my dog called?")]
    # Memory passes session_id as a keyword of aget
    assert "4242" not in await block.aget(query, session_id="bob")
    assert "Rex" in await block.aget(query, session_id="bob")
    assert "4242" in await block.aget(query, session_id="alice")
    assert "Rex" not in await block.aget(query, session_id="alice")
    assert await block.aget(query, session_id="carol") == ""  # a new session has nothing
    assert block.session_memory("carol") is None  # and a read did not create a memory for it
    assert sorted(block.sessions()) == ["alice", "bob"]


async def test_block_session_ids_on_messages_and_the_default_session():
    block = HierMemBlock(memory_factory=seg)
    # messages carrying their session in additional_kwargs (how BaseMemoryBlock.aput hands it over)
    await block.aput([user(SECRET, session_id="alice"), user("bob: I live in Oslo", session_id="bob")])
    await block.aput([user("no session: the launch code is 9999")])  # the default session
    assert block.sessions() == [None, "alice", "bob"]
    assert leaf_texts(block.session_memory("alice")) == [SECRET]
    assert leaf_texts(block.session_memory("bob")) == ["bob: I live in Oslo"]
    assert leaf_texts(block.session_memory(None)) == ["no session: the launch code is 9999"]
    q = "what is the pin, the city or the launch code?"
    assert "9999" in await block.aget([user(q)])
    for sid in ("alice", "bob"):  # without the keyword, the session the messages carry applies
        text = await block.aget([user(q, session_id=sid)])
        assert text and "9999" not in text and ("4242" in text) == (sid == "alice")
    assert "4242" not in await block.aget([user(q, session_id="alice")], session_id="bob")  # keyword wins
    with pytest.raises(InvalidInputError, match="several session ids"):
        await block.aget([user("x", session_id="alice"), user(q, session_id="bob")])
    with pytest.raises(InvalidInputError):
        await block.aput([user("x")], session_id="   ")


async def test_failed_put_of_one_session_leaves_every_session_as_before():
    class FailOn(HashEmbedder):
        def embed(self, texts):
            if any("poison" in t for t in texts):
                raise ModelError("embedding service failed")
            return super().embed(texts)

    emb = FailOn()
    block = HierMemBlock(memory_factory=lambda: SegTreeMem(emb))
    await block.aput([user("alice keeps this", session_id="alice")])
    with pytest.raises(ModelError):
        await block.aput(
            [user("alice: added then undone", session_id="alice"), user("poison", session_id="bob")]
        )
    assert leaf_texts(block.session_memory("alice")) == ["alice keeps this"]
    bob = block.session_memory("bob")
    assert bob is None or leaf_texts(bob) == []


async def test_durable_block_keeps_sessions_apart_on_disk(tmp_path):
    block = HierMemBlock(memory_factory=seg, store_dir=tmp_path)
    await block.aput([user(SECRET)], session_id="alice")
    await block.aput([user("bob: my dog is called Rex")], session_id="bob")
    await block.aput([user("../alice is not a way into alice's memory")], session_id="../alice")
    block.close()
    dirs = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert len(dirs) == 3 and all(d.startswith("ns-") for d in dirs)  # one store per session

    again = HierMemBlock(memory_factory=seg, store_dir=str(tmp_path))
    assert again.sessions() == ["../alice", "alice", "bob"]
    query = [user("what is the secret pin of alice or my dog called?")]
    assert "4242" in await again.aget(query, session_id="alice")
    for other in ("bob", "../alice", "Alice", "alice "):
        assert "4242" not in await again.aget(query, session_id=other)
    assert leaf_texts(again.session_memory("bob")) == ["bob: my dog is called Rex"]
    assert again.delete_session("alice") is True
    again.close()
    third = HierMemBlock(memory_factory=seg, store_dir=tmp_path)
    assert third.sessions() == ["../alice", "bob"]
    assert await third.aget(query, session_id="alice") == ""
    third.close()


async def test_block_over_a_given_memory_store():
    store = MemoryStore(lambda ns: seg())
    block = HierMemBlock(store=store, namespace=("app", "chat"))
    await block.aput([user(SECRET)], session_id="alice")
    await block.aput([user("default session text")])
    assert store.list_namespaces() == [("app", "chat"), ("app", "chat", "alice")]
    assert leaf_texts(store.get(("app", "chat", "alice"))) == [SECRET]
    assert block.memory_store is store


async def test_explicit_memory_serves_exactly_one_session():
    mem = seg()
    block = HierMemBlock(memory=mem)
    memory = Memory.from_defaults(session_id="alice", token_limit=60, memory_blocks=[block])
    for text in [SECRET, *FILLER]:
        await memory.aput(user(text))
        await memory.aput(ChatMessage(role="assistant", content="Noted."))
    await memory.aget(input="what is my pin?")
    assert block.core is mem and block.sessions() == ["alice"] and SECRET in leaf_texts(mem)
    before = leaf_texts(mem)
    with pytest.raises(SessionMismatchError):
        await block.aget([user("what is the secret pin?")], session_id="bob")
    with pytest.raises(SessionMismatchError):
        await block.aput([user("bob: hello")], session_id="bob")
    with pytest.raises(SessionMismatchError):
        await block.aget([user("what is the secret pin?")])  # the default session is another session
    bob_memory = Memory.from_defaults(session_id="bob", token_limit=60, memory_blocks=[block])
    with pytest.raises(SessionMismatchError):
        await bob_memory.aget(input="what is the secret pin?")
    assert leaf_texts(mem) == before

    # a memory recording alice's messages is refused for another session, also by a new block
    with pytest.raises(SessionMismatchError):
        HierMemBlock(memory=mem, session_id="bob")
    fresh = HierMemBlock(memory=mem)
    with pytest.raises(SessionMismatchError):
        await fresh.aget([user("pin?")], session_id="bob")
    assert "4242" in await fresh.aget([user("what is my secret pin?")], session_id="alice")
    pinned = HierMemBlock(memory=seg(), session_id="carol")
    with pytest.raises(SessionMismatchError):
        await pinned.aput([user("dave was here")], session_id="dave")
    await pinned.aput([user("carol was here")], session_id="carol")


def test_block_argument_errors():
    with pytest.raises(InvalidInputError):
        HierMemBlock(memory=seg(), memory_factory=seg)
    with pytest.raises(InvalidInputError):
        HierMemBlock(memory=seg(), store_dir="somewhere")
    with pytest.raises(InvalidInputError):
        HierMemBlock(session_id="alice", memory_factory=seg)
    with pytest.raises(InvalidInputError):
        HierMemBlock(store=MemoryStore(seg), memory_factory=seg)
    with pytest.raises(InvalidInputError):
        HierMemBlock(store="not a store")
    with pytest.raises(InvalidInputError):
        HierMemBlock(memory_factory=seg, embed_model=EMB)
    with pytest.raises(InvalidInputError):
        HierMemBlock(embed_model=EMB, memory_kwargs={"no_such_option": 1})
    with pytest.raises(InvalidInputError):
        HierMemBlock(memory_factory=seg, namespace=("a",) * 8)
    with pytest.raises(InvalidInputError):
        HierMemBlock(memory_factory=seg, similarity_top_k=0)
    block = HierMemBlock(embed_model=EMB, memory_kwargs={"relevance": "dense"})
    assert block.memory is None
    with pytest.raises(InvalidInputError):
        _ = block.core


# =========================================================================== LlamaIndex retrievers
def _user_nodes() -> list[TextNode]:
    """Interleaved messages of two users, so every summary above two neighbours mixes them."""
    nodes = []
    for i in range(12):
        who = "alice" if i % 2 == 0 else "bob"
        tok = f"ALPHA{i}" if who == "alice" else f"BRAVO{i}"
        text = f"{tok} secret code about the garden and the dogs of {who}. {tok} is kept safe."
        nodes.append(TextNode(id_=f"n{i}", text=text, metadata={"user": who, "turn": i}))
    return nodes


BOB_ONLY = MetadataFilters(filters=[MetadataFilter(key="user", value="bob")])


def _sources(result) -> list[str]:
    """Ids of the stored nodes behind a result: itself for a leaf, ``source_ids`` for a summary."""
    return result.node.metadata.get("source_ids", [result.node.node_id])


def _texts(results) -> list[str]:
    return [r.node.get_content() for r in results]


@pytest.mark.parametrize("kind", KINDS)
def test_index_retriever_filters_never_return_another_users_text(kind):
    index = HierMemIndex(_user_nodes(), memory=make_memory(kind, EMB))
    if kind == "xmemory":
        index.memory.flush()  # close the open episode: semantics and themes over both users' messages
    query = "secret code garden dogs ALPHA0 ALPHA2 ALPHA4"
    for policy in LLM_FREE_POLICIES[kind]:
        unscoped = index.as_retriever(policy=policy, similarity_top_k=20).retrieve(query)
        assert any(int(s[1:]) % 2 == 0 for r in unscoped for s in _sources(r)), policy  # alice's is there
        found = index.as_retriever(policy=policy, similarity_top_k=20, filters=BOB_ONLY).retrieve(query)
        for r in found:
            assert "ALPHA" not in r.node.get_content() and "alice" not in r.node.get_content(), policy
            assert all(int(s[1:]) % 2 == 1 for s in _sources(r))
        if policy == "collapsed":
            assert any("BRAVO" in t for t in _texts(found))


def test_filters_flow_through_query_engines_and_the_vector_store():
    index = SegTreeIndex(_user_nodes(), embed_model=EMB, relevance="dense")
    query = "secret code garden dogs ALPHA0"
    engine = index.as_query_engine(llm=MockLLM(), filters=BOB_ONLY, similarity_top_k=10, admissible="all")
    response = engine.query(query)
    assert response.source_nodes and all("ALPHA" not in n.node.get_content() for n in response.source_nodes)
    store = index.storage_context.vector_stores[f"hiermem-{index.index_id}"]
    res = store.query(VectorStoreQuery(query_str=query, similarity_top_k=10, filters=BOB_ONLY))
    assert res.nodes and all("ALPHA" not in n.get_content() for n in res.nodes)
    res = store.query(VectorStoreQuery(query_str=query, similarity_top_k=10, node_ids=["n1", "n3"]))
    assert {n.node_id for n in res.nodes} <= {"n1", "n3"} and res.nodes
    both = index.as_retriever(similarity_top_k=10, node_ids=["n0", "n1"], admissible="all").retrieve(query)
    assert both and all(set(_sources(r)) <= {"n0", "n1"} for r in both)


def test_doc_ids_scope_to_documents():
    docs = [
        Document(text=f"{w} secret code about the garden number {i}.", id_=f"doc-{w}-{i}")
        for i in range(4)
        for w in ("alice", "bob")
    ]
    index = SegTreeIndex.from_documents(docs, embed_model=EMB, relevance="dense")
    bob_docs = [d.doc_id for d in docs if "bob" in d.doc_id]
    found = index.as_retriever(similarity_top_k=10, doc_ids=bob_docs, admissible="all").retrieve(
        "secret code"
    )
    assert found and all("alice" not in r.node.get_content() for r in found)
    with pytest.raises(InvalidInputError):
        HierMemRetriever(index.memory, doc_ids=bob_docs)  # no docstore to resolve documents
    with pytest.raises(InvalidInputError):
        HierMemRetriever(index.memory, node_ids="n1")
    with pytest.raises(InvalidInputError):
        HierMemRetriever(index.memory, filters={"user": "bob"})


async def test_llamaindex_vector_memory_block_session_filter_is_honoured():
    """LlamaIndex's own VectorMemoryBlock filters by session id; our vector store must apply the filter."""
    index = SegTreeIndex(embed_model=EMB, relevance="dense")
    store = index.storage_context.vector_stores[f"hiermem-{index.index_id}"]

    def block() -> VectorMemoryBlock:
        return VectorMemoryBlock(
            vector_store=store, embed_model=MockEmbedding(embed_dim=8), similarity_top_k=5
        )

    alice, bob = block(), block()
    await alice.aput([user(SECRET)], session_id="alice")
    await bob.aput([user("bob: my dog is called Rex")], session_id="bob")
    assert "4242" in await alice.aget([user("what is the secret pin?")], session_id="alice")
    seen = await bob.aget([user("what is the secret pin of alice?")], session_id="bob")
    assert "4242" not in seen and "Rex" in seen


FILTER_CASES = [
    MetadataFilters(filters=[MetadataFilter(key="user", value="bob")]),
    MetadataFilters(filters=[MetadataFilter(key="user", value="bob", operator=FilterOperator.NE)]),
    MetadataFilters(filters=[MetadataFilter(key="turn", value=3, operator=FilterOperator.GTE)]),
    MetadataFilters(filters=[MetadataFilter(key="user", value=["bob", "carol"], operator=FilterOperator.IN)]),
    MetadataFilters(filters=[MetadataFilter(key="user", value=["bob"], operator=FilterOperator.NIN)]),
    MetadataFilters(filters=[MetadataFilter(key="tags", value="x", operator=FilterOperator.CONTAINS)]),
    MetadataFilters(filters=[MetadataFilter(key="user", value="", operator=FilterOperator.IS_EMPTY)]),
    MetadataFilters(
        filters=[MetadataFilter(key="user", value="bob"), MetadataFilter(key="turn", value=2)],
        condition=FilterCondition.OR,
    ),
    MetadataFilters(
        filters=[MetadataFilter(key="user", value="bob"), MetadataFilter(key="turn", value=1)],
        condition=FilterCondition.NOT,
    ),
]
METADATA = [
    {"user": "alice", "turn": 0, "tags": ["x"]},
    {"user": "bob", "turn": 1, "tags": []},
    {"user": "bob", "turn": 2},
    {"user": "carol", "turn": 3, "tags": ["x", "y"]},
    {"turn": 4},
    {"user": "", "turn": "5"},
]


@pytest.mark.parametrize("filters", FILTER_CASES)
def test_metadata_matcher_agrees_with_llamaindex_vector_stores(filters):
    reference = build_metadata_filter_fn(lambda i: METADATA[int(i)], filters)

    def ref(i: int) -> bool:
        try:
            return reference(str(i))
        except TypeError:
            return False

    match = metadata_matcher(filters)
    assert [match(md) for md in METADATA] == [ref(i) for i in range(len(METADATA))]


def test_metadata_matcher_nested_filters():
    nested = MetadataFilters(
        filters=[
            MetadataFilter(key="user", value="bob"),
            MetadataFilters(
                filters=[MetadataFilter(key="turn", value=1), MetadataFilter(key="turn", value=2)],
                condition=FilterCondition.OR,
            ),
        ]
    )
    assert [metadata_matcher(nested)(md) for md in METADATA] == [False, True, True, False, False, False]


# =========================================================================== LangGraph HierMemStore
NAMESPACES = [
    ("users", "alice"),
    ("users", "alice", "notes"),
    ("users", "al"),
    ("users", "bob"),
    ("orgs", "alice"),
    ("users", "alice", "notes", "2024"),
]
PREFIXES = [
    (),
    ("users",),
    ("users", "al"),
    ("users", "alice"),
    ("users", "alice", "notes"),
    ("orgs",),
    ("alice",),
    ("users", "bob"),
    ("users", "b"),
]


def _token(ns: tuple[str, ...]) -> str:
    return "TOK" + "".join(p[0].upper() + str(len(p)) for p in ns) + str(len(ns))


def _value(ns: tuple[str, ...], n: int) -> dict[str, Any]:
    return {"text": f"{_token(ns)} private note {n} about the garden", "tag": "odd" if n % 2 else "even"}


def _key_set(items) -> set[tuple[tuple[str, ...], str]]:
    return {(tuple(i.namespace), i.key) for i in items}


_STORE_OPS = st.lists(
    st.tuples(
        st.sampled_from(range(len(NAMESPACES))), st.sampled_from(["k1", "k2", "k3"]), st.integers(-1, 3)
    ),
    min_size=1,
    max_size=14,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_STORE_OPS)
def test_store_namespaces_and_prefix_search_agree_with_langgraph(ops):
    ours = HierMemStore(embedder=EMB, memory_kwargs={"relevance": "dense"})
    ref = InMemoryStore()
    for i, key, n in ops:
        ns = NAMESPACES[i]
        for s in (ours, ref):
            if n < 0:
                s.delete(ns, key)
            else:
                s.put(ns, key, _value(ns, n))
    for prefix in PREFIXES:
        for flt in (None, {"tag": "odd"}, {"tag": {"$ne": "odd"}}):
            want = _key_set(ref.search(prefix, filter=flt, limit=1000))
            assert _key_set(ours.search(prefix, filter=flt, limit=1000)) == want, (prefix, flt)
            got = ours.search(prefix, query="private note garden TOKU5A53", filter=flt, limit=1000)
            assert _key_set(got) == want, (prefix, flt)
            for item in got:  # a hit never carries text of a namespace outside the prefix
                assert tuple(item.namespace)[: len(prefix)] == prefix
                assert item.value == ref.get(item.namespace, item.key).value
                assert _token(tuple(item.namespace)) in item.value["text"]
    # InMemoryStore also lists namespaces whose items were all deleted (or that only saw deletes);
    # HierMemStore lists the namespaces holding items: compare over those
    live = sorted({tuple(i.namespace) for i in ref.search((), limit=10_000)})
    for prefix in PREFIXES:
        want_ns = [ns for ns in ref.list_namespaces(prefix=prefix or None, limit=1000) if ns in live]
        assert ours.list_namespaces(prefix=prefix or None) == want_ns
        if prefix:
            want_ns = [ns for ns in ref.list_namespaces(suffix=prefix[-1:], limit=1000) if ns in live]
            assert ours.list_namespaces(suffix=prefix[-1:]) == want_ns
    for depth in (1, 2, 3):
        assert ours.list_namespaces(max_depth=depth) == sorted({ns[:depth] for ns in live})
    for ns in NAMESPACES:
        mem = ours.get_memory(ns)
        if mem is not None and len(mem):
            hits = mem.retrieve("private note", k=1000)
            assert all(_token(ns) in h.text for h in hits if h.is_leaf)


def test_store_retriever_view_is_one_namespace_only():
    s = HierMemStore(embedder=EMB, memory_kwargs={"relevance": "dense"})
    for ns in NAMESPACES:
        s.put(ns, "k", _value(ns, 1))
    for ns in NAMESPACES:
        docs = s.as_retriever(ns, k=50, search_kwargs={"admissible": "all"}).invoke("private note garden")
        assert docs and all(_token(ns) in d.page_content for d in docs)
        assert {tuple(d.metadata["namespace"]) for d in docs if "namespace" in d.metadata} == {ns}
    s.delete(("users", "alice"), "k")  # a delete in one namespace leaves the same key elsewhere alone
    assert s.get(("users", "alice"), "k") is None
    assert s.get(("users", "alice", "notes"), "k").value == _value(("users", "alice", "notes"), 1)
    assert s.search(("users", "alice"), query="private note", limit=10) != []  # the sub-namespaces


def test_store_factory_can_never_share_a_memory_between_namespaces():
    shared = SegTreeMem(EMB)
    s = HierMemStore(memory_factory=lambda: shared)
    s.put(("users", "alice"), "pin", {"text": SECRET})
    with pytest.raises(InvalidInputError, match="never share a memory"):
        s.put(("users", "bob"), "note", {"text": "bob: hello"})
    with pytest.raises(InvalidInputError):
        s.as_retriever(("users", "bob"))
    assert s.search(("users", "bob"), query="secret pin", limit=10) == []
    # within one batch too: the second namespace's memory would be the first's
    t = HierMemStore(memory_factory=lambda: shared)
    with pytest.raises(InvalidInputError):
        t.batch([PutOp(("a",), "k", {"text": "one"}), PutOp(("b",), "k", {"text": "two"})])
    assert t.list_namespaces() == []
    seeded = SegTreeMem(EMB)
    seeded.add(SECRET)
    with pytest.raises(InvalidInputError, match="new, empty memory"):
        HierMemStore(memory_factory=lambda: seeded).put(("users", "bob"), "k", {"text": "x"})


def test_store_refuses_a_string_as_a_namespace():
    s = HierMemStore(embedder=EMB, memory_kwargs={"relevance": "dense"})
    s.put(("a", "b"), "k", {"text": SECRET})
    s.put(("al", "ice"), "k", {"text": "alice's note"})
    with pytest.raises(InvalidNamespaceError):
        s.put("ab", "k", {"text": "x"})  # would be ("a", "b"), another user's namespace
    with pytest.raises(InvalidNamespaceError):
        s.as_retriever("ab")
    with pytest.raises(InvalidNamespaceError):
        s.get_memory("ab")
    with pytest.raises(InvalidNamespaceError):
        s.search("a", query="secret")
    with pytest.raises(InvalidNamespaceError):
        s.list_namespaces(prefix="al")
    assert [i.value["text"] for i in s.search(("a",), query="secret", limit=5)] == [SECRET]
    assert re.search("4242", str(s.search(("al",), limit=5))) is None
