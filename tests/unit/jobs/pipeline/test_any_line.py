"""Any input line is a verdict: a row to generate or a reject with a reason, never a crash.

The admission pass (and so every session and `--dry-run`) reads every line of a 900K-line
input before anything runs; one line it cannot handle used to stop the run before it
started, in every session. Here: the lines users have met (a lone surrogate from an emoji
cut in half, a 5,000-digit id, nesting deeper than Python's recursion limit, bytes that
are not UTF-8, NUL, NaN, a line longer than job.max_line_bytes), then a property test
over mutated JSONL files: the pass never raises, every line is counted once, the Ray
Data path (read -> validate) gives each line the same verdict, and no reject is an
unexpected exception in disguise.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.config import StorageConfig, parse_config
from jobs.io.sources import _blocks, iter_jsonl_lines
from jobs.io.storage import locate
from jobs.pipeline.admission import admit_inputs
from jobs.pipeline.settings import RunMode
from jobs.pipeline.validate import MAX_DEPTH, RowError, parse_row, validate_batch
from tests.support.held_index import holding

STORAGE = StorageConfig()
GOOD = {"id": "q1", "messages": [{"role": "user", "content": "Why is the sky blue? 🌤"}]}
UNEXPECTED = "cannot read this row ("  # parse_row's wording for an exception it did not foresee


def line(row) -> bytes:
    return json.dumps(row, ensure_ascii=False).encode()


def deep(n: int) -> bytes:
    return b'{"id": "deep", "messages": [{"role": "user", "content": "x", "meta": ' + \
        b"[" * n + b"]" * n + b"}]}"


HOSTILE = {
    "lone surrogate": (b'{"id": "s", "messages": [{"role": "user", "content": "cut \\ud83d"}]}',
                       "lone surrogate \\ud83d"),
    "lone low surrogate in an id": (b'{"id": "x\\udc80", "messages": [{"role": "user", '
                                    b'"content": "hi"}]}', "id contains a lone surrogate"),
    "5,000-digit id": (b'{"id": ' + b"7" * 5000 + b', "messages": [{"role": "user", '
                       b'"content": "hi"}]}', "4300 digits"),
    "nested 1,100 deep": (deep(1100), f"at most {MAX_DEPTH} are read"),
    "nested just past the limit": (deep(MAX_DEPTH), f"at most {MAX_DEPTH} are read"),
    "not UTF-8": (b'{"id": "u", "messages": [{"role": "user", "content": "caf\xe9"}]}',
                  "not valid UTF-8: byte 0xe9"),
    "NUL escape": (b'{"id": "n", "messages": [{"role": "user", "content": "a\\u0000b"}]}',
                   "NUL character"),
    "raw NUL byte": (b'{"id": "n2", "messages": [{"role": "user", "content": "a\x00b"}]}',
                     "Invalid control character"),
    "NaN": (b'{"id": "nan", "messages": [{"role": "user", "content": "x"}], "w": NaN}',
            "NaN is not a JSON value"),
    "over max_line_bytes": (b'{"id": "big", "messages": [{"role": "user", "content": "' +
                            b"x" * 9000 + b'"}]}', "more than job.max_line_bytes (8,192)"),
    "a literal backslash-u0000 is text": (b'{"id": "t", "messages": [{"role": "user", '
                                          b'"content": "see \\\\u0000"}]}', None),
}


def admit(path: Path, max_line_bytes: int = 8192):
    rejects: list[dict] = []
    result = admit_inputs([locate(str(path), STORAGE)], holding({}), False, rejects.extend,
                          max_line_bytes=max_line_bytes)
    return result, rejects


def ray_data_verdicts(path: Path, max_line_bytes: int = 8192) -> dict[int, str | None]:
    """line -> reject reason (None: valid) through the Ray Data stages' own functions."""
    blocks = list(_blocks(locate(str(path), STORAGE), 0, None, 64,
                          max_line_bytes=max_line_bytes))
    if not blocks:
        return {}
    table = validate_batch(pa.concat_tables(blocks))
    return dict(zip(table.column("line").to_pylist(), table.column("reject_reason").to_pylist()))


