"""Progress counts the input that is, not everything the run ever held.

The run holds rows of earlier sessions; this session's input may have lines fixed since
(an old reject that is now a prompt), lines removed (a row whose prompt left the input)
or new lines. progress.json's completed / failed / rejected / remaining are counted over
the current input's keys as the admission pass found them; rows outside it are reported
apart; so `remaining` and the verdict cannot read 0 before the rows exist.
"""

from __future__ import annotations

import json

from jobs.config import StorageConfig
from jobs.io.run_store import RunStore
from jobs.io.storage import locate
from jobs.pipeline.admission import admit_inputs, reject_writer
from jobs.runs.progress import InputCounts, ProgressTracker
from jobs.io.run_index import RunIndex
from tests.support.run_rows import make_row, write_rows

GOOD = [json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"q{i}"}]})
        for i in range(6)]


def session(store: RunStore, path, lines: list[str]) -> tuple[dict, InputCounts]:
    path.write_text("\n".join(lines) + "\n")
    index = RunIndex.open(store)
    admission = admit_inputs([locate(str(path), StorageConfig())], index, False,
                             reject_writer(store))
    counts = InputCounts.of(admission)
    tracker = ProgressTracker(store, admission.total, "r", "m", 60, index=index,
                              counts=counts)
    return tracker.start().stop("running"), counts


def test_fixed_bad_lines_are_prompts_to_generate_not_old_rejects(tmp_path):
    store = RunStore(str(tmp_path / "run"), StorageConfig())
    path = tmp_path / "in.jsonl"
    first, _ = session(store, path, GOOD[:4] + ['{"id": "p4", "messages": [', '{"id": "p5"}'])
    assert (first["total"], first["rejected"], first["remaining"]) == (6, 2, 4)
    write_rows(store, "data", [make_row(f"p{i}") for i in range(4)])  # session 1's rows
    # The two bad lines are fixed: they are prompts now, without rows yet.
    snap, counts = session(store, path, GOOD)
    assert (counts.held, counts.rejects) == (4, 0)
    assert (snap["total"], snap["completed"], snap["rejected"], snap["remaining"]) == (6, 4, 0, 2)
    # The old run-wide counting read remaining 0 here (4 done + 2 old rejects of 6).
    write_rows(store, "data", [make_row("p4"), make_row("p5")])
    snap, _ = session(store, path, GOOD)
    assert (snap["completed"], snap["remaining"]) == (6, 0)


def test_rows_whose_prompt_left_the_input_are_reported_apart(tmp_path):
    store = RunStore(str(tmp_path / "run"), StorageConfig())
    write_rows(store, "data", [make_row(f"p{i}") for i in range(6)] + [make_row("gone")])
    snap, counts = session(store, tmp_path / "in.jsonl", GOOD[:3] + ["{bad"])
    assert counts.outside == 4  # p3..p5 and "gone"
    assert (snap["total"], snap["completed"], snap["rejected"], snap["remaining"],
            snap["outside_input"]) == (4, 3, 1, 0, 4)
