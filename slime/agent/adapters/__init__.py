"""HTTP adapters that put the OpenAI or Anthropic API in front of the engines and record every
turn's exact tokens per session (slime's `slime.agent.adapters`)."""

from slime.agent.adapters.anthropic import AnthropicAdapter
from slime.agent.adapters.common import BaseAdapter
from slime.agent.adapters.openai import OpenAIAdapter

__all__ = ["AnthropicAdapter", "BaseAdapter", "OpenAIAdapter"]
