"""``python -m service``'s signal handling, in process: what the handler itself may do."""

from __future__ import annotations

import asyncio
import signal

import uvicorn
from fastapi import FastAPI

from service.__main__ import DrainingServer
from service.serving.runtime import Runtime
from service.settings import Settings


def test_a_signal_only_schedules_the_drain_and_the_loop_runs_it() -> None:
    """The handler runs between any two bytecodes of the main thread, maybe inside a lock that
    thread holds (prometheus_client's multiprocess values share one non-reentrant lock, taken by
    every metric update): draining from the handler itself could wait on that lock forever."""
    runtime = Runtime(Settings(drain_delay_s=0.05))
    runtime.state = "ready"
    server = DrainingServer(uvicorn.Config(FastAPI()), runtime)

    async def signalled() -> None:
        server.handle_exit(signal.SIGTERM, None)
        assert runtime.state == "ready"  # nothing touched inside the handler
        await asyncio.sleep(0)
        assert runtime.state == "draining"  # the loop's next turn drains
        assert not server.should_exit  # the listener stays open for the drain delay
        await asyncio.sleep(0.2)
        assert server.should_exit and not server.force_exit
        server.handle_exit(signal.SIGTERM, None)
        assert server.force_exit  # a second signal stops waiting

    asyncio.run(signalled())
