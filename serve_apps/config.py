"""Typed config for the engine and its Serve deployment.

One pydantic model per deployable part; every field documents itself and carries
its unit in its name. Unknown keys are errors (``extra="forbid"``) so a typo in a
30-hour run's YAML fails at submit time, not as silently ignored tuning.
The engine kinds differ only in how the process is launched (see engines/).
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from serve_apps import context_budget
from serve_apps.engines.simulator.settings import SimulatorSettings


# model_path of a simulated engine: anything else is a real model and needs kind=sglang.
SIMULATOR_MODEL_PREFIX = "sim-"


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SpeculativeConfig(StrictModel):
    algorithm: Literal["NEXTN", "EAGLE", "EAGLE3"] = Field(
        "NEXTN", description="SGLang --speculative-algorithm (NEXTN = the model's own MTP head).")
    num_steps: int = Field(3, ge=1, description="--speculative-num-steps: draft steps per verify.")
    eagle_topk: int = Field(1, ge=1, description="--speculative-eagle-topk.")
    num_draft_tokens: int = Field(4, ge=1, description="--speculative-num-draft-tokens.")
    draft_model_path: Optional[str] = Field(
        None, description="--speculative-draft-model-path; required by EAGLE/EAGLE3, unused "
        "by NEXTN (the model's own MTP head).")

    @model_validator(mode="after")
    def _draft_model(self) -> "SpeculativeConfig":
        if self.algorithm != "NEXTN" and not self.draft_model_path:
            raise ValueError(f"algorithm {self.algorithm} needs draft_model_path")
        return self


# Pass-through flags: {"--flag-name" or "flag-name": value}; True -> bare flag, None/False -> omitted.
ExtraArgValue = Union[str, int, float, bool, None]


class EngineConfig(StrictModel):
    """The engine one replica supervises: which server, which model, its SGLang flags."""

    kind: Literal["sglang", "simulator"] = Field(
        "simulator", description="Which server process a replica supervises. The simulator "
        "accepts only model_path names starting with 'sim-'.")
    model_path: str = Field(
        "sim-qwen", description="HF id or local path of the model (SGLang --model-path).")
    served_model_name: Optional[str] = Field(
        None, description="Name recorded in output rows and metrics; defaults to model_path.")
    context_length: int = Field(
        16384, ge=256, description="Max prompt + output tokens per request (SGLang --context-length).")
    max_running_requests: int = Field(
        48, ge=1, description="Requests decoded at once per engine. Set it: with speculative "
        "decoding SGLang silently uses 48 otherwise.")
    mem_fraction_static: Optional[float] = Field(
        None, gt=0, lt=1, description="SGLang --mem-fraction-static (story's tuning: 0.93).")
    max_mamba_cache_size: Optional[int] = Field(
        None, ge=1, description="SGLang --max-mamba-cache-size for hybrid Mamba models (story: 200).")
    reasoning_parser: Optional[str] = Field(
        "qwen3", description="SGLang --reasoning-parser; None for non-thinking models.")
    tool_call_parser: Optional[str] = Field(None, description="SGLang --tool-call-parser.")
    speculative: Optional[SpeculativeConfig] = Field(
        None, description="Speculative decoding settings; None = off.")
    enable_metrics: bool = Field(True, description="SGLang --enable-metrics (needed for /metrics).")
    extra_args: dict[str, ExtraArgValue] = Field(
        default_factory=dict, description="Any other SGLang flag, passed through verbatim.")
    simulator: SimulatorSettings = Field(
        default_factory=SimulatorSettings, description="Simulated engine knobs (kind=simulator).")
    chat_template: Optional[Literal["builtin", "model"]] = Field(
        None, description="builtin: raygen's ChatML renderer with thinking on (Qwen3 "
        "family; what the simulator uses). model: the model tokenizer's own template via "
        "transformers on the replica (GPU nodes have it with SGLang). Unset: model for "
        "kind=sglang, builtin for the simulator.")
    think_end_token: str = Field(
        "</think>", description="Text that ends the reasoning part of a thinking model's output.")
    start_timeout_s: float = Field(
        1800.0, gt=0, description="How long a replica waits for the engine's /health at start "
        "(large models take minutes to load).")
    request_timeout_s: float = Field(
        3600.0, gt=0, description="HTTP timeout of one /generate call (an 8K-token thinking "
        "completion under load can take many minutes).")

    @model_validator(mode="before")
    @classmethod
    def _template_default(cls, data: Any) -> Any:
        # A real model's own template is the safe default; only the simulator's toy
        # tokenizer needs raygen's builtin ChatML.
        if isinstance(data, dict) and data.get("chat_template") is None:
            data = {**data, "chat_template": "model" if data.get("kind") == "sglang" else "builtin"}
        return data

    @model_validator(mode="after")
    def _simulator_model(self) -> "EngineConfig":
        # kind defaults to the simulator; a real model name under it would write simulated
        # text labelled as that model for a whole run.
        if self.kind == "simulator" and not self.model_path.startswith(SIMULATOR_MODEL_PREFIX):
            raise ValueError(
                f"engine.kind is simulator but engine.model_path {self.model_path!r} is not a "
                f"simulator model (names start with {SIMULATOR_MODEL_PREFIX!r}); set "
                f"engine.kind: sglang to run the real model")
        return self

    @model_validator(mode="after")
    def _mamba_slots(self) -> "EngineConfig":
        # SGLang 0.5.23 caps running requests at max_mamba_cache_size // 5 for hybrid
        # models, silently: the story's 80 slots gave 16 running requests.
        cache = self.max_mamba_cache_size
        if cache is not None and cache // 5 < self.max_running_requests:
            raise ValueError(
                f"max_mamba_cache_size ({cache}) caps running requests at {cache // 5} < "
                f"max_running_requests ({self.max_running_requests}); raise it to "
                f"{5 * self.max_running_requests} or lower max_running_requests")
        return self

    @property
    def reserved_tokens(self) -> int:
        """SGLang's speculative reserve per request (context_budget.reserved_tokens)."""
        spec = self.speculative
        if spec is None:
            return 0
        return context_budget.reserved_tokens(spec.algorithm, spec.num_steps, spec.eagle_topk,
                                              spec.num_draft_tokens)

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model_path

    def config_hash(self) -> str:
        """Identifies the engine settings: a running app with another hash is redeployed."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]


class AutoscalingConfig(StrictModel):
    min_replicas: int = Field(1, ge=0, description="Replicas kept even when idle.")
    max_replicas: int = Field(1, ge=1, description="Upper bound: one replica per GPU for SGLang.")
    target_ongoing_requests: float = Field(
        40.0, gt=0, description="Serve scales up when ongoing requests per replica exceed "
        "this. A job call carries up to job.rows_per_call rows and counts as one request.")
    upscale_delay_s: float = Field(30.0, ge=0, description="Serve autoscaling upscale delay.")
    downscale_delay_s: float = Field(600.0, ge=0, description="Serve autoscaling downscale delay.")

    @model_validator(mode="after")
    def _bounds(self) -> "AutoscalingConfig":
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) > max_replicas ({self.max_replicas})")
        return self


class ServeConfig(StrictModel):
    """The Serve application: replicas (one per GPU), autoscaling, health checks."""

    app_name: str = Field("raygen", description="Serve application name (one per model).")
    deployment_name: str = Field("engine", description="Serve deployment name.")
    autoscaling: AutoscalingConfig = Field(default_factory=AutoscalingConfig)
    max_ongoing_requests: int = Field(
        512, ge=1, description="Requests one replica accepts at once (admission only: the "
        "engine's own queue bounds the work). At least engine.max_running_requests, and at "
        "least the job's rows in flight per replica (checked); about twice that is best.")
    health_check_period_s: float = Field(10.0, gt=0, description="How often Serve asks a replica.")
    health_check_timeout_s: float = Field(30.0, gt=0, description="Serve health check timeout.")
    graceful_shutdown_timeout_s: float = Field(
        20.0, ge=0, description="Time in-flight requests get before a replica is stopped.")
    num_cpus_per_replica: float = Field(0.5, ge=0, description="CPUs reserved per replica actor.")
    num_gpus_per_replica: Optional[float] = Field(
        None, ge=0, description="GPUs per replica; default 1 for sglang, 0 for the simulator.")
    reuse_running_app: bool = Field(
        True, description="Attach to a running app of the same name instead of redeploying it.")
