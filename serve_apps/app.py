"""Build, deploy or attach to the engine Serve application from config."""

from __future__ import annotations

import logging
import os
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from contract.config import EngineConfig, ServeConfig, load_engine_sections
from serve_apps.engine_deployment import EngineDeployment
from serve_apps.engine_hash import deployed_engine_hash, with_local_paths  # noqa: F401 - re-exported
from serve_apps.engines import default_gpus

logger = logging.getLogger("raygen")


def deployment_options(engine: EngineConfig, cfg: ServeConfig) -> dict[str, Any]:
    gpus = cfg.num_gpus_per_replica
    if gpus is None:
        gpus = default_gpus(engine)
    scaling = cfg.autoscaling
    return {
        "name": cfg.deployment_name,
        "max_ongoing_requests": cfg.max_ongoing_requests,
        "autoscaling_config": {
            "min_replicas": scaling.min_replicas,
            "initial_replicas": max(scaling.min_replicas, 1),
            "max_replicas": scaling.max_replicas,
            "target_ongoing_requests": scaling.target_ongoing_requests,
            "upscale_delay_s": scaling.upscale_delay_s,
            "downscale_delay_s": scaling.downscale_delay_s,
        },
        "ray_actor_options": {"num_cpus": cfg.num_cpus_per_replica, "num_gpus": gpus},
        "health_check_period_s": cfg.health_check_period_s,
        "health_check_timeout_s": cfg.health_check_timeout_s,
        "graceful_shutdown_timeout_s": cfg.graceful_shutdown_timeout_s,
        # One access-log line per row drowns the engine's own log at 900K rows.
        "logging_config": {"enable_access_log": False},
    }


def build_app(engine: EngineConfig, cfg: ServeConfig) -> serve.Application:
    options = deployment_options(engine, cfg)
    return EngineDeployment.options(**options).bind(engine.model_dump(mode="json"))


def _running_handle(cfg: ServeConfig) -> DeploymentHandle | None:
    status = serve.status().applications.get(cfg.app_name)
    if status is None or status.status != "RUNNING":
        return None
    return serve.get_app_handle(cfg.app_name)


def deploy_or_attach(engine: EngineConfig, cfg: ServeConfig) -> DeploymentHandle:
    """Attach to a running app with the same engine, else (re)deploy it and wait."""
    engine = with_local_paths(engine)
    serve.start(proxy_location="Disabled")
    if cfg.reuse_running_app:
        handle = _running_handle(cfg)
        if handle is not None:
            info = handle.info.remote().result()
            if info["engine_config_hash"] == engine.config_hash():
                logger.info("attached to running Serve app %r (%s)", cfg.app_name, info["model"])
                return handle
            logger.warning("running app %r has other engine settings (%s); redeploying with "
                           "this config's", cfg.app_name, info["model"])
    logger.info("deploying Serve app %r (%s engine, %s)", cfg.app_name, engine.kind,
                engine.model_name)
    return serve.run(build_app(engine, cfg), name=cfg.app_name, route_prefix=None)


def build_app_from_env(args: dict[str, Any]) -> serve.Application:
    """Serve application builder for RayService / `serve run`: a raygen run config.

    ``args["config"]`` (or env ``RAYGEN_CONFIG``) names the YAML; its engine and serve
    sections define the app, exactly as `python -m jobs.generate` would deploy it (the
    job's own sections are checked when the job runs).
    """
    path = args.get("config") or os.environ.get("RAYGEN_CONFIG")
    if not path:
        raise ValueError("build_app_from_env needs args.config or env RAYGEN_CONFIG")
    sections = load_engine_sections(path)
    return build_app(with_local_paths(sections.engine), sections.serve)
