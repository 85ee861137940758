"""cluster/gpu_smoke.sh's checks failing on SGLang's real engine, one bad config each.

The smoke runs the engine section of the config it is given; a ``device: cpu`` one (the
pool's) needs no GPU, and with the pool's app name and engine it attaches to the pool
(no engine start). Each config below is the sound one with one thing wrong, and the
smoke must exit 1 naming that check and no other: what SGLang's engine did decides
(its 400s, where its stop string ends a row). Not shown on the engine yet, each
unit-tested on SGLang's field and metric names (tests/unit/cluster/test_smoke_checks.py):
capacity and retractions (they need an engine with a pool too small for its rows: an
engine start of its own). Accept length is shown on the speculative pool (``spec_pool``).
"""

from __future__ import annotations

import pytest

from cluster import gpu_smoke
from tests.integration.helpers import write_prompts, write_yaml

pytestmark = [pytest.mark.integration]

ROWS = 8
SOUND_JOB = {"inflight_rows_per_actor": 32,  # 16 per engine: the pool's running cap
             "sampling": {"temperature": 0.0}}


def _smoke(real_config, tmp_path, capsys, name: str, **job) -> tuple[int, list[str]]:
    prompts = write_prompts(tmp_path / f"{name}.jsonl", ROWS)
    tree = real_config(prompts, job={**SOUND_JOB, **job})
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
