"""The integrity guard end to end: one of two real simulator engines is switched to
broken outputs that still report success (token id 0 looping, then EOS; as SGLang
#36537) through the engine's own /sim/faults. Every row that replica made is flagged in
data/, no row of the sound replica is; the broken replica drains itself after its
window (engine.drain_window_rows) and Serve replaces it with a sound one; the run
completes; the export leaves the flagged rows out and counts them in its manifest. The drain
condemns its rows (<run>/condemned/); a plain rerun regenerates them as new versions,
so every key's latest row is sound. A third engine fault (drift: sound-looking outputs
that differ) is caught by the canary alone."""

from __future__ import annotations

import json
import time

import pytest

from jobs import cli, generate
from jobs.io.condemned import read_records
from jobs.io.run_index import latest_rows
from tests.integration.helpers import (KILLABLE_SLOWDOWN, deploy, engine_urls, read, replica_infos, run, run_config,
                                       set_faults, store_of, write_prompts, write_yaml)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration]

APP = "raygen-integrity"
ROWS = 240
WINDOW = 16
INFLIGHT = 48  # rows the job keeps in flight: bounds what a draining engine still returns


def test_a_replica_returning_broken_outputs_is_flagged_drained_and_its_rows_regenerated(
        ray_cluster, s3_endpoint, tmp_path, capsys):
    rows = write_prompts(tmp_path / "p.jsonl", ROWS)
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows), app_name=APP,
                      engine={"drain_window_rows": WINDOW},
                      serve={"graceful_shutdown_timeout_s": 2},  # held rows go at once
                      job={"rows_per_file": 16, "batch_size": 8,
                           "inflight_rows_per_actor": INFLIGHT})
    deploy(tree)
    (broken, broken_url), (sound, _) = sorted(
        (r, i["engine_url"]) for r, i in replica_infos(APP, 2).items())
    set_faults([broken_url], broken_output="token_loop")
    first = run(tree)
    assert first.status == "succeeded"
    with pytest.raises(OSError):  # drained and replaced: that engine is gone
        set_faults([broken_url], broken_output="")
    data = read(tree, "data")
    by_replica = data.groupby("replica")
    flags = {r: [list(f) for f in g["integrity_flags"]] for r, g in by_replica}
    assert all("token_run" in f and "missing_think_end" in f for f in flags[broken])
    others = set(flags) - {broken}
    assert sound in others and all(f == [] for r in others for f in flags[r])
    # Serve replaced the drained replica. Whether the newcomer got rows before the sound
    # replica finished them is the machine's timing, so ask the app, not the data.
    after_drain = replica_infos(APP, 2, where=lambda info: info["replica"] != broken)
    assert sound in after_drain and broken not in after_drain, sorted(after_drain)
    n_broken = len(flags[broken])
    # before the regenerate session: the session's end counts them, by key
    assert first.progress["flagged_latest"] == n_broken
    assert store_of(tree).read_json("progress.json")["flagged_latest"] == n_broken
    assert len(first.progress["flagged_latest_keys"]) == min(n_broken, 20)
    # It stopped taking rows once its window was full; only those already inside its
    # engine came back after that: at most every row the job had in flight (the router may
    # have put them all there). A replica that never drained would make ~ROWS / 2.
    assert WINDOW <= n_broken <= WINDOW + INFLIGHT, n_broken

    out = tmp_path / "export"
    cfg = write_yaml(tmp_path / "run.yaml", tree)
    assert cli.main(["export", "--config", str(cfg), "--format", "messages",
                     "--out", str(out)]) == 0
    manifest = json.loads((out / "export.manifest").read_text())
    assert manifest["dropped"]["integrity"] == n_broken
    assert manifest["integrity_flags"] == {"missing_think_end": n_broken, "token_run": n_broken}
    exported = [json.loads(line) for f in manifest["files"]
                for line in (out / f["name"]).read_text().splitlines()]
    sound_ids = set(data[data.replica != broken]["id"]) & set(
        data[data.finish_reason == "stop"]["id"])
    assert {r["id"] for r in exported} == sound_ids

    # The drain condemned every row it made (its window and those it held); a plain rerun
    # has nothing new to send and regenerates them as version 1, elsewhere.
    (record,) = read_records(store_of(tree))
    assert record["replica"] == broken
    assert set(record["keys"]) == set(data[data.replica == broken]["key"])
    assert generate.main(["--config", str(cfg)]) == 0
    said = capsys.readouterr().out
    assert f"regenerated: {n_broken} rows as new versions" in said
    assert "flagged:" not in said  # nothing broken is left quietly
    assert store_of(tree).read_json("progress.json")["flagged_latest"] == 0
    assert store_of(tree).read_json("report.json")["flagged"]["rows"] == 0
    after = read(tree, "data")
    latest = latest_rows(after)
    assert len(latest) == ROWS and latest["key"].is_unique
    assert all(len(f) == 0 for f in latest["integrity_flags"])
    redone = latest[latest.version == 1]
    assert set(redone["key"]) == set(record["keys"]) and broken not in set(redone["replica"])
    assert len(after) == ROWS + n_broken  # every version kept, each once
    print(f"\nintegrity: {n_broken} of {len(data)} rows flagged (replica {broken}, drained "
          f"and replaced), exported {len(exported)}, {len(redone)} regenerated")


