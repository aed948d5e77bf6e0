"""slime's `slime.utils.external_utils`: helpers of slime's launch scripts (command_utils,
typer_utils), not of the framework itself."""
