"""raygen's contract with SGLang 0.5.23, checked against SGLang's own code.

- Launch: every command serve_apps/engines/sglang.py can build (each optional flag on
  and off, every speculative algorithm, pass-through extra_args, the shipped configs)
  is parsed by SGLang's ``ServerArgs.add_cli_args`` parser, and the shipped configs by
  ``prepare_server_args``, the function ``python -m sglang.launch_server`` calls. A
  renamed or removed flag fails here, not 20 minutes into a GPU job.
- Requests: the /generate body EngineClient sends is decoded by SGLang's generated API
  contract (``sglang.api.v1.api_types``), which the server uses to answer 400.
- Responses: tests/fixtures/sglang/*.json follow the meta_info SGLang 0.5.5, 0.5.15 and
  0.5.23 build (each file names its source; the 0.5.23 ones are recorded from SGLang's
  real HTTP stack by regen_sglang_fixtures.py); parse_meta reads each one, and the 0.5.23
  ones must also decode with SGLang's ``GenerateResponse``.
- Routes and semantics that cannot be imported without the GPU stack (/tokenize,
  /server_info, /health, /metrics) are read from the installed 0.5.23 source with ``ast``.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import itertools
import json
import logging
import re
from pathlib import Path
from typing import Any, Optional

import pytest

from jobs.config import SamplingConfig, load_config
from contract.config import STRICT_THINKING_FLAG, SGLangEngineConfig, SpeculativeConfig
from contract import spec_resolution
from serve_apps.engine_client import EngineClient, generate_body, parse_meta
from serve_apps.engines.sglang import build_command
from dashboards.metrics_catalog import SGLANG_SERIES
from tests.support.sglang import ParseError

REPO = Path(__file__).resolve().parents[3]

FIXTURES = REPO / "tests" / "fixtures" / "sglang"
QWEN = REPO / "jobs" / "configs" / "qwen36-27b-b200.yaml"
DEMO = REPO / "jobs" / "configs" / "demo.yaml"          # real SGLang, device cpu
DEMO_SIM = REPO / "jobs" / "configs" / "demo-sim.yaml"
HOST, PORT = "127.0.0.1", 31000
DRAFT = "YOUR_ORG/eagle3-draft"  # EAGLE/EAGLE3 need a draft model (speculative.draft_model_path)


# --- launch commands --------------------------------------------------------------------

def _argv(cfg: SGLangEngineConfig) -> list[str]:
    cmd = build_command(cfg, HOST, PORT, python="python")
    assert cmd[:3] == ["python", "-m", "sglang.launch_server"], cmd[:3]
    return cmd[3:]


def _shipped_engines() -> dict[str, SGLangEngineConfig]:
    sim = load_config(str(DEMO_SIM)).engine
    return {"qwen36-27b-b200": load_config(str(QWEN)).engine,
            "demo-cpu": load_config(str(DEMO)).engine,
            # The story demo's engine section as it would run on a GPU (demo-ish command).
            "demo-sim-as-sglang": SGLangEngineConfig(
                **sim.model_dump(exclude={"kind", "simulator"}), kind="sglang")}
    # (cluster/gpu_smoke.sh runs a config's own engine section: the B200 one above)


OPTIONAL_FIELDS: dict[str, Any] = {
    "served_model_name": "qwen3.6-27b",
    "mem_fraction_static": 0.93,
    "max_mamba_cache_size": 200,
    "tool_call_parser": "qwen3_coder",
    "extra_args": {"watchdog-timeout": 600, "--decode-log-interval": 40,
                   "enable_cache_report": True, "disable-radix-cache": False,
                   "chunked-prefill-size": "-1", "mamba-radix-cache-strategy": "auto"},
}
# DFLASH: raygen sends no steps, topk or draft tokens (SGLang takes the block size from
# the drafter's config: contract/spec_resolution.py), so the parser must read none.
SPECULATIVE = [None, "NEXTN", "EAGLE", "EAGLE3", "STANDALONE", "DFLASH"]


def _variant(fields: tuple[str, ...], reasoning: Optional[str], metrics: bool,
             algorithm: Optional[str]) -> SGLangEngineConfig:
    values: dict[str, Any] = {name: OPTIONAL_FIELDS[name] for name in fields}
    if algorithm is not None:
        # NEXTN uses the model's own MTP head; EAGLE/EAGLE3 need a draft model.
        draft = None if algorithm == "NEXTN" else DRAFT
        values["speculative"] = SpeculativeConfig(algorithm=algorithm, draft_model_path=draft)
    return SGLangEngineConfig(kind="sglang", model_path="Qwen/Qwen3.6-27B", context_length=20480,
                        max_running_requests=40, reasoning_parser=reasoning,
                        enable_metrics=metrics, **values)


def all_variants() -> list[SGLangEngineConfig]:
    """Every branch of build_command on and off: 2^5 x 2 x 2 x 6 = 768 commands."""
    names = list(OPTIONAL_FIELDS)
    subsets = [c for r in range(len(names) + 1) for c in itertools.combinations(names, r)]
    return [_variant(fields, reasoning, metrics, algo)
            for fields, reasoning, metrics, algo in itertools.product(
                subsets, ["qwen3", None], [True, False], SPECULATIVE)]


def _action(parser: argparse.ArgumentParser, flag: str) -> argparse.Action:
    return parser._option_string_actions[flag]


def _expected_values(cfg: SGLangEngineConfig) -> dict[str, Any]:
    spec = cfg.speculative
    from_drafter = spec is not None and spec.algorithm in spec_resolution.FROM_DRAFTER
    return {
        # No nccl_port: SGLang picks it itself when it binds it (issue #12).
        "model_path": cfg.model_path, "host": HOST, "port": PORT, "nccl_port": None,
        "base_gpu_id": 0, "tp_size": 1, "context_length": cfg.context_length,
        "max_running_requests": cfg.max_running_requests, "log_level_http": "warning",
        "served_model_name": cfg.served_model_name,
        "mem_fraction_static": cfg.mem_fraction_static,
        "max_mamba_cache_size": cfg.max_mamba_cache_size,
        "reasoning_parser": cfg.reasoning_parser, "tool_call_parser": cfg.tool_call_parser,
        "enable_metrics": cfg.enable_metrics,
        "speculative_algorithm": spec.algorithm if spec else None,
        "max_total_tokens": cfg.max_total_tokens,
        **({"device": "cpu", "attention_backend": "torch_native",
            "cuda_graph_backend_decode": "disabled",
            "cuda_graph_backend_prefill": "disabled", "sleep_on_idle": True}
           if cfg.device == "cpu" else {}),
        **({"speculative_num_steps": None if from_drafter else spec.num_steps,
            "speculative_eagle_topk": None if from_drafter else spec.eagle_topk,
            "speculative_num_draft_tokens": None if from_drafter else spec.num_draft_tokens,
            "speculative_draft_model_path": spec.draft_model_path} if spec else {}),
    }


def _check_parsed(parser: argparse.ArgumentParser, cfg: SGLangEngineConfig,
                  ns: argparse.Namespace) -> list[str]:
    """Differences between what raygen meant and what SGLang's parser understood."""
    wrong = [f"{k}: sent {v!r}, SGLang read {getattr(ns, k, '<missing>')!r}"
             for k, v in _expected_values(cfg).items() if getattr(ns, k, "<missing>") != v]
    for name, value in cfg.extra_args.items():
        if value is False:
            continue
        action = _action(parser, name if name.startswith("--") else
                         "--" + name.replace("_", "-"))
        want = True if value is True else (action.type(str(value)) if action.type
                                           else str(value))
        if getattr(ns, action.dest) != want:
            wrong.append(f"extra {name}: sent {value!r}, SGLang read {getattr(ns, action.dest)!r}")
    return wrong


