"""core/compiles.py: every compile is counted once, under its function and the bucket
open in its thread, a persistent-cache hit included, a cache reuse never."""
import collections
import os
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np

from agentjax.core import compiles


def _scaled(factor):
    @jax.jit
    def scale(x):
        return x * factor
    return scale


def test_each_new_signature_counts_once_under_its_bucket():
    scale = _scaled(3.0)
    before = compiles.counts()
    with compiles.bucket(rows=4, items=8):
        scale(np.ones(4, np.float32))
        scale(np.zeros(4, np.float32))           # same signature: the same executable
    with compiles.bucket(rows=16, items=8):
        scale(np.ones(16, np.float32))
    scale(np.ones(16, np.int32))                 # no bucket open
    gained = compiles.since(before)
    assert gained == {("scale", (("rows", 4), ("items", 8))): 1,
                      ("scale", (("rows", 16), ("items", 8))): 1, ("scale", ()): 1}
    assert compiles.by_function(gained) == {"scale": 3}
    assert compiles.summary(gained) == "3 programs: scale 3 (rows=4: 1, rows=16: 1)"
    assert compiles.metrics(gained) == {"compile/programs": 3, "compile/scale": 3}
    assert compiles.metrics(gained, {"decode"}) == {"compile/programs": 3,
                                                    "compile/other": 3}


def test_buckets_are_per_thread():
    scale = _scaled(5.0)
    before = compiles.counts()
    opened, compiled = threading.Event(), threading.Event()

    def other():
        opened.wait()
        scale(np.ones(3, np.float32))  # the main thread's bucket is open meanwhile
        compiled.set()

    thread = threading.Thread(target=other)
    thread.start()
    with compiles.bucket(rows=2):
        opened.set()
        compiled.wait()
        scale(np.ones(2, np.float32))
    thread.join()
    assert compiles.since(before) == {("scale", ()): 1, ("scale", (("rows", 2),)): 1}


def test_a_persistent_cache_hit_counts_as_a_program(tmp_path):
    """A fresh process whose program comes from the persistent cache counts it as the
    process that compiled it did: a budget does not depend on what the cache holds."""
    script = ("import jax, numpy as np\n"
              "from agentjax.core import compiles\n"
              "hits = []\n"
              "jax.monitoring.register_event_listener(\n"
              "    lambda event, **_: hits.append(event == '/jax/compilation_cache/cache_hits'))\n"
              "jax.jit(lambda x: x * 7 + 1)(np.ones(5, np.float32))\n"
              "print(sum(compiles.counts().values()), sum(hits))\n")
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(tmp_path),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           env=env, check=True).stdout.split() for _ in range(2)]
    assert runs == [["1", "0"], ["1", "1"]]  # compiled, then loaded from the cache


def test_the_function_view_is_live():
    view = compiles.FunctionCounts({"scale", "never_compiled"})
    start = dict(view).get("scale", 0)
    _scaled(11.0)(jnp.ones(7))
    assert dict(view)["scale"] == start + 1 and "never_compiled" not in view
    assert isinstance(compiles.counts(), collections.Counter)
