"""What every generate actor is told: the run's mode and its frozen stage settings.

Both are built once by the driver (the mode from the CLI flags, the settings from the
config and the mode) and shipped to every actor; nothing downstream re-derives them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Optional

from jobs.config import BreakerConfig, RetryConfig, RunConfig
from jobs.io.samples import SEED_SCHEME
from jobs.pipeline.modes import Mode, Strategy, strategy
from jobs.pipeline.sampling_mix import Setting, hashed, settings_of
from serve_apps.engine_hash import deployed_engine_hash


def settings_hash(model: str, sampling: dict[str, Any], chat_format: str = "chatml-think",
                  output_settings: Optional[dict[str, Any]] = None) -> str:
    """Hash of everything that changes an output (see output_settings); rows with
    different hashes must never mix in one run. Without ``output_settings`` this is
    the older formula (model + sampling + chat format), kept to recognise old runs."""
    fields: dict[str, Any] = {"model": model, "sampling": sampling, "chat": chat_format}
    if output_settings is not None:
        fields["output"] = output_settings
    blob = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def output_settings(engine: Any, context_policy: str, samples_per_prompt: int = 1,
                    regenerate: str = "last_turn",
                    logprobs: Optional[int] = None) -> dict[str, Any]:
    """The settings besides sampling that change what a prompt's row holds: which model
    and name, how the prompt is rendered, how the output is split into reasoning and
    answer, the engine's own arguments, and what happens when the context is short.
    Not included: throughput settings (replicas, batch sizes, memory, speculative
    decoding, which verifies drafts against the model) and timeouts. With
    samples_per_prompt > 1 the rows are seeded (jobs/io/samples.py): the seed scheme is
    in, not the count (a sample's output does not depend on n, so raising n adds samples
    under the same hash); with 1 nothing is added, so no existing hash changes. So for
    job.regenerate: every_turn is in (its rows' prompts hold the model's own turns),
    last_turn adds nothing. job.logprobs (its top_k) is in when set: the rows hold
    columns a run without it leaves null; unset adds nothing, so a run made before it
    keeps its hash and resumes."""
    out = {"kind": engine.kind, "model_path": engine.model_path,
           "served_model_name": engine.model_name, "chat_template": engine.chat_template,
           "reasoning_parser": engine.reasoning_parser,
           "think_end_token": engine.think_end_token,
           "extra_args": dict(sorted((engine.extra_args or {}).items())),
           "context_policy": context_policy}
    if samples_per_prompt > 1:
        out["sample_seeds"] = SEED_SCHEME
    if regenerate != "last_turn":
        out["regenerate"] = regenerate
    if logprobs is not None:
        out["logprobs"] = {"top_k": logprobs}
    return out


# The modes by their old names (jobs/pipeline/modes.py has the enum and the strategies).
FRESH, RETRY_FAILED, CONTINUE, PILOT = Mode.FRESH, Mode.RETRY_FAILED, Mode.CONTINUE, Mode.PILOT
REGENERATE = Mode.REGENERATE  # rows drained replicas condemned (+ flagged ones): new versions
NEXT_TURN = Mode.NEXT_TURN  # job.regenerate every_turn: the next turn of every open conversation
CALL_TIMEOUT_MARGIN_S = 60.0


@dataclass(frozen=True)
class RunMode:
    """Which rows a session sends: chosen once, from the CLI flags (:meth:`of_flags`);
    what the mode does is its strategy's (:attr:`strategy`, jobs/pipeline/modes.py)."""

    kind: Mode = Mode.FRESH            # fresh | retry-failed | continue | pilot | regenerate
                                       # | next-turn (a round of job.regenerate every_turn)
    retry_failed: bool = False         # also send the keys in failures/ (not for continue)
    continue_to: Optional[int] = None  # continue: the new total output budget per row
    pilot_rows: Optional[int] = None   # pilot: ~N prompts stratified by category
    regenerate_flagged: bool = False   # regenerate: rows with integrity flags too

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", Mode(self.kind))  # a plain string names its mode

    @classmethod
    def of_flags(cls, retry_failed: bool = False, continue_truncated: bool = False,
                 max_total_tokens: Optional[int] = None,
                 pilot: Optional[int] = None,
                 regenerate_flagged: bool = False) -> "RunMode":
        """The jobs.generate flags as one mode. A pilot is its own run (``<run>-pilot``)
        and may retry its failures; --continue-truncated wants --max-total-tokens,
        which its plan checks (jobs/runs/plans.py)."""
        if regenerate_flagged:
            return cls(REGENERATE, regenerate_flagged=True)
        if continue_truncated:
            return cls(CONTINUE, continue_to=max_total_tokens, pilot_rows=pilot)
        if pilot:
            return cls(PILOT, retry_failed=retry_failed, pilot_rows=pilot)
        return cls(RETRY_FAILED if retry_failed else FRESH, retry_failed=retry_failed)

    @property
    def strategy(self) -> Strategy:
        return strategy(self.kind)

    # Questions about the kind, for the flags' tests; the code asks the strategy.
    @property
    def continues(self) -> bool:
        return self.kind is Mode.CONTINUE

    @property
    def regenerates(self) -> bool:
        return self.kind is Mode.REGENERATE

    @property
    def next_turn(self) -> bool:
        return self.kind is Mode.NEXT_TURN