def test_every_launch_command_parses_with_sglangs_parser(sglang, sglang_parser):
    variants = all_variants()
    assert len(variants) == 768
    problems = []
    for cfg in variants:
        argv = _argv(cfg)
        try:
            ns = sglang_parser.parse_args(argv)
        except ParseError as exc:
            problems.append(f"{' '.join(argv)}\n  -> SGLang 0.5.23 rejects it: {exc}")
            continue
        problems += [f"{' '.join(argv)}\n  -> {w}" for w in _check_parsed(sglang_parser, cfg, ns)]
        sglang.server_args.ServerArgs.from_cli_args(ns)  # the record launch_server builds
    assert not problems, "\n".join(problems[:10])


@pytest.mark.parametrize("name", sorted(_shipped_engines()))
def test_shipped_configs_pass_prepare_server_args(sglang, sglang_parser, monkeypatch, name):
    # prepare_server_args is exactly what `python -m sglang.launch_server` runs; it also
    # calls logging.basicConfig(force=True), which would rip out pytest's log handlers.
    monkeypatch.setattr(logging, "basicConfig", lambda **_: None)
    cfg = _shipped_engines()[name]
    args = sglang.server_args.prepare_server_args(_argv(cfg))
    for key, value in _expected_values(cfg).items():
        assert getattr(args, key) == value, key
    assert _check_parsed(sglang_parser, cfg, sglang_parser.parse_args(_argv(cfg))) == []


