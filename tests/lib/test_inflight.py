"""chat/lib/single_flight.py: callers that arrive while a key's work runs share it."""

import asyncio

from chat.lib import single_flight


async def test_callers_of_one_key_share_its_work_and_one_leaving_does_not_cancel_it():
    calls, started, release = [], asyncio.Event(), asyncio.Event()

    async def work():
        calls.append(1)
        started.set()
        await release.wait()
        return "done"

    waiting = [asyncio.ensure_future(single_flight.shared("k", work)) for _ in range(5)]
    other = asyncio.ensure_future(single_flight.shared("other", work))  # another key: work of its own
    await started.wait()  # the callers ran before the work did
    waiting[0].cancel()
    release.set()
    assert await asyncio.gather(*waiting[1:], other) == ["done"] * 5
    assert len(calls) == 2
    assert await single_flight.shared("k", work) == "done" and len(calls) == 3  # done: the next call works anew