@pytest.mark.parametrize("name", list(HOSTILE))
def test_each_hostile_line_is_a_reject_naming_why(tmp_path, name):
    bad, reason = HOSTILE[name]
    path = tmp_path / "p.jsonl"
    path.write_bytes(line(GOOD) + b"\n" + bad + b"\n" + line({**GOOD, "id": "q2"}) + b"\n")
    result, rejects = admit(path)
    if reason is None:  # not a reject at all
        assert (result.total, len(result.table), result.rejects) == (3, 3, 0)
        return
    assert (result.total, len(result.table), result.rejects) == (3, 2, 1)
    (reject,) = rejects
    assert reject["line"] == 2 and reason in reject["reason"], reject["reason"]
    assert UNEXPECTED not in reject["reason"]
    verdicts = ray_data_verdicts(path)
    assert verdicts[1] is None and verdicts[3] is None and verdicts[2] == reject["reason"]


def test_dry_run_survives_every_hostile_line(tmp_path):
    from jobs.runs.run import dry_run
    path = tmp_path / "p.jsonl"
    bad_lines = [bad for bad, reason in HOSTILE.values() if reason]
    path.write_bytes(b"\n".join([line(GOOD)] + bad_lines) + b"\n")
    cfg = parse_config({"job": {"input": str(path), "output": str(tmp_path / "out"),
                                "run_name": "r", "max_reject_fraction": 1.0,
                                "max_line_bytes": 8192}})
    summary = dry_run(cfg, RunMode())
    assert (summary.progress["total"], summary.progress["rejected"],
            summary.progress["to_generate"]) == (1 + len(bad_lines), len(bad_lines), 1)


def test_parse_row_turns_an_unforeseen_exception_into_a_reject(monkeypatch):
    from jobs.pipeline import validate
    monkeypatch.setattr(validate, "to_canonical", lambda row: 1 / 0)
    with pytest.raises(RowError, match=r"cannot read this row \(ZeroDivisionError"):
        parse_row(line(GOOD).decode())


# --- the property: mutated JSONL -----------------------------------------------------------

SEEDS = [line(GOOD), line({"messages": [{"role": "system", "content": "be brief"},
                                         {"role": "user", "content": "2+2?"}],
                           "tools": [{"type": "function", "function": {"name": "f"}}]}),
         line({"conversations": [{"from": "human", "value": "hi"}]}), line({"id": 7, **GOOD})]
NASTY = [b"\\ud83d", b"\\udfff", b"\\u0000", b"\x00", b"\xff", b"\xc3", b"\xed\xa0\x80",
         b"NaN", b"-Infinity", b"9" * 5000, b"[" * 1500, b"]", b"{", b"}", b'"', b"\\",
         b",", b":", b"null", b"\r", b"\t", b" " * 3, "é漢🌤".encode()]


@st.composite
def mutated_line(draw) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(data)))
        action = draw(st.sampled_from(["insert", "delete", "truncate", "random"]))
        if action == "insert":
            data[at:at] = draw(st.sampled_from(NASTY))
        elif action == "delete":
            del data[at:at + draw(st.integers(1, 8))]
        elif action == "truncate":
            del data[at:]
        else:
            data[at:at] = draw(st.binary(max_size=6))
    return bytes(data).replace(b"\n", b" ")  # one line each


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(lines=st.lists(mutated_line(), min_size=1, max_size=12))
def test_any_mutated_file_gets_a_verdict_for_every_line(tmp_path, lines):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    nonblank = sum(1 for ln in lines if ln.strip())
    result, rejects = admit(path)  # must not raise, whatever the bytes
    assert result.total == nonblank
    assert len(result.table) + result.rejects == nonblank  # each line: generated or a reject
    assert len(rejects) == result.new_rejects == result.rejects
    assert all(UNEXPECTED not in r["reason"] for r in rejects), [r["reason"] for r in rejects]
    # The Ray Data path reads the same lines and reaches the same verdict on each.
    verdicts = ray_data_verdicts(path)
    by_line = {r["line"]: r["reason"] for r in rejects}
    invalid = {n: reason for n, reason in verdicts.items() if reason is not None}
    assert invalid.items() <= by_line.items()  # duplicates are admission's own rejects
    assert len(verdicts) == nonblank == len(list(iter_jsonl_lines(locate(str(path), STORAGE))))
