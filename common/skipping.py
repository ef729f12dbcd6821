"""The layer-skipping block (Trax `SkippingSerial`): LayerDrop over a stack of layers.

In train mode one number is drawn per call (per gradient step), for the whole
batch:

    warmup    = max(0, (warmup_steps - step) / warmup_steps)   # 1 -> 0 over warmup_steps
    n_forward ~ U(warmup * n_layers, n_layers / skip_fraction)

and layer i runs iff i < n_forward; otherwise it is the identity. The skipped
layers are always a run of final layers, never one in the middle. After the
warmup, layer i runs with probability min(1, 1 - i * skip_fraction / n_layers);
at step 0 every layer runs. In eval mode every layer runs, or the first
`eval_depth` (depth pruning at inference). `skip_fraction = 0` never skips.

Skipping saves compute only if the `lax.cond` predicate is unbatched: under
`vmap` a batched predicate turns the cond into a select that runs both
branches. So the draw is ONE number for every vmapped copy (the seeds of a
run): `first_copy` keeps the first copy's value and drops the batch axis, and
every copy runs the same layers.
Under `pmap` each device draws for itself: give it a key that is the same on
every device (not folded with the device index), and every device runs the
same depth.
"""

from __future__ import annotations

from typing import Callable, Literal, Sequence

import jax
import jax.numpy as jnp

Mode = Literal["train", "eval"]


@jax.custom_batching.custom_vmap
def first_copy(x: jax.Array) -> jax.Array:
    """The identity; under `vmap`, the first mapped copy of `x`, unbatched."""
    return x


@first_copy.def_vmap
def _first_copy_rule(axis_size, in_batched, x):
    del axis_size, in_batched
    return first_copy(x[0]), False  # nested vmaps: each level drops its own axis


def warmup_factor(step, warmup_steps: int):
    """1 at step 0, falling linearly to 0 at `warmup_steps` and after (0 when there is no
    warmup)."""
    if warmup_steps == 0:
        return jnp.float32(0.0)
    return jnp.maximum(0.0, (warmup_steps - jnp.asarray(step, jnp.float32)) / warmup_steps)


def steps_without_skipping(n_layers: int, warmup_steps: int) -> int:
    """Steps at the start in which every layer runs, whatever skip_fraction: `step < warmup_steps /
    n_layers` gives `low = warmup * n_layers > n_layers - 1`, so even the last layer runs."""
    return -(-warmup_steps // n_layers)  # ceil


def n_forward_layers(
    step, rng, n_layers: int, mode: Mode, skip_fraction: float, warmup_steps: int, eval_depth=None
):
    """Layers `i < n_forward` run. A Python int when it is known when tracing, else a scalar
    that is the same for every vmapped copy."""
    if mode not in ("train", "eval"):
        raise ValueError(f"mode {mode!r}: use 'train' or 'eval'")
    if not 0.0 <= skip_fraction < 1.0:
        raise ValueError(f"skip_fraction {skip_fraction}: use a value in [0, 1)")
    if mode == "eval":
        if isinstance(eval_depth, int) and not 1 <= eval_depth <= n_layers:
            raise ValueError(f"eval_depth {eval_depth}: use 1 to {n_layers} (or None: every layer)")
        return n_layers if eval_depth is None else eval_depth
    if skip_fraction == 0.0:
        return n_layers
    low = warmup_factor(step, warmup_steps) * n_layers
    high = n_layers / skip_fraction
    return first_copy(jax.random.uniform(rng, (), jnp.float32, low, high))


def layers_run(n_forward, n_layers: int) -> jax.Array:
    """How many layers run for `n_forward`: #{i < n_layers : i < n_forward}."""
    return jnp.sum(jnp.arange(n_layers) < n_forward)


def skipping_serial(
    layers: Sequence[Callable],
    params: Sequence,
    x,
    step,
    rng,
    mode: Mode,
    skip_fraction: float,
    warmup_steps: int,
    eval_depth=None,
):
    """Runs `layers[i](params[i], x) -> x` in order, skipping final ones; returns `(x, step + 1)`.

    `step` counts calls in train mode (it drives the warmup); `rng` is used only
    in train mode. `eval_depth` (eval mode): run only the first `eval_depth`
    layers, a Python int (the others are left out of the program) or a traced
    scalar (each further layer behind a `lax.cond`).
    """
    if len(layers) != len(params):
        raise ValueError(f"{len(layers)} layers but {len(params)} parameter sets")
    n_forward = n_forward_layers(
        step, rng, len(layers), mode, skip_fraction, warmup_steps, eval_depth
    )
    for i, (layer, p) in enumerate(zip(layers, params)):
        if isinstance(n_forward, int):
            x = layer(p, x) if i < n_forward else x
        else:  # an unbatched predicate: the skipped branch does not run
            x = jax.lax.cond(i < n_forward, layer, lambda p, x: x, p, x)
    return x, step + 1
