"""Typed config of the engine and its Serve deployment, shared by jobs/ and serve_apps/.

One pydantic model per deployable part; every field documents itself and carries its
unit in its name. Unknown keys are errors (``extra="forbid"``) so a typo in a 30-hour
run's YAML fails at submit time, not as silently ignored tuning.

The engine config is a union discriminated by ``kind``: ``sglang`` (the real server and
its flags) or ``simulator`` (the CPU stand-in and its knobs). An engine section must
name its kind: with a default one, a section whose ``kind`` line was lost would be read
as the other kind and its keys reported as unknown, never the missing kind. (A config
without an engine section gets the simulator.) Each kind accepts only its own keys.
How a kind is launched lives in serve_apps/engines/.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Optional, Union

import yaml
from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Discriminator,
                      Field, Tag, TypeAdapter, ValidationError, model_validator)

from contract import spec_resolution
from contract.redact import is_secret_name
from contract.simulator_settings import SimulatorSettings

# model_path of a simulated engine: anything else is a real model and needs kind=sglang.
SIMULATOR_MODEL_PREFIX = "sim-"
ENGINE_KINDS = ("sglang", "simulator")


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the key."""


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SpeculativeConfig(StrictModel):
    algorithm: Literal["NEXTN", "EAGLE", "EAGLE3", "STANDALONE", "DFLASH"] = Field(
        "NEXTN", description="SGLang --speculative-algorithm (NEXTN = the model's own MTP head; "
        "STANDALONE = a separate small draft model of the same tokenizer; DFLASH = a block "
        "drafter, whose own config sets the block size).")
    num_steps: int = Field(3, ge=1, description="--speculative-num-steps: draft steps per "
                           "verify. Not for DFLASH (SGLang runs 1).")
    eagle_topk: int = Field(1, ge=1, description="--speculative-eagle-topk. Not for DFLASH "
                            "(SGLang runs 1).")
    num_draft_tokens: int = Field(
        4, ge=1, description="--speculative-num-draft-tokens. With eagle_topk 1 SGLang "
        "runs num_steps + 1 whatever is set here, and raygen plans with that. Not for "
        "DFLASH: its drafter's config sets the block (extra_args "
        "speculative-dflash-block-size overrides it).")
    draft_model_path: Optional[str] = Field(
        None, description="--speculative-draft-model-path; required by EAGLE/EAGLE3, "
        "STANDALONE and DFLASH, unused by NEXTN (the model's own MTP head).")

    @model_validator(mode="after")
    def _draft_model(self) -> "SpeculativeConfig":
        if self.algorithm != "NEXTN" and not self.draft_model_path:
            raise ValueError(f"algorithm {self.algorithm} needs draft_model_path")
        return self

    @model_validator(mode="after")
    def _dflash_block(self) -> "SpeculativeConfig":
        # SGLang would take a sent --speculative-num-draft-tokens as DFLASH's block size
        # instead of the drafter's own (_handle_dflash): a silently weaker run.
        if self.algorithm in spec_resolution.FROM_DRAFTER:
            given = sorted({"num_steps", "eagle_topk", "num_draft_tokens"} & self.model_fields_set)
            if given:
                raise ValueError(
                    f"{', '.join(given)}: DFLASH takes its block size from the drafter's "
                    f"config (dflash_config.block_size) and runs 1 step of topk 1; leave "
                    f"{'it' if len(given) == 1 else 'them'} out (extra_args "
                    f"speculative-dflash-block-size sets another block size)")
        return self


# --- engine.extra_args: pass-through SGLang flags ------------------------------------------
# {"--flag-name" or "flag-name" (or flag_name): value}; true -> the bare flag, false -> left
# out, anything else -> its text. Flags raygen sets itself are refused: argparse keeps the
# last value given, so a pass-through copy would silently win, exposing the engine
# (--host) or labelling every row with settings the engine does not run (--model-path).

class YamlBoolWord(str):
    """A scalar that YAML 1.1 reads as a boolean but that is spelled as a word (yes, no, on,
    off in any case): the config loader keeps its text, so extra_args can refuse it while
    typed bool fields still read it as the boolean (pydantic parses these words)."""


