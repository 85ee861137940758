"""Credentials out of logs: the engine's argv, its environment and its own output lines.

A replica's log is on the Ray dashboard for anyone who reaches it, and SGLang prints its
server args (api_key included) at start. A name is secret-looking when one of its words
(split at ``-``, ``_`` and ``.``) is key, token, password, passwd, secret, credential(s)
or auth: ``--api-key``, ``--admin-api-key``, ``--ssl-keyfile-password``, ``HF_TOKEN``,
``AWS_SECRET_ACCESS_KEY``. Whole words only, so ``--max-total-tokens`` keeps its value.
"""

from __future__ import annotations

import re
from typing import Iterable

MASK = "***"
_SECRET_WORDS = frozenset({"key", "token", "password", "passwd", "secret", "credential",
                           "credentials", "auth"})
# Values that say "not set": masking them would only hide that.
_UNSET = frozenset({"", "none", "null", "''", '""'})


def is_secret_name(name: str) -> bool:
    return any(word in _SECRET_WORDS for word in re.split(r"[-_.\s]+", name.lower()) if word)


def mask_argv(argv: Iterable[str]) -> list[str]:
    """``--api-key X`` -> ``--api-key ***``, ``--api-key=X`` -> ``--api-key=***``."""
    out: list[str] = []
    mask_next = False
    for arg in argv:
        if mask_next and not arg.startswith("--"):
            out.append(MASK)
            mask_next = False
            continue
        mask_next = False
        if arg.startswith("-"):
            name, eq, _ = arg.partition("=")
            if is_secret_name(name):
                if eq:
                    arg = f"{name}={MASK}"
                else:
                    mask_next = True
        out.append(arg)
    return out


def mask_env(env: dict[str, str]) -> dict[str, str]:
    return {k: (MASK if is_secret_name(k) and v else v) for k, v in env.items()}


# name=value, name: value, 'name': 'value', name='value' (SGLang's ServerArgs repr and
# resolved dict), and --name value (a command line echoed in a log line). Only the name and
# separator are matched, so a value never hides the name that follows it.
_NAME_SEP = re.compile(r"""(?<![\w.])(?P<name>[A-Za-z_][\w.-]*)['"]?\s*[:=]\s*(?P<q>['"]?)""")
_UNQUOTED_VALUE = re.compile(r"""[^\s'",)}\]]*""")
_FLAG_VALUE = re.compile(r"(?P<flag>--[A-Za-z][\w-]*)(?P<sep>\s+)(?P<value>[^\s-][^\s]*)")


def mask_text(line: str) -> str:
    """One log line with the values of secret-looking names replaced by ***."""
    out, pos = [], 0
    for m in _NAME_SEP.finditer(line):
        if m.start() < pos or not is_secret_name(m["name"]):
            continue
        start = m.end()
        if m["q"]:
            end = line.find(m["q"], start)
            end = len(line) if end < 0 else end
        else:
            end = _UNQUOTED_VALUE.match(line, start).end()
        if line[start:end].lower() in _UNSET:
            continue
        out.append(line[pos:start] + MASK)
        pos = end
    line = "".join(out) + line[pos:]

    def flag(m: re.Match) -> str:
        return f"{m['flag']}{m['sep']}{MASK}" if is_secret_name(m["flag"]) else m[0]

    return _FLAG_VALUE.sub(flag, line)
