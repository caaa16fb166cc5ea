"""Lookup over HTTP, for an `http://` or `https://` service URL, as the official client does it:
the owner of a topic from `/lookup/v2/topic/...`, partitions from the admin API's
`.../partitions`, a namespace's topics from `/admin/v2/namespaces/.../topics`. Produce and consume
then go over the binary protocol to the broker the lookup names.
"""
from __future__ import annotations

import asyncio
import base64
import json
import ssl
import urllib.parse
from typing import Any

from ..errors import (AuthenticationError, ConnectError, InvalidTopicNameError, PulsarWireError, ServerError,
                      TimeoutError, TopicNotFoundError)

MAX_RESPONSE_BYTES = 16 * 1024 * 1024  # a namespace's topic list is the largest answer


class HttpLookup:
    def __init__(self, service_url: str, authentication: Any, timeout: float,
                 ssl_context: ssl.SSLContext | None) -> None:
        self.base = service_url.rstrip("/")
        self.authentication = authentication
        self.timeout = timeout
        self.ssl_context = ssl_context

    def _headers(self) -> dict[str, str]:
        auth = self.authentication
        method = getattr(auth, "method_name", None)
        if method == "token":
            return {"Authorization": f"Bearer {auth.auth_data().decode()}"}
        if method == "basic":
            return {"Authorization": f"Basic {base64.b64encode(auth.auth_data()).decode()}"}
        return {}

    async def get(self, path: str) -> Any:
        """GET `path` (JSON); typed errors for what the server or the network answered."""
        import aiohttp  # only clients given an http:// service URL need it

        url = self.base + path
        try:
            timeout = aiohttp.ClientTimeout(total=self.timeout)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                async with session.get(url, headers=self._headers(), ssl=self.ssl_context or True) as response:
                    body = await response.content.read(MAX_RESPONSE_BYTES + 1)
                    status = response.status
        except asyncio.TimeoutError:
            raise TimeoutError(f"no answer from {url} within {self.timeout}s") from None
        except aiohttp.ClientError as exc:
            raise ConnectError(f"HTTP lookup at {url} failed: {exc}") from exc
        except OSError as exc:
            raise ConnectError(f"HTTP lookup at {url} failed: {exc}") from exc
        if len(body) > MAX_RESPONSE_BYTES:
            raise ServerError(f"{url}: the answer is over {MAX_RESPONSE_BYTES} bytes")
        if status != 200:
            try:
                reason = json.loads(body).get("reason", "")
            except (ValueError, AttributeError):
                reason = body[:200].decode("utf-8", "replace")
            # credentials refused (401): ConnectError, as the official client answers its lookup
            errors: dict[int, type[PulsarWireError]] = {401: ConnectError, 403: AuthenticationError,
                                                         404: TopicNotFoundError, 412: InvalidTopicNameError}
            error = errors.get(status, ServerError)
            raise error(f"HTTP {status} from {url}: {reason}")
        try:
            return json.loads(body)
        except ValueError:
            raise ServerError(f"{url} answered something other than JSON") from None

    @staticmethod
    def _path(topic: str) -> str:
        """`persistent/tenant/namespace/topic` of a full topic name, each part URL-quoted."""
        domain, _, rest = topic.partition("://")
        return "/".join([domain] + [urllib.parse.quote(part, safe="") for part in rest.split("/")])

    async def broker_url(self, topic: str, tls: bool) -> str:
        data = await self.get(f"/lookup/v2/topic/{self._path(topic)}")
        url = (data.get("brokerUrlTls") if tls else None) or data.get("brokerUrl")
        if not url:
            raise ServerError(f"the lookup of {topic} named no broker")
        return url

    async def partitions(self, topic: str) -> int:
        data = await self.get(f"/admin/v2/{self._path(topic)}/partitions?checkAllowAutoCreation=true")
        return int(data.get("partitions", 0))

    async def namespace_topics(self, namespace: str, mode: str) -> list[str]:
        tenant, _, name = namespace.partition("/")
        data = await self.get(f"/admin/v2/namespaces/{urllib.parse.quote(tenant, safe='')}/"
                              f"{urllib.parse.quote(name, safe='')}/topics?mode={mode}")
        return [str(topic) for topic in data]