class _ConfigLoader(yaml.SafeLoader):
    def construct_yaml_bool(self, node):  # type: ignore[override]
        if node.value.lower() in ("yes", "no", "on", "off"):
            return YamlBoolWord(node.value)
        return super().construct_yaml_bool(node)


_ConfigLoader.add_constructor("tag:yaml.org,2002:bool", _ConfigLoader.construct_yaml_bool)


def load_yaml(text: str) -> Any:
    """YAML as raygen's config reads it: safe_load, yes/no/on/off kept as YamlBoolWord."""
    return yaml.load(text, Loader=_ConfigLoader)


_NO_FIELD = "there is no config field for it: "
# Flag (without its dashes) -> what to set instead. SGLang's aliases are listed too
# (--model, --tensor-parallel-size, --speculative-draft-model); a test checks this
# against every flag serve_apps/engines/sglang.py builds and SGLang 0.5.23's parser.
RESERVED_FLAGS: dict[str, str] = {
    "host": _NO_FIELD + "the replica binds its engine to 127.0.0.1 (the engine has no "
    "authentication; only the replica may reach it)",
    "port": _NO_FIELD + "the replica gives its engine a free port",
    "model-path": "engine.model_path",
    "model": "engine.model_path",
    "served-model-name": "engine.served_model_name",
    "context-length": "engine.context_length",
    "max-running-requests": "engine.max_running_requests",
    "base-gpu-id": _NO_FIELD + "each replica runs on the one GPU Ray gave it "
    "(serve.num_gpus_per_replica)",
    "tp-size": _NO_FIELD + "raygen runs one engine per GPU (--tp-size 1)",
    "tensor-parallel-size": _NO_FIELD + "raygen runs one engine per GPU (--tp-size 1)",
    "speculative-algorithm": "engine.speculative.algorithm",
    "speculative-num-steps": "engine.speculative.num_steps",
    "speculative-eagle-topk": "engine.speculative.eagle_topk",
    "speculative-num-draft-tokens": "engine.speculative.num_draft_tokens",
    "speculative-draft-model-path": "engine.speculative.draft_model_path",
    "speculative-draft-model": "engine.speculative.draft_model_path",
    "enable-metrics": "engine.enable_metrics",
    "max-total-tokens": "engine.max_total_tokens",
    "mem-fraction-static": "engine.mem_fraction_static",
    "max-mamba-cache-size": "engine.max_mamba_cache_size",
    "reasoning-parser": "engine.reasoning_parser",
    "tool-call-parser": "engine.tool_call_parser",
    "device": "engine.device",
}
# Pass-through speculative flags that change what SGLang resolves (contract/spec_resolution.py).
DFLASH_BLOCK_FLAG = "speculative-dflash-block-size"
ADAPTIVE_FLAG = "speculative-adaptive"
_FLAG_NAME = re.compile(r"(--)?[A-Za-z0-9][A-Za-z0-9_-]*")
_NUMBER = re.compile(r"-?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?")


def extra_arg_flag(name: str) -> str:
    """The command-line flag of an extra_args key: "--x_y" stays, "x_y" -> "--x-y"."""
    return name if name.startswith("--") else f"--{name.replace('_', '-')}"


def _flag_words(name: str) -> str:
    """What SGLang's parser matches a key against: no dashes in front, "-" for "_"."""
    return name.removeprefix("--").replace("_", "-")


def _resolving_flag(name: str) -> str:
    """The flag SGLang's parser reads for an extra_args key, for the flags that change
    the resolution: a unique prefix (argparse allow_abbrev) counts as the flag."""
    flag = _flag_words(name)
    if len(flag) > len("speculative-d") and DFLASH_BLOCK_FLAG.startswith(flag):
        return DFLASH_BLOCK_FLAG
    return flag


def _use_instead(instead: str) -> str:
    return instead if instead.startswith(_NO_FIELD) else f"set {instead} instead"


