"""Figures of a batch split over devices, as if one device held all of it.

Inside `devices.map_epoch` every device holds its share of the epoch's
batch. A mean over the batch is the mean of the devices' means (the shares are
the same size), but a norm or a variance is not: the mean of per-device norms is
off by sqrt(n_devices), and the mean of per-device variances misses the spread
between devices. These functions sum over `DEVICE_AXIS` (`lax.psum`) instead.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from common.devices import DEVICE_AXIS


def residual_metrics(residual: jax.Array, targets: jax.Array, axis_name: str = DEVICE_AXIS) -> dict:
    """`value/*` of every device's batch together, the same on every device.

    `residual` is `R - V` and `targets` is `R`, any shape, one entry per
    transition: `advantage_mean = mean(R - V)`, `advantage_norm = ||R - V||_2 =
    sqrt(sum (R - V)^2)`, `explained_variance = 1 - var(R - V) / var(R)`. The
    variances sum squares about the mean of every device (two passes, which
    keeps float32 exact enough when |mean| >> std).
    """
    chex.assert_equal_shape([residual, targets])
    n = jax.lax.psum(jnp.float32(residual.size), axis_name)
    mean_residual, mean_target = (
        jax.lax.psum(jnp.stack([jnp.sum(residual), jnp.sum(targets)]), axis_name) / n
    )
    squares, residual_var, target_var = jax.lax.psum(
        jnp.stack(
            [
                jnp.sum(residual**2),
                jnp.sum((residual - mean_residual) ** 2),
                jnp.sum((targets - mean_target) ** 2),
            ]
        ),
        axis_name,
    ) / jnp.array([1.0, n, n])
    return {
        "value/advantage_mean": mean_residual,
        "value/advantage_norm": jnp.sqrt(squares),
        "value/explained_variance": 1.0 - residual_var / (target_var + 1e-8),
    }