@pytest.mark.parametrize("algorithm", [None, "STANDALONE"])
def test_cpu_launch_command_parses_with_sglangs_parser(sglang, sglang_parser, algorithm):
    """device cpu: SGLang's own parser reads the CPU flags raygen adds (and the record
    launch_server builds from them), with and without the speculation a CPU engine runs."""
    spec = algorithm and SpeculativeConfig(algorithm=algorithm, num_steps=1, eagle_topk=1,
                                           draft_model_path="/models/draft")
    cfg = SGLangEngineConfig(kind="sglang", model_path="/models/tiny", device="cpu",
                             max_total_tokens=65536, context_length=4096, speculative=spec)
    ns = sglang_parser.parse_args(_argv(cfg))
    assert _check_parsed(sglang_parser, cfg, ns) == []
    sglang.server_args.ServerArgs.from_cli_args(ns)


def test_launch_module_still_exists(sglang):
    assert (sglang.srt.parent / "launch_server.py").is_file(), \
        "sglang.launch_server is gone: switch serve_apps/engines/sglang.py to `sglang serve`"


@pytest.mark.parametrize("extra, why", [
    ({"max-mamba-cache-sizes": 200}, "unrecognized arguments"),      # a typo
    ({"mamba-scheduler-strategy": "extra_buffer"}, "unrecognized"),   # removed in 0.5.20
    ({"cuda-graph-max-bs": 48}, "ambiguous option"),                  # split into -decode/-prefill
])
def test_misspelled_or_removed_flag_fails(sglang_parser, extra, why):
    cfg = SGLangEngineConfig(kind="sglang", model_path="Qwen/Qwen3.6-27B", extra_args=extra)
    with pytest.raises(ParseError, match=why):
        sglang_parser.parse_args(_argv(cfg))


def _sglang_flags_of(parser: argparse.ArgumentParser, dest: str) -> set[str]:
    return {o[2:] for a in parser._actions if a.dest == dest for o in a.option_strings
            if o.startswith("--")}


def test_every_flag_raygen_builds_is_reserved_under_every_sglang_name(sglang_parser):
    """extra_args may not set what build_command sets: each flag of every variant's argv
    (minus the CPU engine's fixed flags and --log-level-http), under each name SGLang's
    parser has for it, is in RESERVED_FLAGS, and no other SGLang flag is a prefix of a
    reserved one (the abbreviation rule would refuse it)."""
    from contract.config import RESERVED_FLAGS
    from serve_apps.engines.sglang import CPU_FLAGS
    unreserved_on_purpose = {f[2:] for f in CPU_FLAGS if f.startswith("--")} | {"log-level-http"}
    built = {arg[2:] for cfg in all_variants() for arg in _argv(cfg) if arg.startswith("--")}
    built -= {n.lstrip("-").replace("_", "-") for n in OPTIONAL_FIELDS["extra_args"]}
    dests = {_action(sglang_parser, f"--{flag}").dest for flag in built - unreserved_on_purpose}
    names = set().union(*(_sglang_flags_of(sglang_parser, d) for d in dests))
    assert names - set(RESERVED_FLAGS) == set(), "raygen sets these but extra_args may too"
    # A reserved name SGLang does not know would protect nothing (renamed in an upgrade?).
    known = {o[2:] for o in sglang_parser._option_string_actions if o.startswith("--")}
    assert set(RESERVED_FLAGS) - known == set()
    prefixes = {k for k in known for r in RESERVED_FLAGS if r != k and r.startswith(k)}
    assert prefixes <= set(RESERVED_FLAGS), prefixes - set(RESERVED_FLAGS)


