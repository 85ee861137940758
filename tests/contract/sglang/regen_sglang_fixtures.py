"""Regenerate tests/fixtures/sglang/sglang-0.5.23_*.json from SGLang 0.5.23's real HTTP stack.

    .venv/bin/python -m tests.contract.sglang.regen_sglang_fixtures

Starts the stack (tests/contract/sglang/sglang_stack.py) twice, without and with NEXTN
speculative decoding, sends each case's request (built by raygen's
engine_client.generate_body) and writes request, response and the values raygen must
read from it. test_sglang_differential.py re-sends the non-speculative requests every
run and checks the stack still answers what the files say.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from serve_apps.chat_format import render_prompt
from serve_apps.engine_client import generate_body
from serve_apps.engines.simulator import model as sim_model
from serve_apps.engines.simulator import tokenizer as tk

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures" / "sglang"
SOURCE = ("sglang 0.5.23 (PyPI wheel), its real FastAPI app, TokenizerManager, "
          "DetokenizerManager and Req finish logic on CPU with a fake scheduler fed the "
          "simulator's tokens: tests/contract/sglang/sglang_stack.py")
PROMPT = tk.encode(render_prompt([{"role": "user", "content": "what is the oracle saying"}]))


def cases(speculative: bool) -> dict[str, dict[str, Any]]:
    """name -> sampling params (the prompt is PROMPT)."""
    if speculative:
        return {"spec_stop-token": {"max_new_tokens": 200},
                "spec_length": {"max_new_tokens": 6}}
    # A word the simulated output really contains (the stack's default length model).
    params = sim_model.LengthParams(median_tokens=24.0, sigma=0.3, accept_length=0.0)
    stop = " " + sim_model.generate(PROMPT, params, 200).text.split()[3]
    return {"nospec_stop-token": {"max_new_tokens": 200},
            "nospec_length": {"max_new_tokens": 6},
            "nospec_stop-string": {"max_new_tokens": 200, "stop": [stop]}}


def expect(body: dict[str, Any]) -> dict[str, Any]:
    """What SGLang said, in the form EngineOutput holds it."""
    meta = body["meta_info"]
    finish = meta["finish_reason"]
    verify = meta.get("spec_verify_ct")
    matched = finish.get("matched")
    return {"finish_reason": finish["type"], "matched_stop": None if matched is None else str(matched),
            "finish_length": finish.get("length"), "prompt_tokens": meta["prompt_tokens"],
            "completion_tokens": meta["completion_tokens"],
            "reasoning_tokens": meta["reasoning_tokens"], "spec_verify_ct": verify,
            "accept_length": meta["completion_tokens"] / verify if verify else None}


def post(base: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(base + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def run_stack(speculative: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.contract.sglang.sglang_stack", "--port-file",
             str(port_file), *(["--speculative"] if speculative else [])],
            cwd=REPO, start_new_session=True)
        try:
            while not port_file.exists():
                if proc.poll() is not None:
                    raise SystemExit(f"stack exited with {proc.returncode}")
                time.sleep(0.2)
            base = f"http://127.0.0.1:{port_file.read_text()}"
            for name, sampling in cases(speculative).items():
                body = generate_body(PROMPT, sampling, rid=f"fixture-{name}")
                response = post(base, body)
                path = FIXTURES / f"sglang-0.5.23_{name}.json"
                path.write_text(json.dumps({
                    "_source": SOURCE, "sglang_version": "0.5.23",
                    "speculative": speculative, "request": body, "response": response,
                    "expect": expect(response)}, indent=1) + "\n")
                print("wrote", path.relative_to(REPO))
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main() -> None:
    for old in FIXTURES.glob("sglang-0.5.23_*.json"):
        old.unlink()
    run_stack(speculative=False)
    run_stack(speculative=True)


if __name__ == "__main__":
    main()
