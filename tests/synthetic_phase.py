"""The learner state a synthetic learning phase needs to go through ``split_update_noise``:
parameters, a key, and an optimizer state (empty, or a hand-made Adam state)."""
from typing import Any

import jax
from flax import struct


@struct.dataclass
class State:
    params: jax.Array
    key: jax.Array
    opt_state: Any = ()
