"""Shared engine fixtures (a pytest plugin of tests/conftest.py): one tokenizer, one tiny model and one JaxEngine per process,
so the engine's few programs compile once for every rollout test module."""
import jax
import pytest
from flax import nnx

from agentjax.models.config import ModelConfig
from agentjax.models.decoder import Decoder
from agentjax.models.tokenizer import build_tokenizer
from agentjax.engine.jax.engine import JaxEngine
from tests.agents.fakes import CORPUS

# Shapes of the shared engine; tests that need the model's context length use these.
# page_size=16: rows cross pages while they prefill and decode (up to 6 pages a row).
ENGINE_KWARGS = dict(max_slots=4, max_len=96, prefill_chunks=(32,), batch_buckets=(1,),
                     decode_steps=4, page_size=16, batch_wait_s=0.01)


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer(CORPUS * 4, vocab_size=384)


@pytest.fixture(scope="session")
def tiny_model(tokenizer):
    """2 layers, d=64, vocab rounded up from the tokenizer's; weights scaled up so the
    random model's distributions are peaked (greedy argmax ties are implausible)."""
    vocab = -(-len(tokenizer) // 64) * 64
    config = ModelConfig(arch="qwen2", vocab_size=vocab, hidden_size=64, intermediate_size=128,
                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, qkv_bias=True,
                         eos_token_id=tokenizer.eos_token_id)
    model = Decoder(config, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    params = jax.tree.map(lambda x: x * 8.0 if x.ndim >= 2 else x, params)
    return nnx.merge(graphdef, params)


@pytest.fixture(scope="session")
def engine(tiny_model, tokenizer):
    """The shared engine, with every program compiled upfront (`warmup`)."""
    engine = JaxEngine.from_model(tiny_model, tokenizer=tokenizer, **ENGINE_KWARGS)
    engine.warmup()
    yield engine
    engine.close()
