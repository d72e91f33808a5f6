"""Run the front's apps, each on its own port, in one process and one event loop (uvicorn servers side by side):
the KServe v2 proxy (public HTTP, 8000 by default) and the OpenAI-compatible API (9000 by default)."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI

log = logging.getLogger("tritonllm.front")


@dataclass(frozen=True)
class Listener:
    """One app on one address. `name` appears in logs only."""

    name: str
    app: FastAPI
    host: str
    port: int

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"{self.name} port must be in 1..65535, got {self.port}")


def _server(listener: Listener) -> uvicorn.Server:
    config = uvicorn.Config(listener.app, host=listener.host, port=listener.port, log_level="warning",
                            access_log=False,  # access lines would carry paths only, but stay quiet by default
                            timeout_graceful_shutdown=30, h11_max_incomplete_event_size=64 * 1024)
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # one handler for all servers: serve() below
    return server


async def serve(listeners: list[Listener]) -> None:
    """Serve until SIGINT / SIGTERM, then stop every server gracefully (in-flight requests finish)."""
    import signal

    if not listeners:
        raise ValueError("nothing to serve: every listener is disabled")
    servers = [_server(listener) for listener in listeners]
    loop = asyncio.get_running_loop()

    def stop() -> None:
        for server in servers:
            server.should_exit = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)
    for listener in listeners:
        log.warning("front: %s on http://%s:%d", listener.name, listener.host, listener.port)
    tasks = [asyncio.create_task(server.serve()) for server in servers]
    done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    stop()  # one server ending (e.g. its port was taken) ends the others
    await asyncio.gather(*tasks, return_exceptions=True)
    for task in done:
        if task.exception() is not None:
            raise task.exception()
    if any(not server.started for server in servers):
        raise SystemExit("front: a server could not start (port in use?)")
