"""The run's API keys: which key a request to one of the run's servers carries, and how a server
checks one.

Servers (engine, router, dispatcher) take SGLang's `--api-key` (every endpoint but the health
probes) and `--admin-api-key` (weight and control endpoints). A run generates one key per run and
uses it as both (`new_key`); clients find it by the server's origin (`register`), so a hook's
`post(url, payload)` carries it to the run's servers and never to any other address.
Child processes get keys through the environment (`ENV_API_KEY`), never on a command line,
which every local user can read.
"""

from __future__ import annotations

import hmac
import secrets
from urllib.parse import urlsplit

ENV_API_KEY = "SLIME_API_KEY"
ENV_ADMIN_API_KEY = "SLIME_ADMIN_API_KEY"

# Answered without a key (SGLang does the same: probes need no secret)
OPEN_PATHS = frozenset({"/health", "/health_generate"})
# Weight and control endpoints: only the admin key opens them when one is set (SGLang's
# ADMIN_OPTIONAL level); without an admin key the API key does.
ADMIN_PATHS = frozenset(
    {
        "/update_weights_from_tensor",
        "/update_weights_from_disk",
        "/update_weights_from_distributed",
        "/update_weights_from_shared_memory",
        "/pull_weights",
        "/init_weights_update_group",
        "/destroy_weights_update_group",
        "/update_weight_version",
        "/pause_generation",
        "/continue_generation",
        "/release_memory_occupation",
        "/resume_memory_occupation",
        "/abort_request",
        "/flush_cache",
    }
)

MEMBERSHIP_PATH = "/workers"  # a router's membership API: admin, as sglang-router's control plane

_keys: dict[str, tuple[str | None, str | None]] = {}  # origin -> (api key, admin key)


def new_key() -> str:
    return secrets.token_urlsafe(32)


def origin(url: str) -> str:
    """'http://127.0.0.1:30000/generate' -> 'http://127.0.0.1:30000'."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


def register(urls, api_key: str | None, admin_api_key: str | None = None) -> None:
    """Requests from this process to these servers carry these keys (no-op without keys)."""
    if api_key is None and admin_api_key is None:
        return
    for url in urls:
        _keys[origin(url)] = (api_key, admin_api_key)


def key_for(url: str, path: str | None = None) -> str | None:
    """The key a request to `url` carries: the admin key on admin paths when there is one."""
    api_key, admin = _keys.get(origin(url), (None, None))
    if path is None:
        path = urlsplit(url).path
    return admin if admin is not None and is_admin_path(path) else api_key


def is_admin_path(path: str) -> bool:
    return path in ADMIN_PATHS or path == MEMBERSHIP_PATH or path.startswith(MEMBERSHIP_PATH + "/")


def auth_headers(url: str, headers: dict[str, str] | None = None) -> dict[str, str] | None:
    """`headers` plus `Authorization: Bearer <key>` for the run's servers (a caller's own wins)."""
    key = key_for(url)
    if key is None or any(k.lower() == "authorization" for k in (headers or {})):
        return headers
    return {**(headers or {}), "Authorization": f"Bearer {key}"}


def bearer_matches(authorization: str | None, key: str) -> bool:
    """Whether an Authorization header is `Bearer <key>` (constant-time comparison)."""
    if not authorization:
        return False
    scheme, _, token = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())


def required_key(path: str, api_key: str | None, admin_api_key: str | None) -> str | None:
    """The key a request for `path` must carry (None: open), SGLang's rules: health probes are
    open; admin paths need the admin key if set, else the API key; others need the API key."""
    if path in OPEN_PATHS:
        return None
    if admin_api_key and is_admin_path(path):
        return admin_api_key
    return api_key
