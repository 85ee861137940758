"""jobs.io.sources.iter_jsonl_lines(skip_lines=k) yields exactly the lines after line k of
what a whole read yields, whatever the chunk boundaries (a grown input's new lines,
jobs/pipeline/admission_cache.py), and hashes every byte either way."""

from __future__ import annotations

import hashlib

from hypothesis import given, settings, strategies as st

from jobs.config import StorageConfig
from jobs.io import sources
from jobs.io.storage import locate

LINES = st.lists(st.one_of(st.text(alphabet="ab{} é", max_size=12), st.just("")), max_size=25)


@settings(max_examples=300, deadline=None)
@given(lines=LINES, trailing=st.booleans(), skip=st.integers(0, 30),
       chunk=st.integers(1, 16))
def test_skipped_lines_are_exactly_the_first_k(tmp_path_factory, lines, trailing, skip, chunk):
    path = tmp_path_factory.mktemp("s") / "p.jsonl"
    data = ("\n".join(lines) + ("\n" if trailing else "")).encode()
    path.write_bytes(data)
    loc = locate(str(path), StorageConfig())
    old = sources.READ_CHUNK_BYTES
    sources.READ_CHUNK_BYTES = chunk  # every boundary case, with tiny chunks
    try:
        whole = list(sources.iter_jsonl_lines(loc, None, 8))
        hasher = hashlib.sha256()
        tail = list(sources.iter_jsonl_lines(loc, hasher, 8, skip))
    finally:
        sources.READ_CHUNK_BYTES = old
    assert tail == [row for row in whole if row[0] > skip]
    assert hasher.hexdigest() == hashlib.sha256(data).hexdigest()
