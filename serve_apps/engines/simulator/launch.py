"""Command line that starts one simulated engine process.

Design decision: the launcher only builds an argv list (no Popen here), so
callers choose how to supervise the child (Ray actor, pytest fixture, shell).
Settings travel as explicit flags (``SimulatorSettings.to_cli_args``), never
through environment variables, so the command is self-describing in logs.
"""

from __future__ import annotations

import sys

from contract.simulator_settings import SimulatorSettings

MODULE = "serve_apps.engines.simulator"


def build_command(settings: SimulatorSettings, host: str, port: int, python: str = sys.executable) -> list[str]:
    """argv for ``python -m serve_apps.engines.simulator`` listening on host:port with these settings."""
    return [python, "-m", MODULE, "--host", host, "--port", str(port), *settings.to_cli_args()]
