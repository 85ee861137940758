"""The job's entry points stay light: config errors print before Ray is imported, and
`raygen`'s parser (every subcommand's options, built for any command) imports no Ray."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
HEAVY = ("ray", "sglang", "torch", "transformers")
# jobs.generate also leaves the run store's pyarrow and the analyses' pandas to the session.
HEAVY_FOR_GENERATE = HEAVY + ("pyarrow", "pandas")

PROBE = """
import json, sys

def loaded(names):
    found = {name: sorted(m for m in sys.modules if m == name or m.startswith(name + "."))[:3]
             for name in names}
    return {k: v for k, v in found.items() if v}

import jobs.config, jobs.generate
generate = loaded(%r)
import jobs.cli
jobs.cli.build_parser()  # imports every subcommand's module (jobs.tune.command too)
print(json.dumps({"generate": generate, "raygen parser": loaded(%r)}))
""" % (HEAVY_FOR_GENERATE, HEAVY)


def test_config_generate_and_the_raygen_parser_do_not_import_heavy_modules():
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"generate": {},
                                                                "raygen parser": {}}


def test_config_error_exits_2_without_ray(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("job:\n  input: a.jsonl\n  output: o\n  run_name: r\n"
                   "  sampling: {temprature: 0.7}\n")
    code = ("import sys, jobs.generate as g; rc = g.main(['--config', %r]); "
            "print('RAY' if 'ray' in sys.modules else 'NORAY'); sys.exit(rc)" % str(bad))
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout.strip() == "NORAY"
    assert "job.sampling.temprature: unknown key" in proc.stderr
