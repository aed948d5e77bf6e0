"""Training agents written against the OpenAI or Anthropic API (slime's `slime.agent`).

* `slime.agent.adapters`: `OpenAIAdapter`, `AnthropicAdapter` (aiohttp apps speaking the APIs,
  generating by token ids on the engines, recording each session's turns);
* `slime.agent.trajectory`: `TrajectoryManager` (a session's turns -> `Sample`s);
* `slime.agent.aiohttp_threaded`: `run_app_in_thread` (serve an adapter beside the rollout);
* `slime.agent.generate`: a ready `--custom-generate-function-path` hook that runs the user's
  `--agent-function-path` agent against an adapter.
"""
