"""tests/support/cpu_profile.py runs a real command and charges its CPU to it (a
subprocess: not the unit tier's)."""

import sys

from tests.support import cpu_profile


# A second of CPU whatever the machine's load (a loaded machine stretches its wall time).
BURN_ONE_CPU_SECOND = ("import sys, time\n"
                       "while time.process_time() < 1.0: pass\n"
                       "sys.exit(3)")


def test_the_command_is_run_and_its_cpu_charged_to_it(tmp_path, capsys):
    out = tmp_path / "cpu.txt"
    code = cpu_profile.main(["--out", str(out), "--period", "0.05", "--",
                             sys.executable, "-c", BURN_ONE_CPU_SECOND])
    assert code == 3  # the command's own exit code
    text = out.read_text()
    assert "exit 3" in text.splitlines()[0]
    charged = [line for line in text.splitlines()[2:] if sys.executable in line]
    assert charged and float(charged[0].split()[0]) >= 0.5, text
