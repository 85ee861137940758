"""CLI entry: ``python -m serve_apps.engines.simulator --port 30000 --time-scale 0.01``.

Design decisions: flags are generated from SimulatorSettings (one per field)
plus --host/--port; invalid values exit with argparse's usage error (code 2)
before anything listens. SIGTERM/SIGINT shut the server down and exit 0, so
supervisors can tell a clean stop from a simulated crash (exit 1).
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from pydantic import ValidationError

from serve_apps.engines.simulator.server import serve
from contract.simulator_settings import SimulatorSettings


def parse_args(argv: list[str] | None = None) -> tuple[SimulatorSettings, str, int]:
    parser = argparse.ArgumentParser(prog="python -m serve_apps.engines.simulator", description="Simulated SGLang engine.")
    parser.add_argument("--host", default="127.0.0.1", help="Interface to listen on (default: 127.0.0.1).")
    parser.add_argument("--port", type=int, default=30000, help="TCP port; 0 picks a free one (default: 30000).")
    SimulatorSettings.add_cli_arguments(parser)
    ns = parser.parse_args(argv)
    try:
        settings = SimulatorSettings.from_namespace(ns)
    except ValidationError as e:
        parser.error(str(e))
    return settings, ns.host, ns.port


def main(argv: list[str] | None = None) -> int:
    settings, host, port = parse_args(argv)
    asyncio.run(serve(settings, host, port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
