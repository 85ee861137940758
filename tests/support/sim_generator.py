"""A replica's Generator (serve_apps/generation.py) talking HTTP to an in-process
simulator app on 127.0.0.1: the request path a replica takes, in the unit tier."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, Sequence

from aiohttp import web

from contract.simulator_settings import SimulatorSettings
from serve_apps.engine_client import EngineClient
from serve_apps.engines.simulator.server import build_app
from serve_apps.generation import Generator


@contextlib.asynccontextmanager
async def simulator_generator(settings: SimulatorSettings,
                              middlewares: Sequence = ()) -> AsyncIterator[Generator]:
    """``middlewares`` run before the simulator's own (e.g. one recording the bodies)."""
    app = build_app(settings)
    for middleware in reversed(middlewares):
        app.middlewares.insert(0, middleware)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    client = EngineClient(f"http://127.0.0.1:{runner.addresses[0][1]}", 30)
    try:
        yield Generator(client, settings.context_length, "</think>", "r0", lambda: True)
    finally:
        await client.close()
        await runner.cleanup()


def run_recording(settings: SimulatorSettings,
                  calls: Callable[[Generator, list[dict]], Awaitable[Any]],
                  render: Optional[Callable] = None) -> Any:
    """``calls(generator, sent)`` against the simulator, ``sent`` collecting the /generate
    bodies it received; ``render`` replaces the generator's prompt renderer."""
    sent: list[dict] = []

    @web.middleware
    async def record(request, handler):
        if request.path == "/generate":
            sent.append(await request.json())
        return await handler(request)

    async def go():
        async with simulator_generator(settings, [record]) as gen:
            if render is not None:
                gen._render = render
            return await calls(gen, sent)
    return asyncio.run(go())
