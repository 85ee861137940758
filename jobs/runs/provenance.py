"""<run>/provenance.json: what produced the run's rows, recorded at the start of each session.

Written once the lease is held and the engines are up (the engine's own /server_info is
part of it), before any row is sent. Every export manifest and the final manifest
carry a copy (jobs/analysis/export.py, finalize.py), so a training set says which model
files, template, parser, engine build and flags, sampling and inputs made it.

What it holds (``"format": 1``):
- model: path and served name; for a local folder (as the driver sees it) the sha256 of
  its config, generation config, tokenizer and chat template files; else the HF id.
- chat_template: the setting and a sha256 of the template the replicas render with:
  the model's own (chat_template.jinja, chat_template.json or tokenizer_config.json's,
  the order transformers reads them in) or raygen's builtin renderer (the sha256 of its
  rendering of a fixed probe conversation: code changes that alter a prompt show).
- reasoning parser, think token, tool-call parser; speculative config; sampling and
  budget; settings_hash (what the plan checks).
- engine: kind, config hash, version and server args from /server_info (one replica's;
  its live ``internal_states`` left out), and the argv raygen builds for it (the port,
  chosen per launch, as ``<port>``; the interpreter as ``python``). Secret-looking
  values are masked (contract/redact.py) in both.
- raygen's version (importlib.metadata) and the run's input fingerprints (inputs.json).
- sessions: one short entry per session (when, mode, fingerprint, what changed);
  earlier: the full record of each earlier distinct provenance, so a run resumed under
  another engine build says both.

A resume whose provenance differs logs one line per changed field. It refuses nothing
itself: what must not change within a run is settings_hash's, which the plan checks
before the engines are deployed (jobs/runs/plans.py). Per-launch values (ports, host,
random seed, start time) are recorded but never reported as changes.
"""

from __future__ import annotations

import datetime as dt
import difflib
import hashlib
import json
import logging
import os
import platform
import socket
from typing import TYPE_CHECKING, Any, Iterable, Optional

from contract.redact import MASK, is_secret_name, mask_argv, mask_text
from jobs.config import RunConfig
from jobs.io.run_store import PROVENANCE_FILE, RunStore
from jobs.io.storage import write_json_atomic
from jobs.pipeline import input_fingerprints
from jobs.pipeline.sampling_mix import hashed
from jobs.pipeline.settings import StageSettings
from serve_apps import chat_format
from serve_apps.app import with_local_paths
from serve_apps.engines import launch_command

if TYPE_CHECKING:
    from jobs.pipeline.settings import RunMode

logger = logging.getLogger("raygen")

FILE = PROVENANCE_FILE
FORMAT = 1
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json",
               "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
               "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json")
PORT_PLACEHOLDER = "<port>"
# Keys of a record that describe the session or the history, not what produced rows.
SESSION_KEYS = ("format", "run", "written_at", "session", "sessions", "earlier", "fingerprint")
# /server_info values that differ at every launch of the same engine: kept, never a change.
PER_LAUNCH = frozenset({"host", "startup_time", "launch_command", "random_seed",
                        "dist_init_addr", "kv_events", "internal_states"})
MAX_SESSIONS = 200
INFO_TIMEOUT_S = 60.0
PROBE_MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2? Use the tool."},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
     "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 2}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "4"},
    {"role": "user", "content": "And 3+3?"},
]
PROBE_TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two numbers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                    "b": {"type": "number"}}}}}]


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def raygen_version() -> Optional[str]:
    import importlib.metadata
    try:
        return importlib.metadata.version("raygen")
    except importlib.metadata.PackageNotFoundError:
        return None


# --- parts -------------------------------------------------------------------------------

def model_fingerprint(engine: Any) -> dict[str, Any]:
    path = engine.model_path
    out: dict[str, Any] = {"path": path, "served_model_name": engine.model_name}
    if engine.kind == "simulator":
        return {**out, "source": "simulator"}
    if os.path.isdir(path):
        files = {}
        for name in MODEL_FILES + tuple(sorted(
                f for f in os.listdir(path) if f.endswith(".jinja") and f not in MODEL_FILES)):
            full = os.path.join(path, name)
            if os.path.isfile(full):
                with open(full, "rb") as f:
                    files[name] = _sha256(f.read())
        return {**out, "source": "local_dir", "files": files}
    if path.startswith(("/", ".", "~")) or path.count("/") > 1:
        # A path this driver cannot see (e.g. only on the GPU nodes): no hashes here.
        return {**out, "source": "path_not_on_driver"}
    return {**out, "source": "hf_id"}


def _model_template(path: str) -> tuple[Optional[str], Optional[str]]:
    """(template text, where it came from) of a local model folder, as transformers
    picks it; (None, None) when there is none to read."""
    jinja = os.path.join(path, "chat_template.jinja")
    if os.path.isfile(jinja):
        with open(jinja, encoding="utf-8") as f:
            return f.read(), "chat_template.jinja"
    for name in ("chat_template.json", "tokenizer_config.json"):
        full = os.path.join(path, name)
        if os.path.isfile(full):
            with open(full, encoding="utf-8") as f:
                template = json.load(f).get("chat_template")
            if template:
                text = template if isinstance(template, str) else json.dumps(
                    template, sort_keys=True)
                return text, name
    return None, None


