"""common/metrics.py: figures of a batch split over 2 forced CPU devices equal those of one device
holding the whole batch."""

import jax.numpy as jnp
import numpy as np
import pytest

from common import devices
from common.metrics import residual_metrics


def numpy_metrics(residual, targets):
    residual, targets = (
        np.asarray(residual, np.float64).ravel(),
        np.asarray(targets, np.float64).ravel(),
    )
    return {
        "value/advantage_mean": residual.mean(),
        "value/advantage_norm": np.sqrt(np.sum(residual**2)),
        "value/explained_variance": 1.0 - residual.var() / (targets.var() + 1e-8),
    }


@pytest.mark.parametrize("offset", [0.0, 100.0])
def test_residual_metrics_on_two_devices_are_those_of_the_whole_batch_on_one(offset):
    """Devices whose batches differ in mean: the spread between them counts in the variances."""
    rng = np.random.default_rng(0)
    shift = np.array([-1.0, 2.0])[:, None, None, None]  # [devices, seeds, T, B]
    targets = (offset + shift + rng.normal(size=(2, 3, 16, 4))).astype(np.float32)
    residual = (0.5 * shift + 0.3 * rng.normal(size=(2, 3, 16, 4))).astype(np.float32)
    fn = lambda data: residual_metrics(*data)  # noqa: E731  (map_epoch maps its first argument)
    on_two = devices.map_epoch(fn, 2, donate=False)((jnp.asarray(residual), jnp.asarray(targets)))
    whole = lambda x: jnp.asarray(np.concatenate([x[0], x[1]], 1)[None])  # noqa: E731  [1, seeds, 2T, B]
    on_one = devices.map_epoch(fn, 1, donate=False)((whole(residual), whole(targets)))
    for name, value in on_two.items():
        value = np.asarray(value)
        np.testing.assert_array_equal(value[0], value[1])  # every device holds the same figures
        for seed in range(3):
            expected = numpy_metrics(residual[:, seed], targets[:, seed])[name]
            np.testing.assert_allclose(value[:, seed], expected, rtol=1e-5, atol=1e-5, err_msg=name)
            np.testing.assert_allclose(
                on_one[name][0, seed], expected, rtol=1e-5, atol=1e-5, err_msg=name
            )
    # what averaging each device's own figures would give differs from the whole batch's
    per_device = [numpy_metrics(residual[d, 0], targets[d, 0]) for d in range(2)]
    for name in ("value/advantage_norm", "value/explained_variance"):
        assert abs(np.mean([m[name] for m in per_device]) - on_two[name][0, 0]) > 0.05, name
