"""What the SGLang contract tests and their fixtures share: the parser's error type and
the settings the real SGLang stack (tests/contract/sglang/sglang_stack.py) runs with."""

from __future__ import annotations

import argparse
from typing import Any


class ParseError(Exception):
    """SGLang's argparse rejected the command line (its message is the exception text)."""


class RaisingParser(argparse.ArgumentParser):
    # argparse prints and exits on a bad flag; tests want the message.
    def error(self, message: str) -> Any:  # type: ignore[override]
        raise ParseError(message)


ORACLE_CONTEXT = 1000          # small, so context edges are cheap to reach
ORACLE_MEDIAN_TOKENS = 24.0    # short simulated outputs: a request costs milliseconds
ORACLE_SIGMA = 0.3
