"""train/engines.py: the rollout config's engine keys reach the in-process engine and the
flags of launched servers."""
import pytest
from flax import nnx

from agentjax.config import presets
from agentjax.config.rules import chunk_widths
from agentjax.sglang.server.main import parse_args
from agentjax.train.engines import build_engine, server_flags


def _config(**rollout):
    config = presets.search_config("grpo", "test")
    for key, value in rollout.items():
        setattr(config.rollout, key, value)
    return config


def test_chunk_widths_parse_or_name_the_text():
    assert chunk_widths("16,64,256") == (16, 64, 256)
    assert chunk_widths("256") == (256,)
    for bad in ("", "16,", "0,16", "x"):
        with pytest.raises(ValueError, match=repr(bad)):
            chunk_widths(bad)


def test_the_engine_keys_reach_every_lane(tiny_model, tokenizer, tmp_path):
    config = _config(prefill_chunks="8,32", deterministic_prefill_rows=2,
                     engine_overlap=False, engine_lanes=2, engine_slots=4, concurrency=4)
    graphdef, params = nnx.split(tiny_model)
    engine, close = build_engine(config, graphdef=graphdef, params=params,
                                 model_config=tiny_model.config, tokenizer=tokenizer,
                                 model_path="", workdir=str(tmp_path), log=print)
    try:
        assert len(engine.lanes) == 2
        for lane in engine.lanes:
            assert lane._shapes.chunks == (8, 32)
            assert lane.deterministic and lane.deterministic_prefill_rows == 2
            assert lane.overlap is False
    finally:
        close()


def test_launched_servers_get_the_same_engine_keys(tmp_path):
    (tmp_path / "config.json").write_text("{}")  # serve_main checks the folder holds one
    model = ["--model-path", str(tmp_path)]
    flags = server_flags(_config(prefill_chunks="8,32", deterministic_prefill_rows=2,
                                 engine_overlap=False))
    args = parse_args([*model, *flags])
    assert args.prefill_chunks == (8, 32) and args.deterministic_prefill_rows == 2
    assert args.disable_overlap_schedule and args.enable_deterministic_inference
    defaults = parse_args([*model, *server_flags(_config())])
    assert defaults.prefill_chunks == (16, 64, 256) and not defaults.disable_overlap_schedule
    assert defaults.deterministic_prefill_rows == 4
