"""slime's Megatron backend (`--train-backend megatron`) on megatron-core, at slime's import path
`slime.backends.megatron_utils`: the model from an HF config (`model_provider`), HF <-> Megatron
weights (`hf_weights`), parallel groups (`initialize`), a step through Megatron's schedule
(`model`), the training rank (`actor`), the CPU substitutes (`cpu_support`) and `cp_utils`, whose
functions are the identities they are at context-parallel size 1 (the only size it trains with).
megatron-core is imported inside functions: importing this package does not need it."""
