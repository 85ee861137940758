"""contract.protocol: the result columns are listed once and data/ follows them; the
wire types survive Ray's serializer and are smaller than the dicts they replace."""

from __future__ import annotations

import pickle
from dataclasses import asdict, fields

import ray.cloudpickle as cloudpickle

from contract.protocol import RESULT_COLUMNS, GenerateRequest, GenerateResult
from jobs.io.schema import ARROW_TYPES, DATA, STAGE_OUTPUT


def _result(**kw) -> GenerateResult:
    values = dict(key="k", text="<think>r</think>a", reasoning="r", answer="a",
                  finished_thinking=True, prompt_token_ids=[1, 2], output_token_ids=[3, 4],
                  finish_reason="stop", matched_stop="</s>", prompt_tokens=2,
                  completion_tokens=2, cached_tokens=0, reasoning_tokens=1,
                  max_new_tokens=64, effective_max_new_tokens=64, budget_clamped_by="",
                  spec_verify_ct=1, accept_length=2.0, latency_s=0.5, replica="r0")
    values.update(kw)
    return GenerateResult(**values)


def test_data_schema_has_every_result_column_with_its_declared_type_in_order():
    stored = [f for f in DATA if f.name in RESULT_COLUMNS]
    assert [f.name for f in stored] == list(RESULT_COLUMNS)
    assert all(f.type == ARROW_TYPES[RESULT_COLUMNS[f.name]] for f in stored)


def test_only_the_key_text_error_fields_request_id_engine_hash_drain_and_load_stay_on_the_wire():
    wire_only = {f.name for f in fields(GenerateResult)} - set(RESULT_COLUMNS)
    assert wire_only == {"key", "text", "error_class", "error_message", "request_id",
                         "engine_config_hash", "drained", "assistant_spans", "load"}


def test_the_stage_output_carries_data_and_failures_but_no_reject_columns():
    assert {"reason", "raw", "rejected_at", "reject_id"}.isdisjoint(STAGE_OUTPUT.names)
    assert set(DATA.names) <= set(STAGE_OUTPUT.names)


def test_a_failed_result_has_no_generated_columns_and_a_bounded_message():
    failed = GenerateResult.failed("k", "engine_5xx", "x" * 5000, replica="r1")
    assert (failed.error_class, failed.replica, len(failed.error_message)) == (
        "engine_5xx", "r1", 2000)
    assert all(getattr(failed, name) is None for name in RESULT_COLUMNS if name != "replica")


def test_a_result_unpacks_as_a_mapping_for_ray_data_llm():
    result = _result()
    assert {**result} == asdict(result)
    assert result["finish_reason"] == "stop"


def test_request_and_result_round_trip_through_rays_serializer():
    request = GenerateRequest(key="k", run="r", category="c", max_new_tokens=64,
                              sampling={"temperature": 0.6},
                              messages=[{"role": "user", "content": "hi"}])
    for obj in (request, _result()):
        assert pickle.loads(cloudpickle.dumps(obj, protocol=5)) == obj


def test_a_result_pickles_smaller_than_the_dict_it_replaces():
    result = _result()
    typed = len(cloudpickle.dumps(result, protocol=5))
    as_dict = len(cloudpickle.dumps(dict(asdict(result), retryable=None), protocol=5))
    assert typed < as_dict
