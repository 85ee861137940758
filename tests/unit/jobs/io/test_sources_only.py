"""The read skips, unparsed, every line the admission pass did not choose."""

from __future__ import annotations

import numpy as np

from jobs.config import StorageConfig
from jobs.io.sources import _blocks, lines_of_file, ordinal_of
from jobs.io.storage import locate


def _file(tmp_path, n: int) -> str:
    path = tmp_path / "p.jsonl"
    # every other line is not even JSON: a skipped line must never be parsed
    path.write_text("".join(f'{{"id": "k{i}"}}\n' if i % 2 else "{broken\n"
                            for i in range(1, n + 1)))
    return str(path)


def test_only_the_chosen_lines_are_read(tmp_path):
    loc = locate(_file(tmp_path, 1000), StorageConfig())
    chosen = np.array([ordinal_of(1, n) for n in (7, 3, 999, 501)]
                      + [ordinal_of(0, 5), ordinal_of(2, 1)], np.int64)
    lines = lines_of_file(np.sort(chosen), 1)
    assert lines.tolist() == [3, 7, 501, 999]
    blocks = list(_blocks(loc, 1, None, 2, lines))
    assert [b.num_rows for b in blocks] == [2, 2]
    got = [line for b in blocks for line in b.column("line").to_pylist()]
    assert got == [3, 7, 501, 999]
    assert all(r.startswith('{"id"') for b in blocks for r in b.column("raw").to_pylist())


def test_no_choice_reads_every_line_and_an_empty_one_reads_none(tmp_path):
    loc = locate(_file(tmp_path, 10), StorageConfig())
    assert sum(b.num_rows for b in _blocks(loc, 0, None, 4)) == 10
    assert list(_blocks(loc, 0, None, 4, np.empty(0, np.int64))) == []
