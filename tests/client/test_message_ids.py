"""MessageId's fast constructor (a receipt per message sent): the same value, hash, order,
immutability and pickling as the dataclass's own; and receipts nobody can read are not made."""
from __future__ import annotations

import asyncio
import dataclasses
import pickle
import sys

import pytest

from pulsarwire.client import Client, InitialPosition
from pulsarwire.client import producer as producer_module
from pulsarwire.messages import MessageId, make_message_id

from ..conftest import unique
from ..peers import BrokerThread


@pytest.mark.parametrize("fields", [(1, 2), (1, 2, 3, 4, 10, "persistent://public/default/t"), (-1, -1, -1, -1, 0, None)])
def test_make_message_id_is_the_dataclass_value(fields):
    made, built = make_message_id(*fields), MessageId(*fields)
    assert made == built and hash(made) == hash(built)
    assert repr(made) == repr(built) and str(made) == str(built)
    assert dataclasses.astuple(made) == dataclasses.astuple(built)
    assert pickle.loads(pickle.dumps(made)) == built
    assert not made < built and made <= built
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.ledger_id = 7  # type: ignore[misc]


# --- receipts nobody can read are not made ---------------------------------------------------

@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    thread = BrokerThread(tmp_path_factory.mktemp("receipts"), v1_port=None).start()
    yield thread
    thread.stop()


@pytest.mark.parametrize("batching", [True, False])
def test_every_receipt_someone_can_read_is_answered(broker, batching, monkeypatch):
    """A send_async future that its caller dropped, with no callback, gets no MessageId (nobody
    could read it); one that is held, awaited by a task, gathered or has a callback gets its own."""
    made = []
    real = producer_module.make_message_id

    def counting(*args):
        made.append(args)
        return real(*args)
    monkeypatch.setattr(producer_module, "make_message_id", counting)

    async def scenario():
        async with Client(broker.url) as client:
            producer = await client.create_producer(unique("receipts"), batching_enabled=batching,
                                                    batching_max_publish_delay_ms=50)
            held = await producer.send_async(b"held")
            called = []
            (await producer.send_async(b"callback")).add_done_callback(lambda f: called.append(f.result()))
            await producer.send_async(b"dropped")

            async def wait_for(future):
                return await future
            task = asyncio.ensure_future(wait_for(await producer.send_async(b"awaited")))
            for _ in range(3):
                await producer.send_async(b"dropped")
            gathered = asyncio.gather(await producer.send_async(b"gathered"))
            # receipts come in order: once the last is in, every one is (flush() would gather,
            # so observe, those still pending)
            (in_gather,) = await gathered
            by_task = await task
            await asyncio.sleep(0)  # the done callback runs on the loop's next turn
            ids = [held.result(), called[0], by_task, in_gather]
            assert all(isinstance(mid, MessageId) for mid in ids)
            assert len(set(ids)) == 4
            if batching:
                assert [mid.batch_index for mid in ids] == [0, 1, 3, 7]
            # the four dropped ones made none (a dropped future held nowhere else: nothing to read)
            if sys.implementation.name == "cpython":
                assert len(made) == 4
            await producer.flush()
            # what was sent is all there, dropped futures or not
            consumer = await client.subscribe(producer.topic(), "s", initial_position=InitialPosition.Earliest)
            got = [(await consumer.receive()).data() for _ in range(8)]
            assert got == [b"held", b"callback", b"dropped", b"awaited", b"dropped", b"dropped", b"dropped",
                           b"gathered"]
    asyncio.run(asyncio.wait_for(scenario(), 30))

