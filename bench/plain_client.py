"""Mode (b): a plain asyncio client, as one would write it by hand.

    python -m bench.plain_client --spec spec.json

Fixed concurrency C over N engine URLs, round-robin by worker (worker w always talks
to engine w % N, so every engine has C/N requests in flight until the prompts run
out). Per row it does what a replica does for a row: render the chat prompt
(serve_apps.chat_format.render_prompt), POST /tokenize, POST /generate with
input_ids, split reasoning/answer, and persists the result as zstd Parquet (a part
file per ``flush_rows`` rows, written in a thread). It runs in its own process so its
CPU time and RSS are its own; it reports them in a JSON summary, and per-row timings
(done wall time, latency, completion tokens) as .npy arrays.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time
from array import array
from typing import Any, Iterator

import aiohttp
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from serve_apps.chat_format import render_prompt, split_reasoning

SCHEMA = pa.schema([
    ("key", pa.string()), ("reasoning", pa.string()), ("answer", pa.string()),
    ("prompt_token_ids", pa.list_(pa.int32())), ("output_token_ids", pa.list_(pa.int32())),
    ("finish_reason", pa.string()), ("completion_tokens", pa.int32()),
    ("latency_s", pa.float64()),
])


def iter_prompts(path: str, limit: int | None) -> Iterator[dict[str, Any]]:
    with open(path) as f:
        for i, line in enumerate(f):
            if limit is not None and i >= limit:
                return
            if line.strip():
                yield json.loads(line)


class Client:
    def __init__(self, spec: dict[str, Any]):
        self.spec = spec
        self.urls: list[str] = spec["urls"]
        self.sampling = dict(spec["sampling"], max_new_tokens=spec["max_new_tokens"])
        self.prompts = iter_prompts(spec["prompts"], spec.get("limit"))
        self.done_at, self.latency, self.tokens = array("d"), array("d"), array("q")
        self.errors = 0
        self.buffer: list[dict[str, Any]] = []
        self.parts = 0
        self.writes: list[asyncio.Future] = []
        os.makedirs(spec["out_dir"], exist_ok=True)

    async def _post(self, session: aiohttp.ClientSession, url: str, body: dict) -> dict:
        async with session.post(url, json=body) as resp:
            payload = await resp.json()
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {payload}")
            return payload

    async def worker(self, w: int, session: aiohttp.ClientSession) -> None:
        base = self.urls[w % len(self.urls)]
        for row in self.prompts:  # one shared iterator: asyncio runs one worker at a time
            text = render_prompt(row["messages"], row.get("tools"))
            started = time.perf_counter()
            try:
                tok = await self._post(session, base + "/tokenize",
                                       {"prompt": text, "add_special_tokens": False})
                ids = tok["tokens"]
                out = await self._post(session, base + "/generate", {
                    "input_ids": ids, "sampling_params": self.sampling,
                    "rid": f"{row['id']}-{time.time_ns()}", "stream": False})
            except Exception:  # noqa: BLE001 - a plain client just counts its errors
                self.errors += 1
                continue
            latency = time.perf_counter() - started
            meta = out["meta_info"]
            reasoning, answer, _ = split_reasoning(out["text"])
            n = int(meta["completion_tokens"])
            self.done_at.append(time.time())
            self.latency.append(latency)
            self.tokens.append(n)
            self.buffer.append({
                "key": row["id"], "reasoning": reasoning, "answer": answer,
                "prompt_token_ids": ids, "output_token_ids": out["output_ids"],
                "finish_reason": meta["finish_reason"]["type"], "completion_tokens": n,
                "latency_s": latency})
            if len(self.buffer) >= self.spec["flush_rows"]:
                self._flush()

    def _flush(self) -> None:
        rows, self.buffer = self.buffer, []
        if not rows:
            return
        self.parts += 1
        path = os.path.join(self.spec["out_dir"], f"part-{self.parts:06d}.parquet")
        self.writes.append(asyncio.ensure_future(asyncio.to_thread(_write, rows, path)))

    async def run(self) -> None:
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=self.spec.get("request_timeout_s", 3600))
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            await asyncio.gather(*(self.worker(w, session)
                                   for w in range(self.spec["concurrency"])))
        self._flush()
        await asyncio.gather(*self.writes)


def _write(rows: list[dict[str, Any]], path: str) -> None:
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    tmp = path + ".tmp"
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", required=True, help="JSON file: urls, prompts, out_dir, ...")
    args = parser.parse_args(argv)
    with open(args.spec) as f:
        spec = json.load(f)
    cpu0, t0 = time.process_time(), time.time()
    client = Client(spec)
    asyncio.run(client.run())
    t1, cpu1 = time.time(), time.process_time()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    out = spec["result_prefix"]
    np.save(out + ".done_at.npy", np.frombuffer(client.done_at, dtype=np.float64))
    np.save(out + ".latency.npy", np.frombuffer(client.latency, dtype=np.float64))
    np.save(out + ".tokens.npy", np.frombuffer(client.tokens, dtype=np.int64))
    summary = {"rows": len(client.tokens), "errors": client.errors,
               "output_tokens": int(sum(client.tokens)), "started_at": t0, "ended_at": t1,
               "work_cpu_s": cpu1 - cpu0, "total_cpu_s": ru.ru_utime + ru.ru_stime,
               "max_rss_bytes": ru.ru_maxrss * 1024, "parts": client.parts}
    with open(out + ".json", "w") as f:
        json.dump(summary, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
