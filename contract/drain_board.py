"""Drained replicas' records, published in the Ray cluster's internal KV.

A drained replica (serve_apps/output_watch.py) puts its record of condemned keys on every
result it returns from then on; the job writes it under the run. A replica drained while
no row of the run comes back through it (its canary drained it between rows, or Serve
stopped it with its rows still inside, which the job then retries elsewhere) would carry
its record to nobody, and rows it returned before the drain would stay the run's latest
rows. So the replica also publishes the record here at once, one entry per run:

    raygen/drains/<run>/<replica>   the record (JSON), as the results carry it

and the job, at the end of each session, writes every entry of its run under the run
(jobs/runs/regenerate.py ``collect_published``) before it decides what to regenerate,
then removes the entry. The same record either way: whichever path writes it, the bytes
are the same. Best effort on both sides: without Ray (a unit test, a CLI tool) nothing is
published and nothing read.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any, Optional

logger = logging.getLogger("raygen")
PREFIX = "raygen/drains/"


def _kv():
    try:
        import ray
        from ray.experimental import internal_kv
        if not ray.is_initialized() or not internal_kv._internal_kv_initialized():
            return None
        return internal_kv
    except Exception:  # noqa: BLE001 - no Ray here: nothing to publish to
        return None


def _name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text or "unknown")


def publish(run: str, record: dict[str, Any]) -> bool:
    """Publish a replica's record for ``run``; False when it could not be."""
    kv = _kv()
    if kv is None:
        return False
    try:
        kv._internal_kv_put(f"{PREFIX}{_name(run)}/{_name(record['replica'])}",
                            json.dumps(record, sort_keys=True), overwrite=True)
        return True
    except Exception as exc:  # noqa: BLE001 - the result-carried record still goes
        logger.warning("drain record of %s not published: %s", record.get("replica"), exc)
        return False


def published(run: str) -> list[tuple[str, dict[str, Any]]]:
    """(entry, record) of every record published for ``run``."""
    kv = _kv()
    if kv is None:
        return []
    found = []
    for key in kv._internal_kv_list(f"{PREFIX}{_name(run)}/"):
        key = key.decode() if isinstance(key, bytes) else key
        value: Optional[bytes] = kv._internal_kv_get(key)
        if value:
            found.append((key, json.loads(value)))
    return found


def remove(entry: str) -> None:
    kv = _kv()
    if kv is not None:
        kv._internal_kv_del(entry)
