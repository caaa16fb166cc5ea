"""The broker's own accepting socket (listener.py): what asyncio's create_server would set on a
connection is set here too."""
from __future__ import annotations

import asyncio
import socket

from pulsarwire.broker.listener import DescriptorReserve, Listener


def test_accepted_connections_send_without_nagle():
    """asyncio turns Nagle off only for sockets whose proto says TCP, and socket.create_server's
    say 0: without this, the 3rd to 8th of eight answers written in a row waited 40 ms for the
    client's delayed ACK (the close of an 8-partition producer)."""
    async def main():
        accepted: asyncio.Future[asyncio.Transport] = asyncio.get_running_loop().create_future()

        class Keep(asyncio.Protocol):
            def connection_made(self, transport):
                accepted.set_result(transport)
        reserve = DescriptorReserve()
        listener = Listener(Keep, "127.0.0.1", 0, reserve=reserve)
        port = listener.sockets[0].getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        try:
            transport = await asyncio.wait_for(accepted, 5)
            sock = transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            transport.close()
        finally:
            client.close()
            listener.close()
            await listener.wait_closed()
            reserve.close()
    asyncio.run(main())