def test_outputs_broken_on_every_engine_stop_the_run_instead_of_draining_them_all(
        ray_cluster, s3_endpoint, tmp_path, capsys):
    """Both engines break every output (drains off, as when the cause is the run's own
    settings, which a drain cannot fix): the breaker stops the session after its window
    (job.breaker.min_rows) with the flags and the fix, keeps the rows written, releases
    the lease; with the engines sound again the rerun completes."""
    from ray import serve
    app, n = "raygen-flagged", 160
    rows = write_prompts(tmp_path / "p.jsonl", n)
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows), app_name=app,
                      engine={"drain_flagged_fraction": None},
                      job={"rows_per_file": 16, "batch_size": 8})
    cfg = write_yaml(tmp_path / "flagged.yaml", tree)
    deploy(tree)
    urls = engine_urls(app, 2)
    try:
        set_faults(urls, broken_output="token_loop")
        code = generate.main(["--config", str(cfg)])
    finally:
        set_faults(urls, broken_output="")
    err = capsys.readouterr().err
    assert code == 1
    assert "job.breaker.max_flagged_fraction 50% on 2 of the 2 replicas" in err, err[-2000:]
    assert "token_run" in err and "non-thinking model" in err  # what and the fix
    store = store_of(tree)
    assert store.read_json("progress.json")["status"] == "failed"
    assert store.read_json("lease.json") is None
    held = read(tree, "data")
    assert len(held) < n and all("token_run" in list(f) for f in held["integrity_flags"])
    assert generate.main(["--config", str(cfg)]) == 0  # sound engines: the rest, exact
    after = read(tree, "data")
    assert len(after) == n and after["key"].is_unique
    print(f"\nstopped with {len(held)} flagged rows of {n} durable; the rerun wrote the rest")
    serve.delete(app, _blocking=False)  # its replicas stop while the next test runs


def test_a_replica_whose_greedy_outputs_drift_is_caught_by_the_canary_and_its_rows_redone(
        ray_cluster, s3_endpoint, tmp_path, capsys):
    """One engine of three starts drifting (sound-looking outputs that differ from the
    fleet's) while rows flow: the canary drains it, the drain condemns every row it
    returned since its canary last agreed (no flag sees a drift, so its window alone would
    leave the earlier ones), and the rerun regenerates them: no latest row is that
    engine's from after the drift began."""
    import threading
    n = 240
    rows = write_prompts(tmp_path / "p.jsonl", n)
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows), app_name="raygen-canary",
                      engine={"canary_interval_s": 3, "drain_window_rows": 4},
                      serve={"autoscaling": {"min_replicas": 3, "max_replicas": 3},
                             "graceful_shutdown_timeout_s": 2},
                      job={"rows_per_file": 8, "batch_size": 4})
    deploy(tree)
    infos = replica_infos("raygen-canary", 3, where=lambda i: i["canary_digest"])
    assert len({i["canary_digest"] for i in infos.values()}) == 1  # sound engines agree
    store = store_of(tree)
    done: list = []
    session = threading.Thread(target=lambda: done.append(run(tree)))
    session.start()
    try:
        wait_until(lambda: len(store.part_paths("data")) >= 6, 120, "rows flowing")
        # the replica the router sends most to drifts: rows keep going to it
        drift = read(tree, "data")["replica"].value_counts().index[0]
        # Every engine slowed until the drain is recorded: the session must outlast the
        # canary (every 3 s). Beside a CPU hog its rows came in one burst and it ended ~2 s
        # after the drift began, before any drain: no record to assert on.
        set_faults([i["engine_url"] for i in infos.values()], slow_rate=1.0, slow_factor=KILLABLE_SLOWDOWN)
        began = time.time()
        set_faults([infos[drift]["engine_url"]], broken_output="drift")
        wait_until(lambda: any(r["replica"] == drift for r in read_records(store))
                   or not session.is_alive(), 120, "the drift's drain recorded")
        # the rest at full speed (the drifting engine is drained: its process may be gone)
        set_faults([i["engine_url"] for r, i in infos.items() if r != drift], slow_rate=0.0)
    finally:
        session.join(300)
    sound = [(r, None) for r in infos if r != drift]
    assert done and done[0].status == "succeeded", done

    def replaced():
        now = replica_infos("raygen-canary", 3, where=lambda i: i["canary_digest"]
                            and not i["drained"])
        return drift not in now and {r for r, _ in sound} <= set(now) and now
    now = wait_until(replaced, 90, "the drifting replica drained and replaced")
    assert len({i["canary_digest"] for i in now.values()}) == 1
    data = read(tree, "data")
    after = data[(data.replica == drift) & (_seconds(data.created_at) > began + 0.5)]
    # it drained with rows of the run it had returned (recorded even when none of its
    # results came back after the drain: contract/drain_board.py)
    (record,) = [r for r in read_records(store) if r["replica"] == drift]
    assert set(after["key"]) <= set(record["keys"])  # every row since the drift: condemned
    cfg = write_yaml(tmp_path / "run.yaml", tree)
    assert generate.main(["--config", str(cfg)]) == 0
    capsys.readouterr()
    latest = latest_rows(read(tree, "data"))
    assert len(latest) == n and latest["key"].is_unique
    left = latest[(latest.replica == drift) & (_seconds(latest.created_at) > began + 0.5)]
    assert left.empty, sorted(left["key"])
    print(f"\ndrift: {len(after)} rows of the drifting replica after it began, "
          f"{len(record['keys'])} condemned, none left as a latest row")


def _seconds(created_at):
    """Epoch seconds of a created_at column (its unit is the part's: ms)."""
    return created_at.map(lambda t: t.timestamp())
