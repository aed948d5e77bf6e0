"""slime's import path for the data sources (`--data-source-path
slime.rollout.data_source.RolloutDataSourceWithBuffer`, the default; a custom source subclasses
`DataSource`). They live in `slime.data.data_source`, beside the prompt loading they build on."""

from slime.data.data_source import DataSource, RolloutDataSource, RolloutDataSourceWithBuffer, pop_first

__all__ = ["DataSource", "RolloutDataSource", "RolloutDataSourceWithBuffer", "pop_first"]