@pytest.mark.parametrize("key", ["host", "--port", "model", "model_path", "tp", "served-model",
                                 "speculative-num-steps", "enable-metrics", "context-len"])
def test_a_reserved_flag_passed_through_would_reach_sglang(sglang_parser, key):
    """Why they are refused: each of these keys, as build_command would append it, is
    read by SGLang's parser as one of raygen's own settings (the last value wins)."""
    from contract.config import RESERVED_FLAGS, extra_arg_flag
    cfg = SGLangEngineConfig(kind="sglang", model_path="Qwen/Qwen3.6-27B", enable_metrics=False,
                             speculative=SpeculativeConfig(algorithm="NEXTN"))
    flag = key.lstrip("-").replace("_", "-")
    action = _action(sglang_parser, "--" + next(r for r in RESERVED_FLAGS if r.startswith(flag)))
    value = True if action.nargs == 0 else 7  # a bare flag (store_true) or one with a value
    argv = _argv(cfg) + [extra_arg_flag(key)] + ([] if value is True else [str(value)])
    ns = sglang_parser.parse_args(argv)
    assert getattr(ns, action.dest) == (value if value is True else action.type(str(value)))
    with pytest.raises(ValueError, match="set by raygen|abbreviates"):
        SGLangEngineConfig(**{**cfg.model_dump(exclude={"extra_args"}), "extra_args": {key: value}})


def test_unknown_reasoning_parser_fails(sglang_parser):
    cfg = SGLangEngineConfig(kind="sglang", model_path="Qwen/Qwen3.6-27B", reasoning_parser="qwen-3")
    with pytest.raises(ParseError, match="invalid choice"):
        sglang_parser.parse_args(_argv(cfg))


def test_qwen_config_leaves_mamba_slots_for_every_running_request():
    # SGLang 0.5.23 caps max_running_requests at max_mamba_cache_size // 5 for hybrid
    # models (3 slots per request with the radix cache + 2 extra-buffer tracking slots
    # under the overlap scheduler; mem_cache/kv_cache_configurator.py).
    engine = load_config(str(QWEN)).engine
    assert engine.max_mamba_cache_size // 5 >= engine.max_running_requests


# --- requests -----------------------------------------------------------------------------

def _sent_generate_body(sampling: dict[str, Any]) -> dict[str, Any]:
    """The body EngineClient.generate really sends (its HTTP call replaced)."""
    sent: dict[str, Any] = {}
    client = EngineClient("http://127.0.0.1:1", request_timeout_s=5)
    body = json.loads((FIXTURES / "sglang-0.5.23_nospec_stop-token.json").read_text())

    async def fake_request(method: str, path: str, json: Optional[dict] = None) -> Any:
        sent.update(method=method, path=path, body=json)
        return body["response"]

    client._request = fake_request  # type: ignore[method-assign]
    asyncio.run(client.generate([11, 12, 13], sampling, rid="row-1-1"))
    assert (sent["method"], sent["path"]) == ("POST", "/generate")
    return sent["body"]


@pytest.mark.parametrize("sampling", [
    SamplingConfig(),
    SamplingConfig(stop=["</answer>"], stop_token_ids=[151645], presence_penalty=0.5,
                   frequency_penalty=0.1, repetition_penalty=1.05, ignore_eos=True),
    SamplingConfig(thinking=False),  # raygen's key: never sent (0.5.23: unknown = a 400)
], ids=["defaults", "every-key", "thinking-off"])
def test_generate_body_passes_sglangs_request_contract(sglang, sampling):
    params = dict(sampling.to_sglang(), max_new_tokens=8192)  # as serve_apps/generation.py
    body = _sent_generate_body(params)
    request = sglang.api_types.GenerateRequest.from_json_value(body)
    assert request.input_ids == [11, 12, 13] and request.stream is False
    assert request.rid == "row-1-1"
    assert request.sampling_params.max_new_tokens == 8192  # SGLang's default would be 128


