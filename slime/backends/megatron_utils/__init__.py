"""slime's `slime.backends.megatron_utils` import path, for hook and example code that imports
from it. Only what makes sense without Megatron is here: `cp_utils`, whose functions are the
identities they are at context-parallel size 1 (the only size this backend trains with)."""
