"""The code blocks of the docs pages with examples on PostgreSQL (a ``postgresql://`` URL, an ``sql``
block), one test case per block (id ``file:line``), run as tests/unit/docs/test_docs_examples.py runs the
other pages' blocks; every URL points to a new database of the test session's private server."""

from __future__ import annotations

import pytest

from tests.support.docs import BLOCKS, POSTGRES_PAGES, Block, run_block

PG_BLOCKS = [b for b in BLOCKS if b.path in POSTGRES_PAGES]


@pytest.mark.parametrize("block", PG_BLOCKS, ids=[b.id for b in PG_BLOCKS])
def test_doc_block(block: Block, request, tmp_path_factory, docs_env) -> None:
    run_block(block, request, tmp_path_factory)