def test_thinking_budget_is_the_request_field_sglang_decodes(sglang):
    """raygen keeps max_thinking_tokens with its sampling; SGLang's own request decoder
    takes it only at the top level (inside sampling_params it is an unknown field)."""
    params = dict(SamplingConfig(max_thinking_tokens=128).to_sglang(), max_new_tokens=8192)
    request = sglang.api_types.GenerateRequest.from_json_value(_sent_generate_body(params))
    assert request.max_thinking_tokens == 128 and request.require_reasoning is True
    assert request.sampling_params.max_new_tokens == 8192
    unset = sglang.api_types.GenerateRequest.from_json_value(
        _sent_generate_body(SamplingConfig().to_sglang()))
    assert unset.max_thinking_tokens is None
    body = _sent_generate_body({"max_new_tokens": 16})
    body["sampling_params"]["max_thinking_tokens"] = 128
    with pytest.raises(sglang.api_types.JsonContractError, match="max_thinking_tokens"):
        sglang.api_types.GenerateRequest.from_json_value(body)


def test_a_samples_seed_is_the_sampling_seed_sglang_decodes(sglang):
    """With job.samples_per_prompt > 1 each row's seed goes in its sampling params
    (jobs/pipeline/generate_stage.py): SGLang's request decoder takes it as
    sampling_params.sampling_seed, at either end of raygen's range (jobs/io/samples.py)."""
    from jobs.io.samples import SEED_FIELD, sample_seed
    assert SEED_FIELD == "sampling_seed"
    for seed in (0, 2**63 - 1, sample_seed(bytes(16), "q-1", 3)):
        params = dict(SamplingConfig().to_sglang(), max_new_tokens=64, **{SEED_FIELD: seed})
        request = sglang.api_types.GenerateRequest.from_json_value(_sent_generate_body(params))
        assert request.sampling_params.sampling_seed == seed
    body = _sent_generate_body({"max_new_tokens": 16})
    body["sampling_params"]["seed"] = 1  # vLLM's name: an unknown field to SGLang
    with pytest.raises(sglang.api_types.JsonContractError, match="seed"):
        sglang.api_types.GenerateRequest.from_json_value(body)


def test_the_strict_thinking_flag_raygen_asks_for_is_sglangs(sglang, sglang_parser):
    """The flag config validation names (contract.config.STRICT_THINKING_FLAG), passed
    through extra_args, reaches SGLang's server args; the test pool runs with it."""
    cfg = SGLangEngineConfig(kind="sglang", model_path="Qwen/Qwen3.6-27B",
                             extra_args={STRICT_THINKING_FLAG: True})
    args = sglang_parser.parse_args(_argv(cfg))
    assert args.enable_strict_thinking is True and args.reasoning_parser == "qwen3"


def test_unknown_sampling_key_is_rejected_by_sglang(sglang):
    body = _sent_generate_body({"max_new_tokens": 16, "temprature": 0.6})
    with pytest.raises(sglang.api_types.JsonContractError):
        sglang.api_types.GenerateRequest.from_json_value(body)


# --- responses ----------------------------------------------------------------------------

def _fixtures() -> list[Path]:
    paths = sorted(FIXTURES.glob("*.json"))
    assert len(paths) >= 8, f"expected the SGLang response fixtures in {FIXTURES}"
    return paths


@pytest.mark.parametrize("path", _fixtures(), ids=lambda p: p.stem)
def test_parse_meta_reads_each_sglang_version(path):
    fixture = json.loads(path.read_text())
    assert fixture["_source"].startswith(f"sglang {fixture['sglang_version']} ")
    body, want = fixture["response"], fixture["expect"]
    out = parse_meta(body)
    assert out.finish_reason == want["finish_reason"]
    assert out.matched_stop == want["matched_stop"]
    assert out.finish_length == want["finish_length"]
    assert out.prompt_tokens == want["prompt_tokens"]
    assert out.completion_tokens == want["completion_tokens"] == len(out.output_ids)
    assert out.reasoning_tokens == want["reasoning_tokens"]
    assert out.spec_verify_ct == want["spec_verify_ct"]
    accept = out.completion_tokens / out.spec_verify_ct if out.spec_verify_ct else None
    assert accept == pytest.approx(want["accept_length"])
    meta = body["meta_info"]
    if meta.get("spec_accept_length"):  # SGLang's own figure uses the same formula
        assert accept == pytest.approx(meta["spec_accept_length"])
    if out.finish_reason == "stop" and isinstance(meta["finish_reason"]["matched"], int):
        assert out.output_ids[-1] == meta["finish_reason"]["matched"]  # stop id kept in ids


