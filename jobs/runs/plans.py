"""One small plan per run mode: which rows a session sends, and how many it answers for.

Each plan runs on the driver before any engine is deployed (so a refusal costs no GPU
time) and returns a :class:`Plan`: the row total progress counts against, whether
every one of them must end with a result, and the dataset to stream (built once Ray
is up). The mode itself is chosen once, from the CLI flags (``RunMode.of_flags``); its
strategy (jobs/pipeline/modes.py) says where its rows come from (``source``), which picks
the plan from ``PLANS``.

- fresh / retry-failed / pilot: the admission pass (jobs/pipeline/admission.py) over
  the inputs (a pilot's config already points at its sample, jobs/runs/pilot.py);
  new rejects are written, the reject guard may stop the run.
- continue: the truncated rows of data/ (jobs/runs/continuation.py), token-exactly.
- regenerate: the rows drained replicas condemned, with --regenerate-flagged also the
  flagged ones, sent again and written as new versions (jobs/runs/regenerate.py).
- next-turn (job.regenerate every_turn): the next turn of every open conversation,
  written as its row's next version (jobs/runs/turn_rounds.py).

What the run already holds comes from one place, its run index (jobs/io/run_index.py),
read once under the run's lease. ``dry_run`` says what a session would send, without
Ray, a lease or a write.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import ray
import ray.data

from jobs.config import RunConfig
from jobs.io.run_index import RunIndex
from jobs.io.run_store import RunStore
from jobs.io import sources
from jobs.io.storage import Location, file_info, locate
from jobs.pipeline import admission_cache, chain as pipeline, input_fingerprints
from jobs.pipeline.admission import (Admission, PrefixChanged, admit_inputs, describe_changes,
                                     reject_writer)
from jobs.pipeline.settings import RunMode, StageSettings
from jobs.runs import continuation, regenerate, turn_rounds
from jobs.runs.errors import RunError
from jobs.runs.preflight import RejectTally, plan_text, reject_problem
from jobs.runs.progress import InputCounts, ProgressTracker

logger = logging.getLogger("raygen")


@dataclass(frozen=True)
class Plan:
    total: int                                # input rows progress counts against
    expect_all: bool                          # every admitted row must end with a result
    build: Callable[[], ray.data.Dataset]     # called once Ray is up and engines deployed
    counts: Optional[InputCounts] = None      # what the input holds (the admission pass's)


def input_locations(cfg: RunConfig) -> list[Location]:
    locs = [locate(uri, cfg.storage) for uri in cfg.job.input]
    for loc in locs:
        info = file_info(loc)
        if info.type.name != "File":
            raise RunError(f"job.input {loc.uri!r} does not exist (or is not a file)")
    return locs


def plan(cfg: RunConfig, store: RunStore, inputs: list[Location], index: RunIndex,
         mode: RunMode, stage: StageSettings) -> Plan:
    """The session's plan: the one its mode's rows come from (``Strategy.source``)."""
    strategy = mode.strategy
    if stage.every_turn and strategy.every_turn_refusal:
        raise RunError(
            f"run {stage.run!r} regenerates every turn (job.regenerate every_turn): "
            f"{strategy.every_turn_refusal} is not supported there (a conversation's later "
            f"turns depend on the row's turns; a turn cut at the budget ends its "
            f"conversation, turn_stop 'length'). Give the run a larger job.max_new_tokens "
            f"in a new job.run_name.")
    return PLANS[strategy.source](cfg, store, inputs, index, mode, stage)


def next_turn_plan(cfg: RunConfig, store: RunStore, inputs: list[Location], index: RunIndex,
                   mode: RunMode, stage: StageSettings) -> Plan:
    """A round of every-turn regeneration: the next turn of each open conversation."""
    if not stage.every_turn:
        raise RunError("a next-turn session needs job.regenerate every_turn")
    check_settings(index, stage.settings_hash, stage.max_new_tokens, stage.run,
                   stage.legacy_settings_hash)
    rows = turn_rounds.open_rows(store, index, stage.settings_hash)
    logger.info("next turn of %d open conversations", sum(len(r) for r in rows.values()))
    return Plan(input_total(store, inputs, cfg.job.limit), expect_all=False,
                build=lambda: continuation.build(cfg, store, rows, stage))


def continue_plan(cfg: RunConfig, store: RunStore, inputs: list[Location], index: RunIndex,
                  mode: RunMode, stage: StageSettings) -> Plan:
    total = input_total(store, inputs, cfg.job.limit)
    target = continuation.check_total(cfg, mode.continue_to)
    wanted = continuation.to_continue(index, target, stage.settings_hash)
    rows = continuation.rows_to_read(index, wanted)
    logger.info("continuing %d truncated rows to %d total tokens", len(wanted), target)
    return Plan(total, expect_all=False,
                build=lambda: continuation.build(cfg, store, rows, stage))


def regenerate_plan(cfg: RunConfig, store: RunStore, inputs: list[Location], index: RunIndex,
                    mode: RunMode, stage: StageSettings) -> Plan:
    """The rows drained replicas condemned (and flagged rows): their prompts again, as
    new versions (jobs/runs/regenerate.py), under the run's own settings and budget."""
    check_settings(index, stage.settings_hash, stage.max_new_tokens, stage.run,
                   stage.legacy_settings_hash)
    found = regenerate.targets(store, index, mode.regenerate_flagged)
    regenerate.check_settings(found, stage.settings_hash)
    logger.info("regenerating %s as new versions", regenerate.describe(found))
    return Plan(input_total(store, inputs, cfg.job.limit), expect_all=False,
                build=lambda: continuation.build(cfg, store, found.rows, stage))


