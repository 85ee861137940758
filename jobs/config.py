"""One validated YAML schema for a run: engine, serve, job, storage.

``load_config(path, overrides)`` reads YAML with ``yaml.safe_load`` (yes/no/on/off kept
as words, so ``engine.extra_args`` can refuse them: contract.config.load_yaml), applies
``--set dotted.key=value`` overrides (values parsed as YAML), and validates. Unknown
keys and bad values raise ConfigError naming the dotted key. Cross-field checks
refuse, before any GPU time is spent, a context length that cannot hold prompt +
budget and a Serve queue too short to fill the engine's batch. The engine and serve
sections are defined in contract/config.py (serve_apps reads them from there too).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (AfterValidator, Discriminator, Field, Tag, ValidationError,
                      field_validator, model_validator)

from contract.config import (ConfigError, EngineConfig, ServeConfig, StrictModel,
                             default_engine, format_errors, load_yaml, read_config_tree,
                             gpu_pinning_problem, thinking_budget_problem)

RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
SETTING_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# raygen's own keys of a setting: recorded and hashed with the sampling, never sent as
# SGLang sampling params (serve_apps/engine_client.py moves or drops them).
THINKING = "thinking"


class SamplingConfig(StrictModel):
    """SGLang sampling params. Only known keys: SGLang >= 0.5.22 rejects unknown ones.
    ``job.sampling`` is one such mapping (every row's setting), or a list of them, each
    with a ``name`` and a ``weight`` (a sampling mix: each row's setting drawn from its
    identity and the run's salt, recorded in its ``setting`` column)."""

    temperature: float = Field(0.6, ge=0, description="Qwen3 thinking-mode default.")
    top_p: float = Field(0.95, gt=0, le=1)
    top_k: int = Field(20, description="-1 = off.")
    min_p: float = Field(0.0, ge=0, le=1)
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    repetition_penalty: Optional[float] = None
    stop: list[str] = Field(default_factory=list, description="Extra stop strings.")
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False
    max_thinking_tokens: Optional[int] = Field(
        None, ge=0, description="Thinking budget per row (SGLang's max_thinking_tokens, a "
        "request field): after this many reasoning tokens SGLang forces the think end and "
        "the row goes on with its answer. None = not sent. Needs engine.kind sglang with a "
        "reasoning_parser and extra_args enable-strict-thinking: true (or the simulator "
        "with engine.simulator.enable_strict_thinking).")
    thinking: bool = Field(
        True, description="false: the prompt is rendered with thinking off (the builtin "
        "template's empty think block, a model template's enable_thinking=False); the "
        "whole output is the answer (reasoning empty, finished_thinking true, no "
        "missing_think_end flag). Not an SGLang param: recorded in the row's sampling.")

    @model_validator(mode="after")
    def _budget_needs_thinking(self) -> "SamplingConfig":
        if not self.thinking and self.max_thinking_tokens is not None:
            raise ValueError("max_thinking_tokens with thinking: false: a row that does not "
                             "think has no thinking to budget; drop one of them")
        return self

    def to_sglang(self) -> dict[str, Any]:
        """The params raygen sends (unset ones left out, so they never enter the
        settings hash; ``thinking`` only when false, so a thinking run's hash is what it
        was); the client moves max_thinking_tokens to the request's top level and drops
        ``thinking`` (serve_apps/engine_client.py)."""
        out = {k: v for k, v in self.model_dump(exclude=MIX_KEYS).items()
               if v not in (None, [])}
        if out.get(THINKING) is True:
            del out[THINKING]
        return out


class SamplingSetting(SamplingConfig):
    """One setting of a sampling mix (``job.sampling`` as a list): SamplingConfig's keys
    plus its name and weight."""

    name: str = Field(description="The setting's name: each row's `setting` column, the "
                      "report's and the export's split. Letters, digits, '.', '_', '-'.")
    weight: float = Field(1.0, gt=0, description="Relative share of rows drawn with this "
                          "setting (weights need not sum to 1).")

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        if not SETTING_NAME.fullmatch(value):
            raise ValueError("use 1-64 letters, digits, '.', '_' or '-'")
        return value


MIX_KEYS = frozenset({"name", "weight"})


def _one_mix(settings: list[SamplingSetting]) -> list[SamplingSetting]:
    if not settings:
        raise ValueError("an empty list: give one setting (a mapping) or a list of named, "
                         "weighted settings")
    names = [s.name for s in settings]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"setting names must be unique: {', '.join(twice)} repeated")
    return settings


def _sampling_form(value: Any) -> str:
    return "mix" if isinstance(value, (list, tuple)) else "setting"


# Tags "setting" and "mix": contract.config.UNION_TAGS leaves them out of error keys.
SamplingMix = Annotated[list[SamplingSetting], AfterValidator(_one_mix)]
Sampling = Annotated[
    Union[Annotated[SamplingConfig, Tag("setting")], Annotated[SamplingMix, Tag("mix")]],
    Discriminator(_sampling_form)]


# Most top alternatives stored per output token: OpenAI's and vLLM's default limit (SGLang's
# native API has none below the vocabulary); each one costs ~8 bytes per token stored.
MAX_TOP_LOGPROBS = 20


class LogprobsConfig(StrictModel):
    """``job.logprobs``: store per output token the sampled token's logprob and the top
    ``top_k`` alternatives (docs/logprobs.md)."""

    top_k: int = Field(
        0, ge=0, le=MAX_TOP_LOGPROBS, strict=True, description="Top alternatives stored per "
        "output token (ids and logprobs, sorted by logprob; SGLang's top_logprobs_num); 0 = "
        "only the sampled token's logprob.")


class RetryConfig(StrictModel):
    max_attempts: int = Field(4, ge=1, description="Tries per row for transient errors.")
    backoff_initial_s: float = Field(1.0, ge=0, description="First retry delay; doubles.")
    backoff_max_s: float = Field(60.0, ge=0, description="Cap on one retry delay.")


class BreakerConfig(StrictModel):
    window_rows: int = Field(200, ge=1, description="Last N finished rows per actor judged.")
    min_rows: int = Field(50, ge=1, description="No verdict before this many rows.")
    max_failure_fraction: float = Field(
        0.5, gt=0, le=1, description="Engine-class failures above this fraction of the window "
        "stop the job: the fleet is down, do not turn the dataset into failures.")
    max_same_error_fraction: float = Field(
        0.8, gt=0, le=1, description="One non-transient error class (e.g. a 400 for an unknown "
        "sampling key, a 404 for a wrong endpoint, a replica bug) above this fraction of the "
        "window stops the job as failed: the run is misconfigured.")
    max_flagged_fraction: Optional[float] = Field(
        0.5, gt=0, le=1, description="Data rows with integrity flags (contract/integrity.py) "
        "above this fraction of the window on each of at least two replicas, a majority of "
        "those in the window, stop the job as failed: outputs broken on every engine are the "
        "run's settings (a drain, which fixes one engine, would restart them all over and "
        "over). Not judged in regenerate and continue sessions (rows chosen by their earlier "
        "output). None = never.")

    @model_validator(mode="after")
    def _window_holds_min_rows(self) -> "BreakerConfig":
        if self.min_rows > self.window_rows:
            raise ValueError(f"min_rows ({self.min_rows}) > window_rows ({self.window_rows}): "
                             f"the breaker could never trip")
        return self


class JobConfig(StrictModel):
    """The Ray Data job: inputs, the run prefix, budget, sampling, concurrency, retries."""

    input: list[str] = Field(description="Prompt files: JSONL or Parquet, local or s3://.")
    output: str = Field(description="Run prefix parent: local dir or s3://bucket/prefix.")
    run_name: str = Field(description="Run folder under output; rerun the same to resume.")
    max_new_tokens: int = Field(8192, ge=1, description="Output budget per prompt.")
    context_policy: Literal["clamp", "reject"] = Field(
        "reject", description="When prompt + budget exceed the context: clamp the budget "
        "(recorded per row) or reject the row into failures/ (error_class context_overflow; "
        "--retry-failed sends it again after a context or policy change).")
    sampling: Sampling = Field(
        default_factory=SamplingConfig, description="One sampling setting (a mapping: "
        "every row's), or a sampling mix: a list of settings, each with a name and a "
        "weight, e.g. [{name: think, weight: 3}, {name: direct, weight: 1, thinking: false}]. "
        "Each row (each sample, with samples_per_prompt > 1) gets one setting, drawn from "
        "its identity and the run's salt (the same on every session), named in its "
        "`setting` column; the mix as a whole is in settings_hash, so a resume with "
        "another mix is refused. docs/modes.md 'Sampling mixes'.")
    samples_per_prompt: int = Field(
        1, ge=1, le=1024, description="Samples generated per prompt: each is its own row "
        "(key, sample 0..n-1) with its own seed (sent as sampling_seed, recorded per row), "
        "resumed, continued and exported on its own. 1 = one row per prompt, no seed sent. "
        "Raising it on a run adds the missing samples; a run started with 1 cannot change.")
    regenerate: Literal["last_turn", "every_turn"] = Field(
        "last_turn", description="last_turn: one reply per prompt, after its messages as "
        "given. every_turn: every assistant turn of a conversation generated again, turn k "
        "on the model's own turns 1..k-1 (tool results kept from the source), in rounds "
        "(one turn of every conversation per round, each written as the row's next version); "
        "a turn cut at the budget, or whose tool calls differ from the source's, ends its "
        "conversation there (turn_stop). docs/modes.md 'Every-turn regeneration'.")
    logprobs: Optional[LogprobsConfig] = Field(
        None, description="Opt-in: per output token the sampled token's logprob "
        "(`output_logprobs`) and, with top_k N > 0, the top N ids and logprobs "
        "(`output_top_logprob_ids`, `output_top_logprobs`), kept one per output token across "
        "continuations. In settings_hash (a run cannot switch it on or off mid-run); null "
        "(the default) = none asked, those columns null. Sizes per token: docs/logprobs.md.")
    limit: Optional[int] = Field(None, ge=1, description="Only the first N rows of each "
                                 "input file.")
    max_line_bytes: int = Field(
        16 << 20, ge=1024, description="Longest input line (JSONL) or row (Parquet, as JSON) "
        "read, in bytes; a longer one is a reject naming its size (and is never held in "
        "memory whole).")
    min_actors: int = Field(1, ge=1, description="Generation actors (async, autoscaled).")
    max_actors: int = Field(2, ge=1)
    inflight: Literal["fixed", "adaptive"] = Field(
        "fixed", description="fixed: always inflight_rows_per_actor. adaptive "
        "(experimental, opt-in: it has not yet met its throughput targets, BENCHMARKS.md "
        "'Rows in flight that follow the engines' KV pool'): each actor's rows in flight "
        "follow the engines' load, reported with every result (running, queued, token "
        "usage, retractions): grown while they have room and a short queue, cut when an "
        "engine retracts or its KV pool is near full with a queue past its target, within "
        "[1, inflight_rows_per_actor] (jobs/pipeline/inflight.py).")
    inflight_rows_per_actor: int = Field(
        128, ge=1, description="Requests each actor keeps in flight (job.inflight fixed), or "
        "the most it may keep (adaptive); total should exceed replicas x "
        "engine.max_running_requests so every engine can be saturated.")
    rows_per_call: int = Field(
        16, ge=1, description="Most rows one Serve call carries (rows ready together share a "
        "call; each still holds its own in-flight slot). Serve counts a call as one ongoing "
        "request. 1 = a call per row.")
    call_linger_s: float = Field(
        0.2, ge=0, description="Longest a call waits for more rows/free slots to fill up to "
        "rows_per_call (fewer calls, less CPU; delays an engine refill by at most this).")
    batch_size: int = Field(64, ge=1, description="Rows per Ray Data block/batch into an actor.")
    max_batches_per_actor: int = Field(
        8, ge=1, description="Concurrent batches per actor (Ray Data max_concurrency).")
    rows_per_file: int = Field(256, ge=1, description="Approximate rows per output file.")
    max_reject_fraction: float = Field(
        0.05, ge=0, le=1, description="Stop before any engine is deployed when more than "
        "this share of the input rows are rejected (invalid or duplicate ids; listed in "
        "rejects/). 1.0 disables the check.")
    retries: RetryConfig = Field(default_factory=RetryConfig)
    breaker: BreakerConfig = Field(default_factory=BreakerConfig)
    progress_interval_s: float = Field(5.0, gt=0)
    stall_factor: float = Field(
        5.0, gt=1, description="The watchdog ends a session as `stalled` (exit 1, lease "
        "released) when no part becomes durable for max(stall_min_s, stall_factor x the "
        "longest gap between durable parts so far); before the session's first part, for "
        "engine.request_timeout_s + stall_min_s.")
    stall_min_s: float = Field(
        300.0, gt=0, description="The watchdog's shortest limit (see stall_factor).")
    lease_timeout_s: float = Field(
        600.0, gt=0, description="One job per run: the driver renews <run>/lease.json every "
        "third of this (at most every 60 s); a lease not renewed for this long (driver "
        "killed on another host, node lost) is taken over by the next job on the run (a "
        "driver killed on the same host at once). A driver that cannot renew for 3/4 of it "
        "(a store outage) stops writing; shorter outages are ridden out.")
    metrics_linger_s: float = Field(
        10.0, ge=0, description="Seconds the driver stays up after the run so Prometheus "
        "scrapes the final gauges (job_running=0) before they disappear.")
    truncation_alert_ratio: float = Field(
        0.10, gt=0, le=1, description="RaygenTruncationHigh (warning) fires when more than "
        "this share of the run's written completions hit max_new_tokens; exported per run "
        "as ray_raygen_job_truncation_threshold_ratio.")
    price_per_gpu_hour: Optional[float] = Field(
        None, ge=0, description="What one GPU-hour costs you (any currency; printed as is): "
        "adds a cost line to the session summary, progress.json (gpu_hours.cost_spent, "
        "cost_forecast_rows_left) and the report. A replica without a GPU (CPU engine, "
        "simulator) counts as one engine-hour at this price. None = no cost line. Not part "
        "of settings_hash: change it on any session.")
    metrics_category_limit: int = Field(
        20, ge=1, description="Distinct `category` label values per generate actor in the "
        "metrics; later categories are reported as `other` (bounds series count).")

    @field_validator("input", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @property
    def settings(self) -> list[SamplingConfig]:
        """Every sampling setting rows can get: the one, or the mix's."""
        return list(self.sampling) if isinstance(self.sampling, list) else [self.sampling]

    @property
    def main_sampling(self) -> SamplingConfig:
        """The setting most rows get (the mix's heaviest, the first of equals): what a
        tool that sends one setting (jobs.tune, bench/) uses."""
        return max(self.settings, key=lambda s: getattr(s, "weight", 1.0))

    @field_validator("run_name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        if not RUN_NAME.fullmatch(value):
            raise ValueError("use letters, digits, '.', '_' or '-' (it becomes a folder name)")
        return value


class StorageConfig(StrictModel):
    """Where s3:// URIs go. Credentials: the AWS environment/credential chain only."""

    endpoint_url: Optional[str] = Field(
        None, description="S3-compatible endpoint (MinIO, moto); None = AWS. Credentials come "
        "from the AWS environment/credential chain, never from this file.")
    region: str = Field("us-east-1")
    s3_retry_max_attempts: int = Field(
        12, ge=1, description="The S3 client's own tries per request (connection errors, "
        "5xx, throttling); its backoff doubles from 25 ms, so 12 ride out ~100 s.")
    s3_retry_window_s: float = Field(
        300.0, gt=0, description="raygen tries a store call again (after the client's own "
        "tries) while its transient errors (throttling, 5xx, connection lost, the SDK's "
        "INTERNAL_FAILURE on a throttled small read) last no longer than this, with "
        "doubling delays up to 10 s: a store outage of a few minutes is ridden out.")
    shared_local_output: bool = Field(
        False, description="Set true when a local job.output path is a filesystem every "
        "node mounts (NFS, Lustre); on a multi-node cluster a local path is refused "
        "otherwise, since each node would write its own copy of the run.")


def rows_per_replica(rows_in_flight: int, replicas: int) -> int:
    """Each replica's share of the rows in flight: what Serve must admit (replicas >= 1)."""
    return -(-rows_in_flight // max(1, replicas))


class RunConfig(StrictModel):
    engine: EngineConfig = Field(default_factory=default_engine)
    serve: ServeConfig = Field(default_factory=ServeConfig)
    job: JobConfig
    storage: StorageConfig = Field(default_factory=StorageConfig)

    @model_validator(mode="after")
    def _fits(self) -> "RunConfig":
        if self.engine.context_length <= self.job.max_new_tokens:
            raise ValueError(
                f"engine.context_length ({self.engine.context_length}) cannot hold any prompt "
                f"plus job.max_new_tokens ({self.job.max_new_tokens}); set context_length to "
                f"the longest prompt + the budget")
        problem = gpu_pinning_problem(self.engine, self.serve)
        if problem:
            raise ValueError(problem)
        running = self.engine.planned_max_running_requests  # what SGLang resolves
        if self.serve.max_ongoing_requests < running:
            raise ValueError(
                f"serve.max_ongoing_requests ({self.serve.max_ongoing_requests}) < "
                f"engine.max_running_requests ({running}): the "
                f"engine could never fill its batch")
        share = rows_per_replica(self.job.max_actors * self.job.inflight_rows_per_actor,
                                 self.serve.autoscaling.min_replicas)
        if self.serve.max_ongoing_requests < share:
            # Below the share, replicas sit at their limit and every handle's router keeps
            # retrying rejected requests and re-probing queue lengths: measured 5 ms of
            # extra CPU per row (BENCHMARKS.md). The engine's own queue bounds the work.
            raise ValueError(
                f"serve.max_ongoing_requests ({self.serve.max_ongoing_requests}) < the rows "
                f"the job keeps in flight per replica ({share} = job.max_actors "
                f"{self.job.max_actors} x job.inflight_rows_per_actor "
                f"{self.job.inflight_rows_per_actor} / serve.autoscaling.min_replicas "
                f"{self.serve.autoscaling.min_replicas}): Serve would keep rejecting rows; "
                f"set it to about twice that ({2 * share})")
        if self.job.min_actors > self.job.max_actors:
            raise ValueError(f"job.min_actors ({self.job.min_actors}) > job.max_actors "
                             f"({self.job.max_actors})")
        greedy = [_key(s) for s in self.job.settings if s.temperature == 0]
        if self.job.samples_per_prompt > 1 and greedy:
            raise ValueError(
                f"job.samples_per_prompt ({self.job.samples_per_prompt}) > 1 with "
                f"{greedy[0]}.temperature 0: greedy decoding gives every sample the same "
                f"output; set a temperature > 0 or samples_per_prompt 1")
        if self.job.regenerate == "every_turn" and self.job.samples_per_prompt > 1:
            raise ValueError(
                f"job.regenerate every_turn with job.samples_per_prompt "
                f"{self.job.samples_per_prompt}: each sample would need its own conversation "
                f"branch, which raygen does not build; use samples_per_prompt 1 (or "
                f"regenerate last_turn for n samples of the last reply)")
        budgeted = [_key(s) for s in self.job.settings if s.max_thinking_tokens is not None]
        if budgeted:
            problem = thinking_budget_problem(self.engine)
            if problem:
                raise ValueError(f"{budgeted[0]}.max_thinking_tokens: {problem}")
        return self


def _key(setting: SamplingConfig) -> str:
    """A setting's place in the config, for an error message."""
    name = getattr(setting, "name", None)
    return "job.sampling" if name is None else f"job.sampling[{name}]"


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    node = tree
    parts = dotted.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {dotted}: {part!r} is not a section")
        node = child
    node[parts[-1]] = value


def apply_overrides(tree: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. job.max_new_tokens=8192")
        _set_dotted(tree, key.strip(), load_yaml(raw) if raw else "")
    return tree


def parse_config(tree: dict[str, Any], source: str = "config") -> RunConfig:
    try:
        return RunConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(format_errors(exc, source)) from None


def load_config(path: str, overrides: Optional[list[str]] = None) -> RunConfig:
    tree = read_config_tree(path)
    return parse_config(apply_overrides(tree, overrides or []), source=path)
