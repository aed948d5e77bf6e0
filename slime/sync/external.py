"""External engines (`--rollout-external-engine-addrs`, slime's option): engine servers this run did
not launch (another environment, machine or hardware). At start-up each must answer
`/server_info` (falling back to `/get_server_info`, as slime's discovery does), else start-up
stops naming the address; they are then used for rollout (behind a router when there are
several) and updated by `--update-weight-transport` (disk, or the collective path when the
trainer can reach them)."""

from __future__ import annotations

from slime.engine.client import EngineClient
from slime.errors import SlimeError


def discover(
    urls: list[str], *, api_key: str | None = None, admin_api_key: str | None = None, timeout: float = 10.0
) -> list[dict]:
    """Each engine's server info; SlimeError naming the first address that does not answer."""
    infos = []
    for url in urls:
        client = EngineClient(url, timeout=timeout, api_key=api_key, admin_api_key=admin_api_key)
        errors = []
        info = None
        try:
            for path in ("/server_info", "/get_server_info"):
                try:
                    info = client._call("GET", path, timeout=timeout)
                    break
                except Exception as e:  # noqa: BLE001
                    errors.append(f"{path}: {e}")
        finally:
            client.close()
        if not isinstance(info, dict):
            raise SlimeError(
                f"--rollout-external-engine-addrs: the engine at {url} does not answer "
                f"({'; '.join(errors) or 'no server info'})"
            )
        infos.append(info)
    return infos
