"""tests/support/cpu_profile.py: the CPU-per-process tool the time ledger's profile uses."""

import sys

import pytest

from tests.support import cpu_profile


def test_a_label_keeps_the_first_words_without_flags():
    assert cpu_profile.label("/venv/bin/python -u -c import sys") == "/venv/bin/python"
    assert cpu_profile.label("ray::IDLE") == "ray::IDLE"
    assert cpu_profile.label("") == ""


def test_summarize_charges_each_label_and_leaves_out_what_ran_before():
    seen = {(1, "10"): [5.0, ["ray::IDLE", "ray::Write"]],
            (2, "11"): [3.0, ["ray::IDLE", "ray::Write", "ray::IDLE2"]],
            (3, "12"): [9.0, ["moto"]],
            (4, "13"): [1.0, []]}
    before = {(3, "12"): [8.0, ["moto"]], (3, "99"): [50.0, ["moto"]]}  # a reused pid: not it
    rows = cpu_profile.summarize(seen, since=before)
    assert rows[0] == (8.0, 2, "ray::IDLE | ray::Write")
    assert (1.0, 1, "moto") in rows
    assert (1.0, 1, "(no command line: kernel thread or zombie)") in rows


def test_no_command_is_a_usage_error():
    with pytest.raises(SystemExit) as info:
        cpu_profile.main(["--out", "/dev/null"])
    assert info.value.code == 2