def chat_template_fingerprint(engine: Any) -> dict[str, Any]:
    setting = engine.chat_template
    if setting == "builtin":
        text = chat_format.render_prompt(PROBE_MESSAGES, PROBE_TOOLS)
        return {"setting": setting, "source": "raygen builtin renderer (probe rendering)",
                "sha256": _sha256(text.encode())}
    if engine.kind != "simulator" and os.path.isdir(engine.model_path):
        text, source = _model_template(engine.model_path)
        if text is not None:
            return {"setting": setting, "source": source, "sha256": _sha256(text.encode())}
        return {"setting": setting, "source": "none found in the model folder", "sha256": None}
    return {"setting": setting, "source": "model not on the driver", "sha256": None}


def engine_argv(engine: Any) -> list[str]:
    """The engine's argv as a replica builds it, masked, with the per-launch port as
    <port> and the interpreter as ``python``."""
    argv = launch_command(engine, "127.0.0.1", 0)
    argv = ["python" if i == 0 else a for i, a in enumerate(argv)]
    for i, arg in enumerate(argv[:-1]):
        if arg == "--port":
            argv[i + 1] = PORT_PLACEHOLDER
    return mask_argv(argv)


def clean_server_info(value: Any, name: str = "") -> Any:
    """/server_info as stored: secret-looking values masked (strings only: a secret is
    text; ``bucket_time_to_first_token`` buckets are not), live scheduler state out."""
    if isinstance(value, dict):
        return {str(k): (MASK if is_secret_name(str(k)) and isinstance(v, str) and v
                         and not v.startswith("<redacted") else clean_server_info(v, str(k)))
                for k, v in value.items() if k != "internal_states"}
    if isinstance(value, list):
        return mask_argv(value) if name == "launch_command" and all(
            isinstance(v, str) for v in value) else [clean_server_info(v) for v in value]
    if isinstance(value, str):
        return mask_text(value)
    return value


