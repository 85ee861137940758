"""The prefix key a row is routed by (``serve.prefix_affinity``, serve_apps/prefix_router.py).

Rows whose prompts begin alike should meet one engine's radix cache. The key hashes the
first ``prefix_chars`` characters of the row's canonical prompt: its tools JSON (a
template renders tools into the system turn, first) then its messages JSON, both as
the validate stage stores them (sorted keys: a message's "content" comes before its
"role", so the text starts with the first message's content). Rows that share a system
prompt or a history at least that long share a key; a shorter common prefix is simply
not grouped. A continuation row carries the same two columns, so it keys like the row
it extends. Only a routing hint: any key is correct, a good one saves prefill.
"""

from __future__ import annotations

import hashlib
from typing import Any, Optional


def prefix_key(row: dict[str, Any], prefix_chars: int) -> Optional[str]:
    """The row's key, or None when affinity is off (``prefix_chars`` 0)."""
    if prefix_chars <= 0:
        return None
    text = (row.get("tools") or "") + "\x00" + (row.get("messages") or "")
    return hashlib.blake2b(text[:prefix_chars].encode(), digest_size=8).hexdigest()
