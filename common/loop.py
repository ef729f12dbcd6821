"""The pieces of the epoch loop: epochs in chunks of one compiled call, their records, Ctrl-C and
SIGTERM between calls.

One compiled call runs up to 64 epochs (`epochs_per_call`, `chunk_epochs`),
so that the per-call dispatch and metrics transfer do not set the pace of
small epochs; `records` turns a call's metrics into one record per epoch for
`metrics.jsonl`. `StopOnInterrupt` lets the running call finish on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import signal
import threading
import warnings
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np


def epochs_per_call(steps_per_epoch: int, num_epochs: int) -> int:
    """Epochs run by one compiled call: about 64k environment steps, at most 64.

    Each call costs a dispatch and a metrics transfer (milliseconds on a CPU),
    as much as a small epoch; grouping epochs amortises it.
    """
    return int(min(num_epochs, 64, max(1, 65_536 // steps_per_epoch)))


def chunk_epochs(epoch: Callable, k: int) -> Callable:
    """`fn(state, values, n) -> (state, metrics [k, ...])` running `epoch(state, values)` n <= k
    times.

    One program serves every n: a `lax.scan` over k slots, slot i runs the epoch
    iff i < n. The predicate is the same for every device and seed (not
    batched), so `lax.cond` truly skips the unused slots. The epoch is traced
    once (a `jax.jit` inside the program: its shapes and its slot share the trace).
    """
    epoch = jax.jit(epoch)

    def run_n(state, values, n):
        shapes = jax.eval_shape(epoch, state, values)[1]

        def skip(s):
            return s, jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)

        def step(s, i):
            return jax.lax.cond(i < n, lambda s: epoch(s, values), skip, s)

        return jax.lax.scan(step, state, jnp.arange(k))

    return run_n


def records(metrics, n: int) -> list[dict]:
    """`[n_devices, num_seeds, epochs]` metrics -> one dict of floats per epoch.

    Device 0 (metrics agree across devices), mean over seeds (`episode/return`
    also seed by seed, as `episode/return_per_seed`). Seeds with no
    finished episode in an epoch (NaN `episode/*`) are left out of that mean;
    any other NaN (a diverged seed) stays NaN.
    """
    host = {k: np.asarray(v)[0, :, :n] for k, v in jax.device_get(metrics).items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # nanmean of all-NaN
        per_epoch = [
            {
                k: float(np.nanmean(v[:, j]) if k.startswith("episode/") else np.mean(v[:, j]))
                for k, v in host.items()
            }
            for j in range(n)
        ]
    if "episode/return" in host:  # each seed's too (for the spread in common.plot)
        for j, record in enumerate(per_epoch):
            record["episode/return_per_seed"] = host["episode/return"][:, j].tolist()
    return per_epoch


class StopOnInterrupt:
    """Ctrl-C (SIGINT) or SIGTERM (what SLURM and Kubernetes send before they kill a job) finishes
    the running epochs, then stops with a checkpoint; the same signal again stops at once, without
    saving.

    (Epochs interrupted half-way would leave the donated runner state deleted.) `exit_code` is the
    shell's for the signal that stopped the run: 130 for SIGINT, 143 for SIGTERM.
    """

    SIGNALS = {signal.SIGINT: ("Ctrl-C", 130), signal.SIGTERM: ("SIGTERM", 143)}
    requested = False
    exit_code = 0

    def __enter__(self):
        self.previous = {}
        if threading.current_thread() is threading.main_thread():
            self.previous = {signum: signal.signal(signum, self._handle) for signum in self.SIGNALS}
        return self

    def _handle(self, signum, _frame):
        name, code = self.SIGNALS[signum]
        if self.requested:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(code)
        self.requested, self.exit_code = True, code
        print(f"\nstopping after this epoch ({name} again to abort without saving)", flush=True)

    def __exit__(self, *_):
        for signum, previous in self.previous.items():
            signal.signal(signum, previous)
