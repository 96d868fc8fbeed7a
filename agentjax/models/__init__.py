"""agentjax.models: the Llama / Qwen2 / Qwen3 decoder, KV cache, critic, HF interop.

    from agentjax.models import Decoder, ModelConfig, init_cache, load_hf, save_hf
    from agentjax.models.tokenizer import load_tokenizer, prompt_ids, observation_ids

Modules: config.py (ModelConfig), decoder.py (Decoder, apply, positions helpers),
cache.py (KVCache), value.py (ValueModel, ActorCritic), hf.py (load_hf, save_hf,
make_tiny_hf), tokenizer.py (imports transformers' tokenizer classes, so it is not
re-exported here), gguf.py (import_gguf: GGUF files -> HF folders; imports transformers
too).
"""
from agentjax.models.cache import KVCache, cache_positions, init_cache
from agentjax.models.config import ModelConfig, RopeConfig
from agentjax.models.decoder import Decoder, apply, positions_from_segments
from agentjax.models.hf import load_hf, make_tiny_hf, save_hf
from agentjax.models.value import ActorCritic, ValueModel

__all__ = [
    "ActorCritic", "Decoder", "KVCache", "ModelConfig", "RopeConfig", "ValueModel",
    "apply", "cache_positions", "init_cache", "load_hf", "make_tiny_hf",
    "positions_from_segments", "save_hf",
]