@pytest.mark.parametrize("path", [p for p in _fixtures() if "0.5.23" in p.name],
                         ids=lambda p: p.stem)
def test_0_5_23_fixtures_decode_with_sglangs_response_contract(sglang, path):
    body = json.loads(path.read_text())["response"]
    response = sglang.api_types.GenerateResponse.from_json_value(body)
    assert response.meta_info.completion_tokens == len(response.output_ids)
    assert "spec_accepted_drafts" not in body["meta_info"]  # the 0.5.15 aliases are gone


# --- routes and semantics, from the installed source --------------------------------------

def _routes(tree: ast.Module) -> dict[str, str]:
    """HTTP path -> handler name for every @app.get/post/api_route decorator."""
    found = {}
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for deco in node.decorator_list:
            if (isinstance(deco, ast.Call) and isinstance(deco.func, ast.Attribute)
                    and getattr(deco.func.value, "id", None) == "app"
                    and deco.args and isinstance(deco.args[0], ast.Constant)):
                found[deco.args[0].value] = node.name
    return found


@pytest.fixture(scope="module")
def http_server(sglang) -> tuple[ast.Module, str]:
    source = (sglang.srt / "entrypoints" / "http_server.py").read_text()
    return ast.parse(source), source


def test_routes_raygen_calls_exist(http_server):
    routes = _routes(http_server[0])
    for path in ("/generate", "/tokenize", "/server_info", "/health"):
        assert path in routes, f"SGLang 0.5.23 has no {path} route"
    assert routes["/health"] == routes["/health_generate"]  # same handler, see below
    # /metrics is a Mount added only with --enable-metrics.
    metrics = r"if get_observability\(\)\.enable_metrics:\s+add_prometheus_middleware\(app\)"
    assert re.search(metrics, http_server[1])


def test_health_is_a_generation_and_503_while_starting(sglang, http_server, monkeypatch):
    tree, source = http_server
    handler = next(n for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef)
                   and n.name == _routes(tree)["/health"])
    body = ast.get_source_segment(source, handler)
    assert "ServerStatus.Starting" in body and "Response(status_code=503)" in body
    assert '"max_new_tokens": 1' in body  # a 1-token generation, not a ping
    # ...unless SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION is false (default true).
    monkeypatch.delenv("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", raising=False)
    from sglang.srt.environ import envs
    assert envs.SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION.get() is True


def test_tokenize_request_and_response_shape(sglang):
    tree = ast.parse((sglang.srt / "entrypoints" / "openai" / "protocol.py").read_text())
    fields = {node.name: {t.target.id for t in node.body
                          if isinstance(t, ast.AnnAssign) and isinstance(t.target, ast.Name)}
              for node in tree.body if isinstance(node, ast.ClassDef)}
    # raygen sends {"prompt": text, "add_special_tokens": false} and reads "tokens".
    assert {"prompt", "add_special_tokens"} <= fields["TokenizeRequest"]
    assert "tokens" in fields["TokenizeResponse"]


def test_sglang_series_on_raygens_dashboard_exist(sglang):
    source = (sglang.srt / "observability" / "metrics_collector.py").read_text()
    names = set(re.findall(r'name="(sglang:[a-z_]+)"', source))
    families = {s.removesuffix("_bucket") for s in SGLANG_SERIES}  # histograms: family name
    assert families <= names, families - names


def test_logprob_fields_are_ones_sglang_decodes_and_absent_unless_asked(sglang):
    """job.logprobs: return_logprob, top_logprobs_num and logprob_start_len (the input's
    length: no prompt logprobs) are top-level fields of SGLang's typed request; a row
    without it sends none of them (SGLang's defaults: no logprobs)."""
    params = dict(SamplingConfig().to_sglang(), max_new_tokens=64)
    asked = sglang.api_types.GenerateRequest.from_json_value(
        generate_body([11, 12, 13], params, "row-1-1", logprobs=5))
    assert (asked.return_logprob, asked.top_logprobs_num, asked.logprob_start_len) == (True, 5, 3)
    unset = sglang.api_types.GenerateRequest.from_json_value(_sent_generate_body(params))
    assert (unset.return_logprob, unset.top_logprobs_num, unset.logprob_start_len) == (
        None, None, None)
