#!/usr/bin/env bash
# Create bench/.peer-venv with Rejax (the benchmark peer), which the drivers in bench/peers run
# rejax_ppo.py and rejax_dqn.py with. Never a project dependency.
# Rejax 0.1.x expects gymnax's old 5-value step API, hence gymnax==0.0.9; on
# Python 3.11 the newest jax is 0.10.2 (see ../shared/STACK.md).
set -euo pipefail
cd "$(dirname "$0")/.."  # bench/
PY=${PYTHON:-python3.11}
[ -x .peer-venv/bin/python ] || "$PY" -m venv .peer-venv
.peer-venv/bin/pip install -q --upgrade pip
.peer-venv/bin/pip install -q "jax==0.10.2" "jaxlib==0.10.2" rejax "gymnax==0.0.9"
.peer-venv/bin/python -c "import importlib.metadata as m; print('rejax', m.version('rejax'), 'gymnax', m.version('gymnax'), 'jax', m.version('jax'))"
