"""`remote_rm`: the reward comes from an HTTP service at `--rm-url` (slime's protocol).

The request is `POST {"prompt", "response", "label"}` (JSON); the answer must be JSON: a number,
or an object (a dict reward; `--reward-key` picks the trained value, "score" by default). Each
attempt has a `--rm-timeout` limit; a connection error, a timeout, a 5xx, or an answer that is not
a usable reward (not JSON, not a finite number, a dict without the reward key) is retried up to
`--rm-max-retries` attempts in all with exponential back-off (`--rm-retry-interval` × 2^attempt,
at most 30 s). A 4xx is not retried. When the attempts are spent, `RemoteRewardError` is raised
and the rollout marks that sample FAILED with the reason — never a silent 0.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
from typing import Any

import aiohttp

from slime.errors import SlimeError

logger = logging.getLogger(__name__)


class RemoteRewardError(SlimeError):
    """The reward service could not give a usable reward for a sample."""


class _Garbage(ValueError):
    pass


def _check_reward(body: Any, reward_key: str | None) -> float | dict:
    if isinstance(body, bool) or body is None:
        raise _Garbage(f"answer {body!r} is not a reward")
    if isinstance(body, (int, float)):
        if not math.isfinite(body):
            raise _Garbage(f"answer {body!r} is not a finite number")
        return body
    if isinstance(body, dict):
        key = reward_key or "score"
        value = body.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise _Garbage(f"answer has no finite number at key {key!r}: {json.dumps(body)[:200]}")
        return body
    raise _Garbage(f"answer is not a number or an object: {json.dumps(body)[:200]}")


async def remote_rm(args: Any, sample: Any) -> float | dict:
    url = args.rm_url
    if not url:
        raise SlimeError("--rm-type remote_rm needs --rm-url (the reward service's address)")
    attempts = args.rm_max_retries
    interval = args.rm_retry_interval
    timeout = aiohttp.ClientTimeout(total=float(args.rm_timeout))
    payload = {"prompt": sample.prompt, "response": sample.response, "label": sample.label}
    last = "no attempt"
    async with aiohttp.ClientSession(timeout=timeout, trust_env=False) as session:
        for attempt in range(attempts):
            try:
                async with session.post(url, json=payload) as resp:
                    text = await resp.text()
                    if 400 <= resp.status < 500:
                        raise RemoteRewardError(f"remote_rm {url}: HTTP {resp.status}: {text.strip()[:300]}")
                    if resp.status >= 500:
                        raise _Garbage(f"HTTP {resp.status}: {text.strip()[:200]}")
                    try:
                        body = json.loads(text)
                    except ValueError:
                        raise _Garbage(f"answer is not JSON: {text.strip()[:200]!r}") from None
                    return _check_reward(body, args.reward_key)
            except RemoteRewardError:
                raise
            except TimeoutError:
                last = f"no answer within --rm-timeout {timeout.total:g}s"
            except (aiohttp.ClientError, OSError, _Garbage) as e:
                last = f"{type(e).__name__}: {e}" if not isinstance(e, _Garbage) else str(e)
            if attempt + 1 < attempts:
                delay = min(interval * 2**attempt, 30.0) * (1 + 0.1 * random.random())
                logger.info("remote_rm %s: %s; retry %d/%d in %.2fs", url, last, attempt + 1, attempts - 1, delay)
                await asyncio.sleep(delay)
    raise RemoteRewardError(f"remote_rm {url}: failed after {attempts} attempts; last: {last}")
