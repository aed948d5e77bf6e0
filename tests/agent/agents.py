"""Agents for tests/agent/test_generate_hook.py: plain `openai` SDK code, as a user writes it."""

from __future__ import annotations

import openai

from tests.agent.conftest import ENGINE_KEY

SEEN: list[tuple[str, str]] = []  # (base_url, api_key) of every call


async def two_turns(base_url, api_key, sample):
    SEEN.append((base_url, api_key))
    assert api_key != ENGINE_KEY
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        messages = [{"role": "user", "content": sample.prompt}]
        for follow_up in ("go on", None):
            r = await client.chat.completions.create(model="policy", messages=messages)
            messages.append(r.choices[0].message.model_dump(exclude_none=True))
            if follow_up:
                messages.append({"role": "user", "content": follow_up})
    return 0.75


async def grade_later(base_url, api_key, sample):
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": sample.prompt}])


async def never_calls(base_url, api_key, sample):
    return 1.0


async def until_refused(base_url, api_key, sample):
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        while True:  # the adapter's turn cap (--max-turns) ends it with a 429 the agent does not catch
            await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