@dataclass(frozen=True)
class StageSettings:
    """Everything a generate actor needs, as plain data."""

    run: str
    model: str
    max_new_tokens: int
    context_policy: str
    sampling: dict[str, Any]
    sampling_json: str          # as stored in data/
    settings_hash: str          # of everything that changes an output (rows.output_settings)
    legacy_settings_hash: str   # the older formula, to recognise old runs
    inflight_rows_per_actor: int
    rows_per_call: int
    call_linger_s: float
    retries: RetryConfig
    breaker: BreakerConfig
    metrics_category_limit: int
    continue_to: Optional[int] = None  # a continue run: rows are data/ rows to extend
    mode: Mode = Mode.FRESH   # the session's mode: its strategy builds requests and rows
    call_timeout_s: Optional[float] = None  # no result from a replica for this long: stuck
    engine_config_hash: str = ""  # what this run deployed: a result from another engine stops it
    app_name: str = ""            # for that message
    samples_per_prompt: int = 1   # job.samples_per_prompt: rows per prompt (jobs/io/samples.py)
    single_sample_hash: str = ""  # with n > 1: the hash these settings have at n = 1
    every_turn: bool = False      # job.regenerate every_turn: rows carry turns (jobs/pipeline/turns.py)
    settings: tuple[Setting, ...] = ()  # job.sampling's (jobs/pipeline/sampling_mix.py);
                                  # () = the one of ``sampling`` (a hand-built stage)
    inflight: str = "fixed"       # job.inflight: fixed, or follow the engines' load (adaptive)
    logprobs: Optional[int] = None  # job.logprobs.top_k: asked per output token; None = off

    @property
    def strategy(self) -> Strategy:
        """The mode's strategy (jobs/pipeline/modes.py): what the generate stage asks."""
        return strategy(self.mode)

    @property
    def next_turn(self) -> bool:
        """A round of job.regenerate every_turn: rows are data/ rows whose next turn is
        generated."""
        return self.mode is Mode.NEXT_TURN

    @property
    def max_thinking_tokens(self) -> Optional[int]:
        """The rows' thinking budget (job.sampling.max_thinking_tokens; None = none)."""
        return self.sampling.get("max_thinking_tokens")

    @property
    def mix(self) -> tuple[tuple[str, float], ...]:
        """(name, weight) of each setting of a sampling mix; () for one setting."""
        return tuple((s.name, s.weight) for s in self.settings if s.name is not None)

    def setting_of(self, row: dict[str, Any]) -> Setting:
        """The setting a row is sent and recorded with: the one, or the mix's it drew
        (its ``setting`` column: the admit stage's draw, or a data/ row's record)."""
        if not self.mix:
            return Setting(None, 1.0, self.sampling, self.sampling_json)
        name = row.get("setting")
        found = next((s for s in self.settings if s.name == name), None)
        if found is None:
            raise ValueError(
                f"row {row.get('key')!r} has setting {name!r}, not one of this run's "
                f"sampling mix ({', '.join(n for n, _ in self.mix)}): a row made under "
                f"other settings (resume and continue refuse those before sending)")
        return found

    @classmethod
    def of(cls, cfg: RunConfig, mode: RunMode = RunMode()) -> "StageSettings":
        job, settings = cfg.job, settings_of(cfg.job)
        main = max(settings, key=lambda s: s.weight)  # as job.main_sampling: tools send it
        sampling = hashed(settings)  # the one setting's params, or the whole mix
        logprobs = None if job.logprobs is None else job.logprobs.top_k
        return cls(
            run=job.run_name, model=cfg.engine.model_name, max_new_tokens=job.max_new_tokens,
            context_policy=job.context_policy, sampling=main.sampling,
            sampling_json=main.sampling_json, settings=settings,
            settings_hash=settings_hash(cfg.engine.model_name, sampling,
                                        output_settings=output_settings(
                                            cfg.engine, job.context_policy,
                                            job.samples_per_prompt, job.regenerate,
                                            logprobs)),
            legacy_settings_hash=settings_hash(cfg.engine.model_name, sampling),
            inflight_rows_per_actor=job.inflight_rows_per_actor,
            rows_per_call=job.rows_per_call, call_linger_s=job.call_linger_s,
            retries=job.retries, breaker=job.breaker,
            metrics_category_limit=job.metrics_category_limit,
            continue_to=mode.continue_to if mode.kind is Mode.CONTINUE else None,
            mode=mode.kind,
            # No row may take longer than the engine's own request timeout; the margin
            # covers the replica's tokenize/detokenize calls around it.
            call_timeout_s=cfg.engine.request_timeout_s + CALL_TIMEOUT_MARGIN_S,
            engine_config_hash=deployed_engine_hash(cfg.engine), app_name=cfg.serve.app_name,
            samples_per_prompt=job.samples_per_prompt,
            single_sample_hash=settings_hash(cfg.engine.model_name, sampling,
                                             output_settings=output_settings(
                                                 cfg.engine, job.context_policy,
                                                 logprobs=logprobs))
            if job.samples_per_prompt > 1 else "",
            every_turn=job.regenerate == "every_turn", inflight=job.inflight,
            logprobs=logprobs)
