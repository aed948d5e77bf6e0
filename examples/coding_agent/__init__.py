"""A coding agent: the model runs Python in a sandbox during generation; rewards come from tests."""
