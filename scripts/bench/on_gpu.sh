#!/usr/bin/env bash
# One call on a lent GPU machine: the GPU attention kernel's tests on the device, then the
# device bench (its kernel section included); logs under $OUT.
#
#   bash scripts/bench/on_gpu.sh        # ~5 minutes on an H200, at most 9.5 (run timeout_s 600)
#   bash scripts/bench/on_gpu.sh --models 3B --skip-train --deterministic --prefill-rows 16
#
# The machines' image has JAX (CUDA), flax, chex, optax, orbax, transformers and
# pytest, but not ml_collections or bm25s: give them as wheels in .whl/ (git-ignored;
# `pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl
# ml_collections bm25s`) and carry that folder. Arguments go to device.py.
set -uo pipefail
OUT=${OUT:-/tmp/agentjax-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH="/tmp/site:$PWD"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import jax; print('jax', jax.__version__, jax.devices())" | tee -a "$OUT/gpu.txt"
# float32 tests: XLA's own GPU dots default to TF32, about 3e-4 off (the tests hold 2e-5).
JAX_PLATFORMS=cuda JAX_DEFAULT_MATMUL_PRECISION=highest timeout 150 python3 -m pytest -q \
    -p no:cacheprovider tests/models/test_paged_pallas.py \
    tests/engine/jax/test_engine_pallas.py 2>&1 | tee "$OUT/kernel_tests.log"
timeout 420 python3 scripts/bench/device.py --repeats 1 "$@" 2>&1 | tee "$OUT/device.log"