def input_total(store: RunStore, inputs: list[Location], limit: Optional[int]) -> int:
    """Rows of the inputs, each capped at job.limit: the count the admission pass
    recorded in inputs.json while the file keeps its size (no second pass over a large
    input), else counted now."""
    recorded = {p["uri"]: p for p in input_fingerprints.recorded(store) or []}
    cap = limit or 1 << 62
    total = 0
    for loc in inputs:
        seen = recorded.get(loc.uri)
        if (seen and seen.get("size") == file_info(loc).size
                and (seen.get("sha256") or seen["rows"] >= cap)):  # counted whole, or to cap
            total += min(seen["rows"], cap)
        else:
            total += min(sources.count_rows(loc), cap)
    return total


def admission_plan(cfg: RunConfig, store: RunStore, inputs: list[Location], index: RunIndex,
                   mode: RunMode, stage: StageSettings) -> Plan:
    check_samples(index, stage)
    check_settings(index, stage.settings_hash, stage.max_new_tokens, stage.run,
                   stage.legacy_settings_hash)
    reject_parts: list[list[dict[str, Any]]] = []
    tally = RejectTally()

    def collect(part: list[dict[str, Any]]) -> None:
        tally.add(part)
        reject_parts.append(part)
    admission = admit(cfg, store, inputs, index, mode.retry_failed, collect,
                      stage.samples_per_prompt)
    guard_rejects(cfg, store, admission, tally, reject_parts)

    def build() -> ray.data.Dataset:
        # The new rejects are written once progress has taken its first look, so the
        # job's reject counter counts them as this session's, as it did when the stream
        # wrote them.
        write = reject_writer(store)
        for part in reject_parts:
            write(part)
        table = [ray.put(admission.table)]  # in a list: each admit task fetches it once
        lines = np.unique(admission.table.ordinals)  # n > 1: repeated
        return pipeline.build(cfg, inputs, table, stage, [ray.put(lines)], rows=len(lines))
    return Plan(sample_total(admission), expect_all=True, build=build,
                counts=InputCounts.of(admission))


# Where a mode's rows come from (``Strategy.source``, jobs/pipeline/modes.py) -> its plan.
PLANS: dict[str, Callable[..., Plan]] = {
    "input": admission_plan, "truncated": continue_plan, "condemned": regenerate_plan,
    "open_turns": next_turn_plan}


def sample_total(admission: Admission) -> int:
    """What progress counts against: the input rows, each valid key counted once per
    sample (job.samples_per_prompt), so completed/failed/remaining are (key, sample) rows."""
    return admission.total + admission.valid_keys * (admission.samples - 1)


def check_samples(index: RunIndex, stage: StageSettings) -> None:
    """A run made with one sample per prompt holds unseeded rows: refuse n > 1 on it (its
    samples would mix two settings), saying so instead of the generic settings refusal."""
    if stage.samples_per_prompt == 1 or not stage.single_sample_hash:
        return
    rows = sum(n for (h, _), n in index.first_budgets.items() if h == stage.single_sample_hash)
    if rows:
        raise RunError(
            f"run {stage.run!r} holds {rows} rows made with job.samples_per_prompt 1 (no "
            f"seed); this config asks {stage.samples_per_prompt} samples per prompt, which "
            f"are seeded rows under other settings. Generate the samples in a new "
            f"job.run_name (its sample 0 is drawn afresh), or keep samples_per_prompt 1 here.")


