"""``until_disconnect`` with the server's disconnect signal (the ``DISCONNECT_EXTENSION`` future that
``service.http.limits`` puts in every request's scope): the work is cancelled when the connection
goes, and nothing else is. The watcher path (other ASGI servers) is test_api_disconnect.py's."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.requests import Request

from service.api.dependencies import until_disconnect
from service.api.error_responses import ClientDisconnected
from service.api.extensions import DISCONNECT_EXTENSION

pytestmark = pytest.mark.anyio


def _request(disconnected: asyncio.Future[None]) -> Request:
    async def receive() -> dict[str, Any]:
        raise AssertionError("the signal path never reads the request's messages")

    scope = {"type": "http", "extensions": {DISCONNECT_EXTENSION: disconnected}}
    return Request(scope, receive)


async def test_the_work_s_result_when_the_client_stays() -> None:
    disconnected = asyncio.get_running_loop().create_future()

    async def work() -> str:
        await asyncio.sleep(0)
        return "done"

    assert await until_disconnect(_request(disconnected), work()) == "done"
    disconnected.set_result(None)  # after the answer: nothing left to cancel
    await asyncio.sleep(0)
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_a_lost_connection_cancels_the_work_and_raises_client_disconnected() -> None:
    disconnected = asyncio.get_running_loop().create_future()
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def work() -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    async def handler() -> str:
        return await until_disconnect(_request(disconnected), work())

    task = asyncio.ensure_future(handler())
    await started.wait()
    disconnected.set_result(None)
    with pytest.raises(ClientDisconnected):
        await task
    assert cancelled.is_set()
    assert task.cancelling() == 0  # the request's task is not left half-cancelled


async def test_a_client_already_gone_gets_no_work_started() -> None:
    disconnected = asyncio.get_running_loop().create_future()
    disconnected.set_result(None)
    ran = False

    async def work() -> None:
        nonlocal ran
        ran = True

    with pytest.raises(ClientDisconnected):
        await until_disconnect(_request(disconnected), work())
    assert not ran
    pending: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    with pytest.raises(ClientDisconnected):
        await until_disconnect(_request(disconnected), pending)
    assert pending.cancelled()


@pytest.mark.parametrize("also_disconnected", [False, True])
async def test_another_cancellation_stays_a_cancellation(also_disconnected: bool) -> None:
    disconnected = asyncio.get_running_loop().create_future()
    started = asyncio.Event()

    async def work() -> None:
        started.set()
        await asyncio.sleep(30)

    task = asyncio.ensure_future(until_disconnect(_request(disconnected), work()))
    await started.wait()
    task.cancel()  # the server shutting down, a deadline: not a disconnect…
    if also_disconnected:
        disconnected.set_result(None)  # …even when the connection goes in the same instant
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_disconnect_signalled_as_the_work_ends_does_not_cancel_what_follows() -> None:
    loop = asyncio.get_running_loop()
    disconnected, result = loop.create_future(), loop.create_future()

    async def handler() -> str:
        done = await until_disconnect(_request(disconnected), result)
        await asyncio.sleep(0)  # the route goes on (renders, sends): the signal came too late
        await asyncio.sleep(0)
        return done

    task = asyncio.ensure_future(handler())
    await asyncio.sleep(0)
    result.set_result("done")  # wakes the handler first…
    disconnected.set_result(None)  # …then the signal's callback runs
    assert await task == "done"