def _check_extra_arg_name(name: str) -> str:
    if not _FLAG_NAME.fullmatch(name):
        raise ValueError(
            f"{name!r} is not a flag name: give the long flag without its value, e.g. "
            f"watchdog-timeout or --watchdog-timeout (the value goes after the colon)")
    flag = _flag_words(name)
    if flag in RESERVED_FLAGS:
        raise ValueError(f"--{flag} is set by raygen; {_use_instead(RESERVED_FLAGS[flag])}")
    # SGLang's parser accepts any unambiguous prefix of a flag (argparse allow_abbrev).
    for reserved, instead in RESERVED_FLAGS.items():
        if reserved.startswith(flag):
            raise ValueError(
                f"--{flag} abbreviates --{reserved} (SGLang's parser accepts a flag's "
                f"prefix), which raygen sets; {_use_instead(instead)}")
    return name


def _check_extra_arg_value(value: Any) -> Any:
    if isinstance(value, YamlBoolWord):
        raise ValueError(
            f"{str(value)!r} is a YAML 1.1 boolean, not text: quote it ('{value}') to pass "
            f"the word, or write true (the bare flag) or false (the flag left out)")
    if value is None:
        raise ValueError("null is not a flag value: true passes the bare flag, false "
                         "leaves it out, any other value is passed as its text")
    if not isinstance(value, (str, int, float, bool)):
        raise ValueError(f"a {type(value).__name__} is not a flag value: values are "
                         f"strings, numbers or booleans (quote anything else)")
    if isinstance(value, str) and value.startswith("-") and not _NUMBER.fullmatch(value):
        raise ValueError("a value starting with '-' would be read by SGLang's parser as "
                         "another flag, not as this flag's value")
    return value


ExtraArgName = Annotated[str, AfterValidator(_check_extra_arg_name)]
ExtraArgValue = Annotated[Union[str, int, float, bool], BeforeValidator(_check_extra_arg_value)]


