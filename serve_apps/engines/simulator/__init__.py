"""Simulated SGLang engine: a real HTTP server speaking SGLang's native contract.

CPU tests and the demo run this instead of a GPU engine. It is deliberately
free of ray/torch/transformers/sglang imports so it starts in well under a
second and can be launched as a plain subprocess (see ``launch.build_command``).
"""

from serve_apps.engines.simulator.launch import build_command
from contract.simulator_settings import SimulatorSettings

__all__ = ["SimulatorSettings", "build_command"]