def check_settings(index: RunIndex, settings_hash: str, budget: int, run: str,
                   legacy_hash: Optional[str] = None) -> None:
    """Refuse to mix budgets or output settings inside one run (the story's bug)."""
    others = {k: n for k, n in index.first_budgets.items() if k != (settings_hash, budget)}
    if not others:
        return
    (other_hash, other_budget), rows = max(others.items(), key=lambda kv: kv[1])
    if legacy_hash is not None and other_hash == legacy_hash:
        # Decided: refuse. The old hash covered model + sampling only, so nothing proves
        # those rows used this chat template, reasoning parser, think token, engine args
        # and context policy; mixing them silently is what the hash exists to prevent.
        raise RunError(
            f"run {run!r} holds {rows} rows from an older raygen whose settings_hash "
            f"({other_hash}) covered only model + sampling; this config matches those but "
            f"the rows do not record their chat template, reasoning parser, think token, "
            f"engine args or context policy, so resuming could mix outputs. Finish the run "
            f"with the raygen version that started it, or start a new job.run_name.")
    raise RunError(
        f"run {run!r} already holds {rows} rows generated with max_new_tokens="
        f"{other_budget} (settings {other_hash}); this config asks max_new_tokens={budget} "
        f"(settings {settings_hash}). Resuming would mix budgets and leave the earlier rows "
        f"under the old one. To give truncated rows a larger budget run "
        f"`python -m jobs.generate --config ... --continue-truncated --max-total-tokens "
        f"{budget}`; for different settings use a new job.run_name.")


def guard_rejects(cfg: RunConfig, store: RunStore, admission: Admission, tally: RejectTally,
                  reject_parts: list[list[dict[str, Any]]]) -> None:
    """Stop before deploying when job.max_reject_fraction is exceeded: the rejects are
    written first (the operator reads why in rejects/), progress.json says failed."""
    if tally.total < admission.rejects:  # the rest were written by earlier sessions
        tally.add_known(store)
    problem = reject_problem(admission, cfg.job.max_reject_fraction, tally)
    if problem is None:
        return
    write = reject_writer(store)
    for part in reject_parts:
        write(part)
    ProgressTracker(store, admission.total, cfg.job.run_name, cfg.engine.model_name,
                    cfg.job.progress_interval_s).stop("failed")  # one scan, no thread
    raise RunError(problem)


def admit(cfg: RunConfig, store: RunStore, inputs: list[Location], index: RunIndex,
          retry_failed: bool, write_rejects: Callable, samples: int = 1) -> Admission:
    """The driver's admission pass (jobs/pipeline/admission.py); records the input fingerprints
    in <run>/inputs.json and says what changed since the last session."""
    started = time.monotonic()
    limit, max_line_bytes = cfg.job.limit, cfg.job.max_line_bytes
    recorded = admission_cache.load(store, inputs, limit, max_line_bytes, index)
    found: list[list[dict[str, Any]]] = []  # rejects, passed on once the pass holds
    try:
        admission = admit_inputs(inputs, index, retry_failed, found.append, limit,
                                 max_line_bytes, keep_keys=True, recorded=recorded,
                                 samples=samples)
    except PrefixChanged as exc:
        logger.warning("%s: running the whole admission pass", exc)
        found, recorded = [], None
        admission = admit_inputs(inputs, index, retry_failed, found.append, limit,
                                 max_line_bytes, keep_keys=True, samples=samples)
    for part in found:
        write_rejects(part)
    for line in describe_changes(admission, input_fingerprints.recorded(store)):
        logger.warning("%s", line)
    input_fingerprints.record(store, admission.fingerprints)
    admission_cache.save(store, inputs, limit, max_line_bytes, admission)
    admission.input_keys = admission.reject_ids = None  # recorded: not held all session
    reused = ("" if recorded is None else
              f" (the recorded pass reused: {recorded.reads.count('same')} input files "
              f"unread, {admission.lines_read} new lines parsed)")
    logger.info("admission%s: %d input rows, %d distinct valid keys, %d to generate, %d "
                "rejects (%d new), table %d bytes, %.1f s", reused, admission.total,
                admission.valid_keys, len(admission.table), admission.rejects,
                admission.new_rejects, admission.table.nbytes, time.monotonic() - started)
    return admission


def dry_run(cfg: RunConfig, mode: RunMode) -> tuple[dict[str, Any], str]:
    """Validate config and input and say what a fresh or retry-failed session would
    send: no Ray, no lease, no writes. Returns (counts, text); RunError when the run
    would refuse."""
    store = RunStore.for_run(cfg.job.output, cfg.job.run_name, cfg.storage)
    inputs = input_locations(cfg)
    index = RunIndex.open(store)
    stage = StageSettings.of(cfg, mode)
    check_samples(index, stage)
    check_settings(index, stage.settings_hash, stage.max_new_tokens, stage.run,
                   stage.legacy_settings_hash)
    tally = RejectTally()
    retry_failed = mode.retry_failed
    admission = admit_inputs(inputs, index, retry_failed, tally.add, cfg.job.limit,
                             cfg.job.max_line_bytes, samples=stage.samples_per_prompt)
    if tally.total < admission.rejects:
        tally.add_known(store)
    text = plan_text(cfg, store, admission, tally, len(index.done),
                     len(index.open_failed()), retry_failed)
    problem = reject_problem(admission, cfg.job.max_reject_fraction, tally, dry_run=True)
    if problem:
        raise RunError(f"{problem}\n{text}")
    return {"total": admission.total, "rejected": admission.rejects,
            "to_generate": len(admission.table)}, text