class _EngineBase(StrictModel):
    """Settings every engine kind has: the model, its context, batch size, timeouts."""

    served_model_name: Optional[str] = Field(
        None, description="Name recorded in output rows and metrics; defaults to model_path.")
    context_length: int = Field(
        16384, ge=256, description="Max prompt + output tokens per request (SGLang --context-length).")
    max_running_requests: int = Field(
        48, ge=1, description="Requests decoded at once per engine. Set it: with speculative "
        "decoding SGLang silently uses 48 otherwise.")
    speculative: Optional[SpeculativeConfig] = Field(
        None, description="Speculative decoding settings; None = off.")
    think_end_token: str = Field(
        "</think>", description="Text that ends the reasoning part of a thinking model's output.")
    start_timeout_s: float = Field(
        1800.0, gt=0, description="How long a replica waits for the engine's /health at start "
        "(large models take minutes to load).")
    request_timeout_s: float = Field(
        3600.0, gt=0, description="HTTP timeout of one /generate call (an 8K-token thinking "
        "completion under load can take many minutes).")
    drain_flagged_fraction: Optional[float] = Field(
        0.5, gt=0, le=1, description="A replica whose last drain_window_rows outputs are "
        "flagged (contract/integrity.py) in more than this share drains itself: Serve restarts "
        "its engine and its rows go to the other replicas. None = never.")
    drain_window_rows: int = Field(
        64, ge=1, description="How many of a replica's latest outputs the drain judges.")
    canary_interval_s: Optional[float] = Field(
        600.0, gt=0, description="Each replica sends the canary (serve_apps/canary.py: a few "
        "fixed prompts at temperature 0) to its engine once it is up and then every this many "
        "seconds; one whose outputs differ from those more than half of the app's live replicas "
        "agree on sends it again at once and, if they still differ, drains as over "
        "drain_flagged_fraction (two replicas that disagree are a tie: logged, no drain). "
        "None = no canary.")
    canary_max_new_tokens: int = Field(
        16, ge=1, le=256, description="Output tokens per canary prompt (greedy, so short "
        "outputs suffice to tell engines apart).")

    @property
    def resolved_speculative(self) -> Optional[spec_resolution.ResolvedSpec]:
        """The speculative settings as SGLang 0.5.23 resolves them (None when off)."""
        spec = self.speculative
        if spec is None:
            return None
        block = {_resolving_flag(k): v for k, v in self.extra_args.items()}.get(DFLASH_BLOCK_FLAG)
        return spec_resolution.resolve(spec.algorithm, spec.num_steps, spec.eagle_topk,
                                       spec.num_draft_tokens, None if block is None else int(block))

    @property
    def reserved_tokens(self) -> int:
        """SGLang's speculative reserve per request, from the resolved settings."""
        resolved = self.resolved_speculative
        return resolved.reserved_tokens if resolved else 0

    @property
    def planned_max_running_requests(self) -> int:
        """Running requests per engine as SGLang resolves them from the config: raygen
        always sends --max-running-requests, so speculation's silent 48 never applies
        (the SGLang kind adds the Mamba cap)."""
        return self.max_running_requests

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model_path

    def config_hash(self) -> str:
        """Identifies the engine settings: a running app with another hash is redeployed."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]


# Mamba state slots per running request of a hybrid model under SGLang 0.5.23
# (KVCacheConfigurator._calculate_mamba_ratio): 3 with the radix cache + 2 tracking slots
# of the extra buffer it picks under the overlap scheduler (speculative decoding keeps
# overlap on a GPU). tests/contract/sglang/test_sglang_resolution.py calls that function.
MAMBA_SLOTS_PER_REQUEST = 5


class SGLangEngineConfig(_EngineBase):
    """The real engine: ``python -m sglang.launch_server`` with these flags."""

    kind: Literal["sglang"] = Field(description="The real SGLang server (one GPU per replica).")
    model_path: str = Field(description="HF id or local path of the model (SGLang --model-path).")
    device: Literal["cuda", "cpu"] = Field(
        "cuda", description="cuda: one GPU per replica. cpu: SGLang's CPU engine, for tests and "
        "the demo on tiny models: the launch adds --device cpu, torch_native attention and no "
        "CUDA graphs, and the engine process (only it) gets SGLANG_USE_CPU_ENGINE=1 and "
        "raygen's CPU shims (serve_apps/engines/sglang_cpu/); needs max_total_tokens.")
    max_total_tokens: Optional[int] = Field(
        None, ge=1, description="SGLang --max-total-tokens: the KV pool in tokens (default: "
        "SGLang sizes it from GPU memory); required with device cpu.")
    chat_template: Literal["builtin", "model"] = Field(
        "model", description="model: the model tokenizer's own template via transformers on "
        "the replica (GPU nodes have it with SGLang). builtin: raygen's ChatML renderer with "
        "thinking on (Qwen3 family). Either renders thinking off (enable_thinking=False) "
        "for rows of job.sampling.thinking false.")
    mem_fraction_static: Optional[float] = Field(
        None, gt=0, lt=1, description="SGLang --mem-fraction-static (fraction of GPU memory "
        "for weights and KV cache; e.g. 0.93 on a B200).")
    max_mamba_cache_size: Optional[int] = Field(
        None, ge=1, description="SGLang --max-mamba-cache-size for hybrid Mamba models; at "
        "least 5 x max_running_requests (checked: SGLang caps running requests at "
        "max_mamba_cache_size // 5).")
    reasoning_parser: Optional[str] = Field(
        "qwen3", description="SGLang --reasoning-parser; None for non-thinking models.")
    tool_call_parser: Optional[str] = Field(None, description="SGLang --tool-call-parser.")
    enable_metrics: bool = Field(True, description="SGLang --enable-metrics (needed for /metrics).")
    extra_args: dict[ExtraArgName, ExtraArgValue] = Field(
        default_factory=dict, description="Any other SGLang flag: true = the bare flag, "
        "false = left out, any other string or number = its value. Flags raygen sets "
        "(host, port, model path, served model name, context length, max running requests, "
        "base GPU id, tp size, speculative, metrics and the other fields above) are refused "
        "with the field to use; null and unquoted yes/no/on/off are refused; values of "
        "secret-looking flags (--api-key) are masked in the logs.")

    @model_validator(mode="after")
    def _speculative_flags(self) -> "SGLangEngineConfig":
        # Tuning flags of speculative decoding only mean something with it on, and with it
        # off raygen reserves no draft tokens in the context budget.
        if self.speculative is None:
            for name in self.extra_args:
                if _flag_words(name).startswith("spec"):
                    raise ValueError(
                        f"extra_args.{name}: speculative decoding is off (engine.speculative "
                        f"is not set); turn it on there, its other --speculative-* flags "
                        f"then pass through")
            return self
        flags = {_resolving_flag(name): (name, value) for name, value in self.extra_args.items()}
        if flags.get(ADAPTIVE_FLAG, (None, False))[1] is not False:
            # It moves num_steps at run time and reserves max candidate steps + 1 tokens
            # (SpeculativeAlgorithm.resolve_max_speculative_num_draft_tokens).
            raise ValueError(
                f"extra_args.{flags[ADAPTIVE_FLAG][0]}: raygen plans each prompt's context "
                f"reserve from fixed draft settings (engine.speculative); SGLang's adaptive "
                f"speculation changes them at run time. Leave it out")
        if DFLASH_BLOCK_FLAG in flags:
            name, value = flags[DFLASH_BLOCK_FLAG]
            if self.speculative.algorithm not in spec_resolution.FROM_DRAFTER:
                raise ValueError(f"extra_args.{name}: only DFLASH has a block size "
                                 f"(engine.speculative.algorithm is {self.speculative.algorithm})")
            if isinstance(value, bool) or not str(value).isdigit() or int(value) < 1:
                raise ValueError(f"extra_args.{name}: a positive whole number of tokens "
                                 f"(got {value!r})")
        return self

    @model_validator(mode="after")
    def _cpu_pool(self) -> "SGLangEngineConfig":
        # On CPU SGLang would size the KV pool from host memory: a tiny model then holds
        # gigabytes of cache.
        if self.device == "cpu" and self.max_total_tokens is None:
            raise ValueError("device cpu needs max_total_tokens (the KV pool in tokens, "
                             "e.g. 65536 for the test models)")
        # What raygen's CPU shims run (serve_apps/engines/sglang_cpu/shims/
        # cpu_speculation.py): a STANDALONE draft chain of one step; SGLang has no
        # torch_native multi-step draft backend, and the verify path takes chains only.
        spec = self.speculative
        if self.device == "cpu" and spec is not None and (
                spec.algorithm != "STANDALONE" or spec.num_steps != 1 or spec.eagle_topk != 1):
            raise ValueError(
                f"device cpu runs speculative decoding as speculative.algorithm STANDALONE, "
                f"num_steps 1, eagle_topk 1 only (got {spec.algorithm}, num_steps "
                f"{spec.num_steps}, eagle_topk {spec.eagle_topk}): the CPU engine has no "
                f"multi-step draft backend and verifies draft chains only")
        return self

    @model_validator(mode="after")
    def _mamba_slots(self) -> "SGLangEngineConfig":
        # SGLang 0.5.23 caps running requests at max_mamba_cache_size // 5 for hybrid
        # models, silently: 80 cache slots give 16 running requests, not 80.
        cap = self.mamba_running_cap
        if cap is not None and cap < self.max_running_requests:
            raise ValueError(
                f"max_mamba_cache_size ({self.max_mamba_cache_size}) caps running requests "
                f"at {cap} < max_running_requests ({self.max_running_requests}); raise it to "
                f"{MAMBA_SLOTS_PER_REQUEST * self.max_running_requests} or lower "
                f"max_running_requests")
        return self

    @property
    def mamba_running_cap(self) -> Optional[int]:
        """Running requests the Mamba state cache holds (hybrid models; None: not set)."""
        cache = self.max_mamba_cache_size
        return None if cache is None else cache // MAMBA_SLOTS_PER_REQUEST

    @property
    def planned_max_running_requests(self) -> int:
        # KVCacheConfigurator.resolve_max_num_reqs: min(requested, Mamba cap); the KV pool
        # may still lower it at start (only /server_info tells).
        cap = self.mamba_running_cap
        return self.max_running_requests if cap is None else min(self.max_running_requests, cap)


class SimulatorEngineConfig(_EngineBase):
    """The simulated engine (serve_apps/engines/simulator/): SGLang's HTTP API on CPU."""

    kind: Literal["simulator"] = Field(
        description="The simulated engine; accepts only model_path names starting with "
        "'sim-'.")
    model_path: str = Field(
        "sim-qwen", description="Simulated model name; must start with 'sim-'.")
    chat_template: Literal["builtin", "model"] = Field(
        "builtin", description="builtin: raygen's ChatML renderer with thinking on (what the "
        "simulator's tokenizer expects; off for rows of job.sampling.thinking false). model: "
        "the model tokenizer's own template (enable_thinking as the row's setting says).")
    simulator: SimulatorSettings = Field(
        default_factory=SimulatorSettings, description="Simulated engine knobs.")

    # The simulated output follows Qwen3's reasoning format and takes no extra flags;
    # fixed values so output_settings (jobs/pipeline/rows.py) reads both kinds alike.
    reasoning_parser: ClassVar[Optional[str]] = "qwen3"
    extra_args: ClassVar[dict[str, Union[str, int, float, bool]]] = {}

    @model_validator(mode="after")
    def _simulator_model(self) -> "SimulatorEngineConfig":
        # A real model name under the simulator would write simulated text labelled as
        # that model for a whole run.
        if not self.model_path.startswith(SIMULATOR_MODEL_PREFIX):
            raise ValueError(
                f"engine.kind is simulator but engine.model_path {self.model_path!r} is not a "
                f"simulator model (names start with {SIMULATOR_MODEL_PREFIX!r}); set "
                f"engine.kind: sglang to run the real model")
        return self


