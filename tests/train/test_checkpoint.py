"""Only committed checkpoints count; a killed save's leftovers are removed by the next
writer, never by a reader."""
import os

import jax.numpy as jnp

from agentjax.train.checkpoint import Checkpointer, latest_committed_step

STATE = {"w": jnp.arange(3.0)}


def test_only_committed_checkpoints_count(tmp_path):
    folder = str(tmp_path / "checkpoints")
    assert latest_committed_step(folder) is None
    reader = Checkpointer(folder, every=0, read_only=True)
    assert reader.latest_step is None and reader.restore(STATE) is None
    assert not os.path.exists(folder)  # reading creates nothing
    writer = Checkpointer(folder, every=1, async_save=False)
    writer.save(1, STATE, {"step": 1})
    writer.close()
    # What a kill in the middle of saving step 2 leaves.
    killed = os.path.join(folder, "2.orbax-checkpoint-tmp-1234567")
    os.makedirs(os.path.join(killed, "state"))
    assert latest_committed_step(folder) == 1
    Checkpointer(folder, every=0, read_only=True).close()
    assert os.path.exists(killed)  # a reader leaves a save in progress alone
    writer = Checkpointer(folder, every=1, async_save=False)
    state, host = writer.restore(STATE)
    assert host == {"step": 1} and (state["w"] == STATE["w"]).all()
    writer.save(2, state, {"step": 2})  # the rerun saves step 2 again
    writer.close()
    assert sorted(os.listdir(folder)) == ["1", "2"]