def server_info_of(handle: Any) -> dict[str, Any]:
    """One replica's /server_info; {"error": ...} when it cannot be read (the session
    goes on: provenance records, it does not gate)."""
    try:
        info = handle.info.remote().result(timeout_s=INFO_TIMEOUT_S)
        return info.get("server_info") or {}
    except Exception as exc:  # noqa: BLE001
        logger.warning("provenance: the engine's /server_info could not be read: %s", exc)
        return {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"}


# --- the record --------------------------------------------------------------------------

def build(cfg: RunConfig, store: RunStore, mode: "RunMode",
          server_info: dict[str, Any]) -> dict[str, Any]:
    """This session's provenance (without history: see :func:`with_history`)."""
    engine, job = with_local_paths(cfg.engine), cfg.job  # as deployed
    stage = StageSettings.of(cfg, mode)
    info = clean_server_info(server_info or {})
    record = {
        "format": FORMAT, "run": store.uri, "written_at": _now(),
        "session": {"started_at": _now(), "mode": mode.kind,
                    "retry_failed": mode.retry_failed, "continue_to": mode.continue_to,
                    "pilot_rows": mode.pilot_rows,
                    "driver": {"host": socket.gethostname(), "pid": os.getpid(),
                               "ray_job_id": os.environ.get("RAY_JOB_ID")}},
        "raygen": {"version": raygen_version(), "python": platform.python_version()},
        "settings_hash": stage.settings_hash,
        "model": model_fingerprint(engine),
        "chat_template": chat_template_fingerprint(engine),
        "reasoning_parser": engine.reasoning_parser,
        "think_end_token": engine.think_end_token,
        "tool_call_parser": getattr(engine, "tool_call_parser", None),
        "speculative": engine.speculative.model_dump() if engine.speculative else None,
        "sampling": hashed(stage.settings),  # the one setting's params, or the whole mix
        "budget": {"max_new_tokens": job.max_new_tokens,
                   "context_length": engine.context_length,
                   "context_policy": job.context_policy},
        "engine": {"kind": engine.kind, "config_hash": engine.config_hash(),
                   "version": info.get("version"), "argv": engine_argv(engine),
                   "server_info": info},
        "inputs": input_fingerprints.recorded(store) or [],
    }
    record["fingerprint"] = fingerprint(record)
    return record


def comparable(record: dict[str, Any]) -> dict[str, Any]:
    """The fields a resume compares: what produced rows, not the session or history;
    per-launch server values out; inputs by uri."""
    out = {k: v for k, v in record.items() if k not in SESSION_KEYS}
    engine = dict(out.get("engine") or {})
    if isinstance(engine.get("server_info"), dict):
        engine["server_info"] = {k: v for k, v in engine["server_info"].items()
                                 if not per_launch(k)}
    out["engine"] = engine
    out["inputs"] = {str(f.get("uri")): {k: v for k, v in f.items() if k != "uri"}
                     for f in out.get("inputs") or [] if isinstance(f, dict)}
    return out


def per_launch(name: str) -> bool:
    return name in PER_LAUNCH or name == "port" or name.endswith(("_port", "_ports"))


def fingerprint(record: dict[str, Any]) -> str:
    blob = json.dumps(comparable(record), sort_keys=True, default=str)
    return _sha256(blob.encode())


def _flatten(value: Any, path: tuple = ()) -> Iterable[tuple[tuple, Any]]:
    if isinstance(value, dict) and value:
        for k in sorted(value, key=str):
            yield from _flatten(value[k], path + (str(k),))
    else:
        yield path, value


def diff(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(field path, old value, new value) per changed field, in path order. A field
    missing on one side is None there."""
    a, b = dict(_flatten(comparable(old))), dict(_flatten(comparable(new)))
    return [(path_text(p), a.get(p), b.get(p)) for p in sorted(set(a) | set(b))
            if a.get(p) != b.get(p)]


def path_text(path: tuple) -> str:
    out = ""
    for part in path:
        plain = part.replace("_", "").replace("-", "").isalnum()
        out += (f".{part}" if out else part) if plain else f"[{json.dumps(part)}]"
    return out


def _show(value: Any, limit: int = 200) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def change_text(path: str, old: Any, new: Any) -> str:
    if (isinstance(old, list) and isinstance(new, list)
            and all(isinstance(v, str) for v in old + new)):
        parts = []
        matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
        for op, i1, i2, j1, j2 in matcher.get_opcodes():
            if op == "equal":
                continue
            # A changed value is named by its flag: "--max-running-requests 48 -> 32".
            flag = old[i1 - 1] if (0 < i1 < len(old) and old[i1 - 1].startswith("-")
                                   and not old[i1].startswith("-")) else ""
            parts.append(f"{flag + ' ' if flag else ''}{' '.join(old[i1:i2]) or '(nothing)'}"
                         f" -> {' '.join(new[j1:j2]) or '(nothing)'}")
        return f"{path}: " + "; ".join(parts)
    return f"{path}: {_show(old)} -> {_show(new)}"


def describe(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The log lines of a resume whose provenance differs ([] when it does not)."""
    changes = diff(old, new)
    if not changes:
        return []
    since = (old.get("session") or {}).get("started_at") or old.get("written_at") or "?"
    head = (f"provenance changed since the session of {since}: {len(changes)} field(s) "
            f"differ; the rows of both stay in the run (settings_hash "
            f"{'unchanged' if old.get('settings_hash') == new.get('settings_hash') else 'changed'}"
            f"; what it covers is checked before deploying)")
    return [head] + [f"provenance: {change_text(p, a, b)}" for p, a, b in changes]


def with_history(new: dict[str, Any], old: Optional[dict[str, Any]]) -> dict[str, Any]:
    """The record to write: new, plus the sessions so far and every earlier distinct
    provenance in full."""
    sessions, earlier = [], []
    if isinstance(old, dict):
        sessions = list(old.get("sessions") or [])
        earlier = list(old.get("earlier") or [])
        if old.get("format") != FORMAT:  # not ours to read: kept whole, as found
            earlier.append({"unreadable_format": old.get("format"), "record": old})
        elif old.get("fingerprint") != new["fingerprint"]:
            known = {e.get("fingerprint") for e in earlier}
            if old.get("fingerprint") not in known:
                earlier.append({k: v for k, v in old.items() if k not in ("sessions", "earlier")})
    changed = ([p for p, _, _ in diff(old, new)]
               if isinstance(old, dict) and old.get("format") == FORMAT else [])
    sessions.append({"started_at": new["session"]["started_at"], "mode": new["session"]["mode"],
                     "raygen": new["raygen"]["version"],
                     "fingerprint": new["fingerprint"], "changed": changed})
    return {**new, "sessions": sessions[-MAX_SESSIONS:], "earlier": earlier}


def record_session(cfg: RunConfig, store: RunStore, mode: "RunMode", handle: Any) -> dict:
    """Build this session's provenance, log what changed since the last one, write it.
    Called by run_job once the engines are up, before the stream starts."""
    new = build(cfg, store, mode, server_info_of(handle))
    old = store.read_json(FILE)
    if isinstance(old, dict) and old.get("format") == FORMAT:
        for line in describe(old, new):
            logger.warning("%s", line)
    elif old is not None:
        logger.warning("provenance: %s/%s has format %r (this raygen writes %d): kept under "
                       "'earlier', not compared", store.uri, FILE,
                       old.get("format") if isinstance(old, dict) else None, FORMAT)
    record = with_history(new, old)
    write_json_atomic(store.loc(FILE), record)
    logger.info("provenance: %s/%s (%s)", store.uri, FILE, new["fingerprint"][:19])
    return record