STRICT_THINKING_FLAG = "enable-strict-thinking"


def thinking_budget_problem(engine: "SGLangEngineConfig | SimulatorEngineConfig") -> Optional[str]:
    """Why this engine cannot honour a per-request thinking budget (None: it can).
    SGLang 0.5.23 takes max_thinking_tokens only with --enable-strict-thinking (else a 400
    for every row), enforces it through the reasoning parser's think end (without a parser
    it is ignored) and a grammar backend that filters tokens (it refuses to start with
    --grammar-backend none)."""
    if engine.kind == "simulator":
        if not engine.simulator.enable_strict_thinking:
            return ("the simulator honours it only with engine.simulator.enable_strict_thinking: "
                    "true (SGLang's --enable-strict-thinking; without it every row is a 400)")
        return None
    if not engine.reasoning_parser:
        return ("engine.reasoning_parser is not set: SGLang finds the thinking through its "
                "reasoning parser and would not cut it")
    flags = {_flag_words(name): value for name, value in engine.extra_args.items()}
    if flags.get(STRICT_THINKING_FLAG) is not True:
        return (f"SGLang 0.5.23 refuses max_thinking_tokens (a 400 for every row) unless the "
                f"engine runs with --{STRICT_THINKING_FLAG}: set engine.extra_args "
                f"{STRICT_THINKING_FLAG}: true")
    if str(flags.get("grammar-backend", "")).lower() == "none":
        return ("engine.extra_args grammar-backend: none cannot enforce it (SGLang's strict "
                "thinking needs a token-filtering grammar backend, e.g. xgrammar)")
    return None


