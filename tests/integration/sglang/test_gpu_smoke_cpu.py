"""cluster/gpu_smoke.sh's checks failing on SGLang's real engine, one bad config each.

The smoke runs the engine section of the config it is given; a ``device: cpu`` one (the
pool's) needs no GPU, and with the pool's app name and engine it attaches to the pool
(no engine start). Each config below is the sound one with one thing wrong, and the
smoke must exit 1 naming that check and no other: what SGLang's engine did decides
(its 400s, where its stop string ends a row, when its scheduler retracts). Accept
length is shown on the speculative pool (``spec_pool``); capacity and retractions on the
small pool (``small_pool``), whose KV pool is too small for the rows it is given.
"""

from __future__ import annotations

import urllib.request

import pytest

from cluster import gpu_smoke
from cluster.smoke_checks import RETRACTIONS, counter_total
from tests.integration.helpers import sglang_small_pool_config, write_prompts, write_yaml

pytestmark = [pytest.mark.integration]

ROWS = 8
SOUND_JOB = {"inflight_rows_per_actor": 32,  # 16 per engine: the pool's running cap
             "sampling": {"temperature": 0.0}}


def _smoke(real_config, tmp_path, capsys, name: str, **job) -> tuple[int, list[str]]:
    prompts = write_prompts(tmp_path / f"{name}.jsonl", ROWS)
    return _run(real_config(prompts, job={**SOUND_JOB, **job}), prompts, tmp_path, capsys, name)


def _run(tree: dict, prompts, tmp_path, capsys, name: str) -> tuple[int, list[str]]:
    """The smoke on config ``tree``: (its exit code, the checks it names as failed)."""
    config = write_yaml(tmp_path / f"{name}.yaml", tree)
    code = gpu_smoke.main(["--config", str(config), "--prompts", str(prompts),
                           "--output", str(tmp_path / "out")])
    said = [line for line in capsys.readouterr().err.splitlines() if "gpu_smoke: " in line]
    print("\n".join(said))
    return code, [line.split("FAILED ", 1)[1].split(":")[0]
                  for line in said if "gpu_smoke: FAILED " in line]


def test_the_sound_config_passes(real_config, tmp_path, capsys):
    assert _smoke(real_config, tmp_path, capsys, "sound") == (0, [])


@pytest.mark.parametrize("name, job, check", [
    # SGLang answers 400 to top_k 0 at temperature 0.6: no row comes back
    ("refused-sampling", {"sampling": {"temperature": 0.6, "top_k": 0},
                          "retries": {"max_attempts": 1}}, "rows"),
    # a stop string SGLang matches inside the thinking: every row ends without </think>
    ("stop-while-thinking", {"sampling": {"temperature": 0.0, "stop": ["m"]}}, "flagged"),
])
def test_each_bad_config_fails_its_check(real_config, tmp_path, capsys, name, job, check):
    assert _smoke(real_config, tmp_path, capsys, name, **job) == (1, [check])


def test_speculation_passes_when_drafts_are_accepted_and_fails_when_none_are(
        spec_config, tmp_path, capsys):
    """The speculative pool's draft agrees only after ``</think>``: whole rows accept some
    drafts; rows cut at 16 tokens, while thinking, accept none. SGLang's own per-request
    accept length for those is still 16 / 15 (the prefill's token counted): the check
    counts verify steps' tokens only, as SGLang's scheduler does, and fails them."""
    assert _smoke(spec_config, tmp_path, capsys, "spec-sound") == (0, [])
    assert _smoke(spec_config, tmp_path, capsys, "spec-thinking-only",
                  max_new_tokens=16) == (1, ["accept_length"])


def _small_pool_tree(small_pool, tmp_path, s3_endpoint, prompts, budget: int) -> dict:
    """A run on the small pool (conftest.small_pool: 1,024 KV tokens, admitting as if
    outputs were short), 16 rows in flight."""
    return sglang_small_pool_config(
        tmp_path, s3_endpoint, rows_file=str(prompts), model_path=small_pool.model,
        job={"max_new_tokens": budget, "inflight_rows_per_actor": 16})


def _retracted_total(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        return counter_total(resp.read().decode(), RETRACTIONS) or 0.0


@pytest.mark.slow
def test_a_kv_pool_too_small_for_the_rows_fails_capacity_and_names_every_retraction(
        small_pool, s3_endpoint, tmp_path, capsys):
    """The small pool's engine, two budgets. At 20 tokens the plan (16 rows x (69 prompt
    + 20)) does not fit 1,024 tokens: capacity fails, from /server_info, though the 8
    prompts sent fit and SGLang retracts none. At 60 tokens 32 rows (16 in flight, each
    69 + 38 tokens: the scripted model's answer) oversubscribe the pool: capacity fails,
    and retractions fails exactly when SGLang's scheduler retracted during the phase (its
    own counter, read here before and after; the smoke reads its increase over the phase
    the same way).

    Whether SGLang retracts these rows is not this test's to decide: it admits a request
    only when its prompt and whole budget fit (the running ones counted at the new-token
    ratio, 0.035 here), charges a pass's admissions at whole budgets, and admits nothing
    more until a request leaves a batch that ran out of room (batch_is_full), so a wave of
    rows that arrive together never outgrows the pool; rows retract only when their
    arrival splits across scheduler passes while others decode. Measured on an engine of
    the sampled model (story-like lengths): 3 phases in 4 retract (1-4 requests); on the
    scripted model's equal 38-token rows, 2 in 3. Retractions cannot fail alone: a plan
    that fits the pool never outgrows it."""
    short = write_prompts(tmp_path / "short.jsonl", 8)
    assert _run(_small_pool_tree(small_pool, tmp_path, s3_endpoint, short, 20), short, tmp_path,
                capsys, "small-pool-20") == (1, ["capacity"])
    full = write_prompts(tmp_path / "full.jsonl", 32)
    before = _retracted_total(small_pool.url)
    code, checks = _run(_small_pool_tree(small_pool, tmp_path, s3_endpoint, full, 60), full,
                        tmp_path, capsys, "small-pool-60")
    retracted = _retracted_total(small_pool.url) - before
    print(f"SGLang retracted {retracted:.0f} requests during the 60-token phase")
    assert (code, checks) == (1, ["capacity", "retractions"] if retracted else ["capacity"])
