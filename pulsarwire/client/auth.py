"""Authentication providers beyond tokens: Basic, TLS client certificates and OAuth2 client
credentials. Each has `method_name` and `auth_data()` (what CONNECT carries); TLS adds the
client certificate to the TLS handshake, OAuth2 fetches its token before connecting."""
from __future__ import annotations

import asyncio
import base64
import json
import time
import urllib.parse

from ..errors import AuthenticationError, PulsarWireError


class AuthenticationBasic:
    """Username and password (auth method "basic"; the data is `username:password`)."""

    def __init__(self, username: str | None = None, password: str | None = None, method: str = "basic",
                 auth_params_string: str | None = None) -> None:
        if auth_params_string is not None:
            params = json.loads(auth_params_string)
            username, password = params.get("username"), params.get("password")
            method = params.get("method", "basic")
        if not isinstance(username, str) or not isinstance(password, str):
            raise ValueError("AuthenticationBasic needs a username and a password")
        if ":" in username:
            raise ValueError("a basic auth username cannot contain ':'")
        self._username = username
        self._password = password
        self.method_name = method

    def auth_data(self) -> bytes:
        return f"{self._username}:{self._password}".encode()


class AuthenticationTLS:
    """A client certificate presented in the TLS handshake (auth method "tls"); needs a
    pulsar+ssl:// service URL."""

    method_name = "tls"

    def __init__(self, certificate_path: str, private_key_path: str) -> None:
        self.tls_certificate = (certificate_path, private_key_path)

    def auth_data(self) -> bytes:
        return b""  # the proof is the certificate the broker verified


class AuthenticationOauth2:
    """OAuth2 client credentials: a token from the issuer's token endpoint (found through
    `<issuer_url>/.well-known/openid-configuration`), sent as auth method "token" and fetched
    again before it expires. Takes keywords, or the official client's JSON parameters string
    (`issuer_url`, `private_key` naming a JSON file or data: URL with client_id and
    client_secret, `audience`, `scope`)."""

    method_name = "token"
    _REFRESH_MARGIN = 0.8  # fetch a new token after 80% of its lifetime

    def __init__(self, issuer_url: str, client_id: str | None = None, client_secret: str | None = None,
                 audience: str | None = None, scope: str | None = None, *, timeout_seconds: float = 10) -> None:
        if issuer_url.lstrip().startswith("{"):
            params = json.loads(issuer_url)
            issuer_url = params["issuer_url"]
            audience, scope = params.get("audience", audience), params.get("scope", scope)
            if params.get("private_key"):
                credentials = _read_credentials(params["private_key"])
                client_id, client_secret = credentials.get("client_id"), credentials.get("client_secret")
            else:
                client_id, client_secret = params.get("client_id"), params.get("client_secret")
        if not issuer_url or not client_id or not client_secret:
            raise ValueError("AuthenticationOauth2 needs issuer_url, client_id and client_secret")
        self.issuer_url = issuer_url.rstrip("/")
        self.client_id = client_id
        self._client_secret = client_secret
        self.audience = audience
        self.scope = scope
        self._timeout = timeout_seconds
        self._token: str | None = None
        self._refresh_at = 0.0
        self._fetching: asyncio.Future | None = None

    def auth_data(self) -> bytes:
        if self._token is None:
            raise AuthenticationError("no OAuth2 token yet (the client fetches one before connecting)")
        return self._token.encode()

    async def prepare(self) -> None:
        """Fetch a token unless the one held is still fresh (called before each connection)."""
        if self._token is not None and time.monotonic() < self._refresh_at:
            return
        if self._fetching is None or self._fetching.done():
            self._fetching = asyncio.get_running_loop().run_in_executor(None, self._fetch)
        token, lifetime = await asyncio.shield(self._fetching)
        self._token = token
        self._refresh_at = time.monotonic() + lifetime * self._REFRESH_MARGIN

    def _fetch(self) -> tuple[str, float]:
        discovery = self._get_json(f"{self.issuer_url}/.well-known/openid-configuration")
        endpoint = discovery.get("token_endpoint")
        if not endpoint:
            raise AuthenticationError(f"{self.issuer_url} names no token_endpoint")
        form = {"grant_type": "client_credentials", "client_id": self.client_id,
                "client_secret": self._client_secret}
        if self.audience:
            form["audience"] = self.audience
        if self.scope:
            form["scope"] = self.scope
        answer = self._get_json(endpoint, urllib.parse.urlencode(form).encode())
        token = answer.get("access_token")
        if not token:
            raise AuthenticationError(f"token endpoint {endpoint} gave no access_token")
        return token, float(answer.get("expires_in") or 3600)

    def _get_json(self, url: str, body: bytes | None = None) -> dict:
        import urllib.error  # here, not at the top: only OAuth 2 needs them (8 ms of every import otherwise)
        import urllib.request
        request = urllib.request.Request(url, data=body, headers={"Accept": "application/json"})
        if body is not None:
            request.add_header("Content-Type", "application/x-www-form-urlencoded")
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if 400 <= exc.code < 500:  # refused credentials: retrying will not help
                raise AuthenticationError(f"{url} refused the client credentials: HTTP {exc.code}") from exc
            raise PulsarWireError(f"{url} failed: HTTP {exc.code}") from exc
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise PulsarWireError(f"could not get {url}: {exc}") from exc


def _read_credentials(location: str) -> dict:
    """client_id and client_secret from a file path, a file: URL or a data: URL."""
    if location.startswith("data:"):
        header, _, payload = location.partition(",")
        raw = base64.b64decode(payload) if header.endswith(";base64") else urllib.parse.unquote(payload).encode()
        return json.loads(raw)
    if location.startswith("file://"):
        location = location[len("file://"):]
    elif location.startswith("file:"):
        location = location[len("file:"):]
    with open(location) as fh:
        return json.load(fh)