def _engine_kind(value: Any) -> Optional[str]:
    # No default: a missing kind (None) and an unknown one fail below, as engine_kind.
    if isinstance(value, dict):
        return value.get("kind")
    return getattr(value, "kind", None)


def default_engine() -> "SimulatorEngineConfig":
    """The engine of a config without an engine section: the simulator's defaults."""
    return SimulatorEngineConfig(kind="simulator")


EngineConfig = Annotated[
    Union[Annotated[SGLangEngineConfig, Tag("sglang")],
          Annotated[SimulatorEngineConfig, Tag("simulator")]],
    Discriminator(_engine_kind, custom_error_type="engine_kind",
                  custom_error_message=f"engine.kind is missing or unknown: one of "
                                       f"{', '.join(ENGINE_KINDS)}"),
]
_ENGINE = TypeAdapter(EngineConfig)


def parse_engine_config(data: Any) -> SGLangEngineConfig | SimulatorEngineConfig:
    """An engine config of either kind from a mapping (e.g. its JSON dump)."""
    return _ENGINE.validate_python(data)


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
        None, ge=0, description="GPUs per replica; default 1 for sglang, 0 for the simulator. "
        "A cuda engine needs exactly 1 (checked here, and by each replica against the GPUs "
        "it sees before its engine starts).")
    reuse_running_app: bool = Field(
        True, description="Attach to a running app of the same name instead of redeploying it.")


