"""The engine config hash a replica reports, as the job computes it: in a module of its
own, free of Serve's and FastAPI's imports, so the generate actors (jobs/pipeline) that
check every result against it do not load the deployment code (~0.35 s of CPU a worker,
one worker per actor per session)."""

from __future__ import annotations

import os

from contract.config import EngineConfig, SGLangEngineConfig


def with_local_paths(engine: EngineConfig) -> EngineConfig:
    """Model paths relative to this process's working directory made absolute, where
    they exist here: a replica runs in its raylet's working directory, which need not be
    the one the job was started in (e.g. ``.local/models/...`` in the demo)."""
    if not isinstance(engine, SGLangEngineConfig):
        return engine

    def absolute(path: str | None) -> str | None:
        if path and not os.path.isabs(path) and os.path.isdir(path):
            return os.path.abspath(path)
        return path
    spec = engine.speculative
    return engine.model_copy(update={
        "model_path": absolute(engine.model_path),
        "speculative": spec and spec.model_copy(
            update={"draft_model_path": absolute(spec.draft_model_path)})})


def deployed_engine_hash(engine: EngineConfig) -> str:
    """The engine config hash a replica deployed from ``engine`` by this process reports
    (``info()`` and every result): the config as deployed, local paths made absolute."""
    return with_local_paths(engine).config_hash()
