"""Synchronous client for control calls to one engine server (built-in or SGLang).

Rollout traffic goes through the async `slime.utils.http_utils.post`; this client is for the
trainer/driver side: health, weight updates, memory release, pause/continue.
"""

from __future__ import annotations

import base64
from typing import Any

import httpx
from safetensors.torch import save

from slime.utils.api_keys import is_admin_path, key_for
from slime.utils.http_utils import EngineRequestFailed, EngineTimeout, EngineUnreachable, _error_message

DEFAULT_TIMEOUT_S = 600.0  # one call's limit unless the client is given one (set_default_timeout)
CONNECT_TIMEOUT_S = 10.0


def set_default_timeout(seconds: float) -> None:
    """This process's limit on one control call (the run's --engine-control-timeout-secs)."""
    global DEFAULT_TIMEOUT_S
    DEFAULT_TIMEOUT_S = float(seconds)
    for c in list(_clients.values()):
        c.close()
    _clients.clear()


def serialize_named_tensors(named_tensors: dict) -> str:
    """{name: tensor} -> base64 of safetensors bytes (the built-in engine's wire format)."""
    tensors = {n: t.detach().to("cpu").contiguous() for n, t in named_tensors.items()}
    return base64.b64encode(save(tensors)).decode("ascii")


class EngineClient:
    """Calls carry `api_key` (`admin_api_key` on weight and control endpoints when given); without
    either, the keys registered for this server's address (`slime.utils.api_keys.register`)."""

    def __init__(
        self, url: str, timeout: float | None = None, *, api_key: str | None = None, admin_api_key: str | None = None
    ):
        self.url = url.rstrip("/")
        # never unbounded: a hung engine must not hang its caller (--engine-control-timeout-secs)
        self._client = httpx.Client(
            timeout=httpx.Timeout(timeout or DEFAULT_TIMEOUT_S, connect=CONNECT_TIMEOUT_S), trust_env=False
        )
        self._keys = (api_key, admin_api_key)

    def _auth(self, path: str) -> dict[str, str] | None:
        api_key, admin = self._keys
        if api_key is None and admin is None:
            key = key_for(self.url, path)
        else:
            key = admin if admin is not None and is_admin_path(path) else api_key
        return {"Authorization": f"Bearer {key}"} if key else None

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ plumbing
    def _call(self, method: str, path: str, payload: Any = None, timeout: float | None = None) -> Any:
        url = self.url + path
        try:
            if method == "GET":
                resp = self._client.get(url, timeout=timeout or self._client.timeout, headers=self._auth(path))
            else:
                resp = self._client.post(
                    url,
                    json=payload if payload is not None else {},
                    timeout=timeout or self._client.timeout,
                    headers=self._auth(path),
                )
        except httpx.TimeoutException as e:
            raise EngineTimeout(f"{method} {url} failed: {type(e).__name__}: {e}", None, url) from e
        except httpx.HTTPError as e:
            raise EngineUnreachable(f"{method} {url} failed: {type(e).__name__}: {e}", None, url) from e
        if resp.status_code >= 400:
            raise EngineRequestFailed(
                f"{method} {url}: HTTP {resp.status_code}: {_error_message(resp.status_code, resp.text)}",
                resp.status_code,
                url,
            )
        if not resp.content:
            return {}
        try:
            return resp.json()
        except ValueError:
            return resp.text

    # ------------------------------------------------------------------ calls
    def health(self, timeout: float = 5.0) -> bool:
        try:
            return self._client.get(self.url + "/health", timeout=timeout).status_code == 200
        except httpx.HTTPError:
            return False

    def generate(self, payload: dict) -> Any:
        return self._call("POST", "/generate", payload)

    def flush_cache(self) -> Any:
        return self._call("POST", "/flush_cache")

    def get_model_info(self) -> dict:
        return self._call("GET", "/get_model_info", timeout=10.0)

    def get_weight_version(self) -> str | None:
        return self._call("GET", "/get_weight_version").get("weight_version")

    def get_server_info(self) -> dict:
        return self._call("GET", "/get_server_info", timeout=10.0)

    def get_load(self) -> dict:
        return self._call("GET", "/get_load", timeout=10.0)

    def update_weights_from_tensor(
        self, named_tensors: dict, weight_version: str | None = None, flush_cache: bool = True
    ) -> dict:
        payload: dict[str, Any] = {
            "serialized_named_tensors": [serialize_named_tensors(named_tensors)],
            "flush_cache": flush_cache,
        }
        if weight_version is not None:
            payload["weight_version"] = weight_version
        return self._call("POST", "/update_weights_from_tensor", payload)

    def update_weights_from_disk(self, path: str, weight_version: str | None = None, lora: dict | None = None) -> dict:
        payload: dict[str, Any] = {"model_path": str(path)}
        if weight_version is not None:
            payload["weight_version"] = weight_version
        if lora is not None:  # the directory holds a LoRA adapter (slime.engine.lora_weights); not SGLang's
            payload["lora"] = lora
        return self._call("POST", "/update_weights_from_disk", payload)

    def init_weights_update_group(
        self,
        *,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str = "weight_update_group",
        backend: str = "gloo",
    ) -> dict:
        return self._call(
            "POST",
            "/init_weights_update_group",
            {
                "master_address": master_address,
                "master_port": master_port,
                "rank_offset": rank_offset,
                "world_size": world_size,
                "group_name": group_name,
                "backend": backend,
            },
        )

    def update_weights_from_distributed(
        self,
        *,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        group_name: str = "weight_update_group",
        flush_cache: bool = True,
        weight_version: str | None = None,
        lora: dict | None = None,
    ) -> dict:
        payload: dict[str, Any] = {
            "names": names,
            "dtypes": dtypes,
            "shapes": shapes,
            "group_name": group_name,
            "flush_cache": flush_cache,
        }
        if weight_version is not None:
            payload["weight_version"] = weight_version
        if lora is not None:  # a LoRA adapter (slime.engine.lora_weights); not SGLang's
            payload["lora"] = lora
        return self._call("POST", "/update_weights_from_distributed", payload)

    def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> dict:
        return self._call("POST", "/destroy_weights_update_group", {"group_name": group_name}, timeout=10.0)

    def release_memory_occupation(self, tags: list[str] | None = None) -> dict:
        return self._call("POST", "/release_memory_occupation", {"tags": tags} if tags else {})

    def resume_memory_occupation(self, tags: list[str] | None = None) -> dict:
        return self._call("POST", "/resume_memory_occupation", {"tags": tags} if tags else {})

    def pause_generation(self, mode: str = "abort") -> dict:
        return self._call("POST", "/pause_generation", {"mode": mode})

    def continue_generation(self) -> dict:
        return self._call("POST", "/continue_generation")

    def abort_all(self) -> dict:
        return self._call("POST", "/abort_request", {"abort_all": True})

    def abort(self, rid: str | list[str]) -> dict:
        return self._call("POST", "/abort_request", {"rid": rid})


_clients: dict[str, EngineClient] = {}


def client_for(url: str) -> EngineClient:
    """One long-lived client per engine URL in this process (an httpx.Client costs ~10 ms to build)."""
    if url not in _clients:
        _clients[url] = EngineClient(url)
    return _clients[url]
