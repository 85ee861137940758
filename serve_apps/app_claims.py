"""Which live runs use which Serve app, so that one run never redeploys another's engines.

A run's job claims its app (name + the engine config hash it would deploy) before it
deploys or attaches. Runs with the same engine share the app; a run whose engine
differs from a live claimant's is refused, naming that run, and deploys nothing. A claim
lives while its job renews it (a thread, every ttl/3) and expires ``ttl_s`` after the
last renewal (the job passes ``job.lease_timeout_s``: a killed driver frees the app as
it frees its run's lease). The registry is one detached actor per cluster (namespace
``raygen``), so every job of the cluster sees the same claims, whoever started it.

What it cannot stop: a deploy outside raygen (``serve deploy``, a RayService update).
The replicas' engine hash on every result catches those (jobs/pipeline/generate_stage.py).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Optional

import ray

logger = logging.getLogger("raygen")

NAMESPACE = "raygen"
ACTOR_NAME = "raygen-app-claims"


class AppInUse(RuntimeError):
    """Another live run uses this Serve app with other engine settings."""


@ray.remote(num_cpus=0, max_restarts=-1)
class _AppClaims:
    """app -> {run: {engine_hash, expires (this actor's monotonic clock), job}}."""

    def __init__(self) -> None:
        self.claims: dict[str, dict[str, dict]] = {}

    def _live(self, app: str) -> dict[str, dict]:
        now, users = time.monotonic(), self.claims.setdefault(app, {})
        for run in [r for r, c in users.items() if c["expires"] <= now]:
            del users[run]
        return users

    def claim(self, app: str, run: str, engine_hash: str, ttl_s: float,
              job: str) -> list[dict]:
        """Claim ``app`` for ``run``; the live claims that refuse it (empty: claimed)."""
        users = self._live(app)
        others = [dict(c, run=r, expires_in_s=round(c["expires"] - time.monotonic(), 1))
                  for r, c in users.items() if r != run and c["engine_hash"] != engine_hash]
        if not others:
            users[run] = {"engine_hash": engine_hash, "expires": time.monotonic() + ttl_s,
                          "job": job}
        return others

    def renew(self, app: str, run: str, ttl_s: float) -> bool:
        claim = self._live(app).get(run)
        if claim is None:
            return False
        claim["expires"] = time.monotonic() + ttl_s
        return True

    def release(self, app: str, run: str) -> None:
        self._live(app).pop(run, None)

    def users(self, app: str) -> dict[str, dict]:
        return {r: dict(c) for r, c in self._live(app).items()}


def registry():
    """The cluster's claims actor (started by the first job that asks)."""
    return _AppClaims.options(name=ACTOR_NAME, namespace=NAMESPACE, lifetime="detached",
                              get_if_exists=True).remote()


def _job_label() -> str:
    try:
        return ray.get_runtime_context().get_job_id() or ""
    except Exception:  # noqa: BLE001 - a label for messages only
        return ""


@dataclass
class AppClaim:
    """A held claim; :meth:`release` (or leaving the ``with`` block) gives it back."""

    app: str
    run: str
    ttl_s: float
    _actor: object = None
    _stop: Optional[threading.Event] = None

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                if not ray.get(self._actor.renew.remote(self.app, self.run, self.ttl_s),
                               timeout=self.ttl_s / 3):
                    logger.error("claim of Serve app %r by run %s expired: another run may "
                                 "redeploy it (every row's engine hash is still checked)",
                                 self.app, self.run)
            except Exception as exc:  # noqa: BLE001 - retried at the next tick
                logger.warning("claim of Serve app %r not renewed: %s", self.app, exc)

    def release(self) -> None:
        if self._stop is not None:
            self._stop.set()
        try:
            ray.get(self._actor.release.remote(self.app, self.run), timeout=10)
        except Exception as exc:  # noqa: BLE001 - it expires after ttl_s anyway
            logger.warning("claim of Serve app %r not released (%s): it expires in %.0f s",
                           self.app, exc, self.ttl_s)

    def __enter__(self) -> "AppClaim":
        return self

    def __exit__(self, *_) -> None:
        self.release()


def claim_app(app: str, run: str, engine_hash: str, ttl_s: float) -> AppClaim:
    """Claim ``app`` for ``run`` or raise AppInUse naming the live runs that refuse it."""
    actor = registry()
    others = ray.get(actor.claim.remote(app, run, engine_hash, ttl_s, _job_label()))
    if others:
        named = "; ".join(f"run {o['run']} (Ray job {o['job'] or '?'}, engine "
                          f"{o['engine_hash']}; its claim expires in {o['expires_in_s']} s unless "
                          f"its job renews it)" for o in others)
        raise AppInUse(
            f"Serve app {app!r} is in use by another live run with other engine settings: "
            f"{named}. This run's engine ({engine_hash}) would replace its replicas and mix "
            f"its data. Set serve.app_name to a name of this run's own (e.g. "
            f"--set serve.app_name={app}-2), or wait for that run to end; nothing was "
            f"deployed or written.")
    claim = AppClaim(app, run, ttl_s, actor, threading.Event())
    threading.Thread(target=claim._renew_loop, daemon=True, name="app-claim").start()
    return claim
