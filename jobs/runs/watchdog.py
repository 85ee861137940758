"""The session's watchdog: no hang outlives its cause.

A session that stops making durable progress (a stopped or deadlocked generate actor,
write task or replica) used to keep its driver alive, renewing the run's lease, so a
resubmit was refused until someone noticed. The watchdog ends it as ``stalled`` (exit 1,
lease released, progress.json says why) when no new part has become durable for

    max(job.stall_min_s, job.stall_factor x the longest gap between durable parts so far)

(before the first part of the session: the engine's request timeout + job.stall_min_s,
the longest a first row may legitimately take). The progress thread feeds it (it already
re-lists the run's parts every job.progress_interval_s); ``diagnose`` names the stuck
stage from what the replicas report (rows in flight, their last result) and from Ray's
own list of the job's running tasks (the stopped one is the oldest).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

logger = logging.getLogger("raygen")
INFO_TIMEOUT_S = 10.0   # a replica that cannot answer its info call in this long is stuck
INFO_CALLS = 8          # info calls spread over the replicas (Serve's router picks)
TASK_LIST_LIMIT = 1000  # pending tasks listed (the state API's default, 100, may miss the stuck one)


class Watchdog:
    def __init__(self, factor: float, min_s: float, first_part_s: float,
                 clock: Callable[[], float] = time.monotonic):
        self.factor, self.min_s, self.first_part_s, self.clock = factor, min_s, first_part_s, clock
        self.parts: Optional[int] = None
        self.last_progress = clock()
        self.longest_gap: Optional[float] = None  # between durable parts, this session
        self.fired = False

    def limit_s(self) -> float:
        if self.longest_gap is None:
            return self.first_part_s + self.min_s
        return max(self.min_s, self.factor * self.longest_gap)

    def observe(self, parts: int) -> Optional[tuple[float, float]]:
        """Record the run's durable part count; (silent s, limit s) once it is overdue
        (only the first time)."""
        now = self.clock()
        if self.parts is None:
            self.parts = parts
        elif parts > self.parts:
            gap = now - self.last_progress
            self.longest_gap = gap if self.longest_gap is None else max(self.longest_gap, gap)
            self.parts, self.last_progress = parts, now
        silent = now - self.last_progress
        if not self.fired and silent > self.limit_s():
            self.fired = True
            return silent, self.limit_s()
        return None


def oldest_tasks(limit: int = 3) -> str:
    """This job's longest-running Ray tasks (Ray's state API): a stopped or deadlocked
    process's task stays RUNNING while the others finish or wait on it."""
    import ray
    from ray.util.state import list_tasks
    job = ray.get_runtime_context().get_job_id()
    tasks = []
    try:
        # Every task not yet ended (GCS filters them): a stopped worker never acknowledges
        # the tasks handed to it, and never reports the one it was running, so their
        # last reported state may be any of the pending ones (SUBMITTED_TO_WORKER, an
        # actor task's PENDING_ACTOR_TASK_*, RUNNING); a test once saw none of the two
        # it used to ask for.
        tasks += list_tasks(filters=[("job_id", "=", job), ("state", "!=", "FINISHED"),
                                     ("state", "!=", "FAILED")],
                            detail=True, raise_on_missing_output=False,
                            limit=TASK_LIST_LIMIT, timeout=INFO_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - no dashboard: say so, keep the rest
        return f"(Ray's task list is not available: {type(exc).__name__})"
    now_ms = time.time() * 1000
    since = {id(t): t.start_time_ms or t.creation_time_ms for t in tasks}
    waiting = sorted((t for t in tasks if since[id(t)]), key=lambda t: since[id(t)])
    if not waiting:
        return "no task of this job is running"
    return "the longest-waiting tasks: " + "; ".join(
        f"{t.name} ({t.state.lower()}, pid {t.worker_pid or '?'}, for "
        f"{(now_ms - since[id(t)]) / 1000:.0f} s)" for t in waiting[:limit])


def diagnose(app_name: str, deployment_name: str, limit_s: float,
             now: Optional[float] = None) -> str:
    """Which stage is stuck: the replicas' own report (EngineReplica.info) and the job's
    longest-running Ray tasks."""
    return f"{replica_picture(app_name, deployment_name, limit_s, now)}; {oldest_tasks()}"


def replica_picture(app_name: str, deployment_name: str, limit_s: float,
                    now: Optional[float] = None) -> str:
    from ray import serve
    now = time.time() if now is None else now
    try:
        handle = serve.get_deployment_handle(deployment_name, app_name=app_name)
        replies = [handle.info.remote() for _ in range(INFO_CALLS)]
    except Exception as exc:  # noqa: BLE001 - a diagnosis, never a second failure
        return f"the Serve app {app_name!r} cannot be reached ({type(exc).__name__}: {exc})"
    infos: dict[str, dict[str, Any]] = {}
    silent = 0
    for reply in replies:
        try:
            info = reply.result(timeout_s=INFO_TIMEOUT_S)
            infos[info["replica"]] = info
        except Exception:  # noqa: BLE001 - a stuck replica does not answer
            silent += 1
    return describe_stage(list(infos.values()), silent, limit_s, now)


def describe_stage(infos: list[dict[str, Any]], unanswered: int, limit_s: float,
                   now: float) -> str:
    """The stuck stage named from replica reports (a pure function, for the tests)."""
    if unanswered and not infos:
        return ("stuck stage: the engine replicas (none answered its info call within "
                f"{INFO_TIMEOUT_S:.0f} s: a stopped or deadlocked replica or engine)")
    stuck = [i for i in infos if i.get("inflight") and
             (i.get("last_result_at") is None or now - i["last_result_at"] > limit_s)]
    if stuck:
        names = ", ".join(f"{i['replica']} ({i['inflight']} rows in flight)" for i in stuck)
        return f"stuck stage: generate (replicas with rows in flight and no result for " \
               f"{limit_s:.0f} s: {names}: their engines are stopped or hung)"
    recent = [i for i in infos if i.get("last_result_at") and now - i["last_result_at"] <= limit_s]
    if recent:
        return ("stuck stage: write (the replicas keep finishing rows, but none became "
                "durable: a stopped write task, or the output storage does not answer)")
    extra = f"; {unanswered} info calls unanswered" if unanswered else ""
    return ("stuck stage: read/validate/admit or the generate actors (no row reaches the "
            f"replicas: they hold none in flight){extra}")