# One engine per GPU (tp-size 1): a cuda engine's replica must reserve exactly this many.
GPUS_PER_CUDA_ENGINE = 1


def gpu_pinning_problem(engine: "SGLangEngineConfig | SimulatorEngineConfig",
                        serve: ServeConfig) -> Optional[str]:
    """Why these sections would not pin each cuda engine to its own GPU (None: they do).
    With fewer GPUs reserved than the engine uses, Ray hides none from it and every
    engine of the node lands on GPU 0; with more, the others sit idle."""
    gpus = serve.num_gpus_per_replica
    if engine.kind != "sglang" or engine.device != "cuda" or gpus is None:
        return None
    if gpus != GPUS_PER_CUDA_ENGINE:
        return (f"serve.num_gpus_per_replica is {gpus:g}: a cuda engine runs on exactly "
                f"{GPUS_PER_CUDA_ENGINE} GPU (tp-size 1); set it to {GPUS_PER_CUDA_ENGINE} "
                f"(or leave it out)")
    return None


class EngineSections(BaseModel):
    """The engine and serve sections of a run config: all a Serve app needs. Other
    sections (job, storage) belong to the job and are not read here."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    engine: EngineConfig = Field(default_factory=default_engine)
    serve: ServeConfig = Field(default_factory=ServeConfig)

    @model_validator(mode="after")
    def _gpu_pinning(self) -> "EngineSections":
        problem = gpu_pinning_problem(self.engine, self.serve)
        if problem:
            raise ValueError(problem)
        return self


def _kind_problem(where: str, value: Any) -> str:
    """The line for an engine section without a known kind: it names the kind, not the
    keys that would be wrong under some other kind."""
    kinds = ", ".join(ENGINE_KINDS)
    if not isinstance(value, dict):
        return f"{where}: expected a mapping with a kind, one of {kinds} (got {value!r:.80})"
    if value.get("kind") is None:
        return f"{where}.kind is required: one of {kinds}"
    return f"{where}.kind: unknown kind {value['kind']!r:.40}; one of {kinds}"


# A tagged union puts its tag in an error's path after the section key; the YAML key
# has none (job.sampling is one setting or a mix: jobs/config.py).
UNION_TAGS = {"engine": ENGINE_KINDS, "sampling": ("setting", "mix")}


def format_errors(exc: ValidationError, source: str) -> str:
    """One line per error, each naming its dotted key (the engine kind tag left out)."""
    lines = [f"invalid config ({source}):"]
    for err in exc.errors():
        # A tagged union puts the tag in the path (engine.sglang.model_path); the YAML
        # key is engine.model_path.
        # A mapping's key error ends in "[key]": the key itself is already named.
        loc = [str(p) for i, p in enumerate(err["loc"])
               if not (i > 0 and p in UNION_TAGS.get(err["loc"][i - 1], ()))
               and p != "[key]"]
        if err["type"] == "engine_kind":
            lines.append(f"  {_kind_problem('.'.join(loc) or 'engine', err.get('input'))}")
            continue
        key = ".".join(loc) or "(top level)"
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        # Never echo the value of a secret-looking key (--api-key) into a log or console.
        quiet = err["type"] == "extra_forbidden" or (len(loc) > 1 and is_secret_name(loc[-1]))
        got = "" if quiet else f" (got {err.get('input')!r:.80})"
        lines.append(f"  {key}: {msg}{got}")
    return "\n".join(lines)


def read_config_tree(path: str) -> dict[str, Any]:
    """The YAML mapping of a run config file, or ConfigError saying what is wrong."""
    try:
        tree = load_yaml(Path(path).read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: top level must be a mapping with engine/serve/job/storage")
    return tree


def load_engine_sections(path: str) -> EngineSections:
    """The engine and serve sections of the run config at ``path``, validated."""
    try:
        return EngineSections.model_validate(read_config_tree(path))
    except ValidationError as exc:
        raise ConfigError(format_errors(exc, path)) from None
