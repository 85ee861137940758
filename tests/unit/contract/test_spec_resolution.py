"""raygen plans from the speculative settings SGLang 0.5.23 resolves, not the configured
ones (contract/spec_resolution.py); DFLASH runs its drafter's own block. The same
figures are put to SGLang's own resolution in tests/contract/sglang/test_sglang_resolution.py."""

import pytest
from pydantic import ValidationError

from contract.config import SGLangEngineConfig, SimulatorEngineConfig, SpeculativeConfig
from serve_apps.engines import launch_command
from serve_apps.engines.sglang import build_command


def _engine(spec: SpeculativeConfig, **kw) -> SGLangEngineConfig:
    return SGLangEngineConfig(kind="sglang", model_path="m", speculative=spec, **kw)


def _flag(argv: list[str], flag: str):
    return argv[argv.index(flag) + 1] if flag in argv else None


@pytest.mark.parametrize("algorithm, steps, topk, drafts, resolved, reserve", [
    ("NEXTN", 3, 1, 8, 4, 4),       # topk 1: SGLang verifies steps + 1, reserves 4, not 8
    ("NEXTN", 5, 1, 2, 6, 6),       # ... and 6, not 5: a prompt at the edge would be a 400
    ("NEXTN", 3, 1, 4, 4, 4),       # the shipped B200 settings: unchanged
    ("EAGLE3", 5, 4, 8, 8, 20),     # topk > 1: kept; the reserve is topk x steps
    ("STANDALONE", 3, 1, 8, 4, 0),  # rewritten too, but its drafts reserve no output slots
])
def test_reserve_is_planned_from_the_resolved_draft_tokens(algorithm, steps, topk, drafts,
                                                           resolved, reserve):
    spec = SpeculativeConfig(algorithm=algorithm, num_steps=steps, eagle_topk=topk,
                             num_draft_tokens=drafts,
                             draft_model_path=None if algorithm == "NEXTN" else "d")
    cfg = _engine(spec)
    assert cfg.reserved_tokens == reserve
    assert cfg.resolved_speculative.num_draft_tokens == resolved
    # The flags are sent as configured: SGLang does the rewrite, raygen only plans with it.
    assert _flag(build_command(cfg, "h", 1), "--speculative-num-draft-tokens") == str(drafts)


def test_simulator_plans_the_same_resolved_figures():
    cfg = SimulatorEngineConfig(kind="simulator", speculative=SpeculativeConfig(
        num_steps=3, eagle_topk=1, num_draft_tokens=8))
    argv = launch_command(cfg, "127.0.0.1", 1)
    assert cfg.reserved_tokens == 4
    assert _flag(argv, "--speculative-num-draft-tokens") == "4"
    assert _flag(argv, "--speculative-reserved-tokens") == "4"


def test_dflash_sends_no_block_size_so_sglang_reads_the_drafters():
    cfg = _engine(SpeculativeConfig(algorithm="DFLASH", draft_model_path="z-lab/drafter"))
    argv = build_command(cfg, "h", 1)
    assert _flag(argv, "--speculative-algorithm") == "DFLASH"
    assert _flag(argv, "--speculative-draft-model-path") == "z-lab/drafter"
    for flag in ("--speculative-num-draft-tokens", "--speculative-num-steps",
                 "--speculative-eagle-topk"):
        assert flag not in argv
    resolved = cfg.resolved_speculative
    assert (resolved.algorithm, resolved.num_steps, resolved.eagle_topk) == ("DFLASH", 1, 1)
    assert resolved.num_draft_tokens is None  # the drafter's block, known at start
    assert cfg.reserved_tokens == 0  # not is_eagle(): compute_num_reserved_tokens gives 0


@pytest.mark.parametrize("key", ["speculative-dflash-block-size", "speculative_dflash_block"])
def test_dflash_block_size_passes_through_extra_args(key):
    # An unambiguous prefix is the same flag to SGLang's parser (argparse allow_abbrev).
    cfg = _engine(SpeculativeConfig(algorithm="DFLASH", draft_model_path="d"),
                  extra_args={key: 10})
    assert cfg.resolved_speculative.num_draft_tokens == 10
    argv = build_command(cfg, "h", 1)
    assert argv[-2:] == ["--" + key.replace("_", "-"), "10"]


@pytest.mark.parametrize("key", ["num_draft_tokens", "num_steps", "eagle_topk"])
def test_dflash_refuses_eagle_settings_naming_the_key(key):
    with pytest.raises(ValidationError, match=f"{key}: DFLASH takes its block size"):
        SpeculativeConfig(algorithm="DFLASH", draft_model_path="d", **{key: 2})


def test_dflash_needs_its_drafter():
    with pytest.raises(ValidationError, match="DFLASH needs draft_model_path"):
        SpeculativeConfig(algorithm="DFLASH")


def test_simulated_dflash_reports_accept_stats_against_sglangs_default_block():
    cfg = SimulatorEngineConfig(kind="simulator", speculative=SpeculativeConfig(
        algorithm="DFLASH", draft_model_path="d"))
    argv = launch_command(cfg, "127.0.0.1", 1)
    assert _flag(argv, "--speculative-num-draft-tokens") == "16"
    assert float(_flag(argv, "--accept-length")) > 1  # spec fields on, as for NEXTN


@pytest.mark.parametrize("extra, match", [
    ({"speculative-adaptive": True}, "extra_args.speculative-adaptive: raygen plans"),
    ({"speculative_dflash_block_size": 8}, "only DFLASH has a block size"),
])
def test_flags_that_change_the_resolution_raygen_cannot_plan_are_refused(extra, match):
    with pytest.raises(ValidationError, match=match):
        _engine(SpeculativeConfig(), extra_args=extra)


def test_dflash_block_size_must_be_a_count():
    with pytest.raises(ValidationError, match="positive whole number"):
        _engine(SpeculativeConfig(algorithm="DFLASH", draft_model_path="d"),
                extra_args={"speculative-dflash-block-size": "big"})
