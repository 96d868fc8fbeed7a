"""Writes a GGUF file (llama.cpp, Ollama, LM Studio) as an HF folder agentjax trains from.

    python scripts/import_gguf.py SmolLM2-135M-Instruct.Q4_1.gguf models/smollm2
    python scripts/train.py --config configs/grpo_search.py:hf \
      --config.model.path=models/smollm2 --workdir runs/smollm2

Llama, Qwen2/2.5 and Qwen3 files; F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and
Q2_K-Q6_K tensors, dequantized to float32 (a Q4 file gives the quantized model's
weights). The folder: model.safetensors, config.json, generation_config.json and the
tokenizer with its chat template (agentjax/models/gguf.py says what comes from where).
OUT_DIR must be missing or empty unless --force, which replaces it as a whole.
"""
import argparse
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf_file", help="the .gguf file")
    parser.add_argument("out_dir", help="the HF folder to write (missing or empty)")
    parser.add_argument("--force", action="store_true",
                        help="replace OUT_DIR even when it holds files")
    args = parser.parse_args(argv)
    if os.path.exists(args.out_dir) and not os.path.isdir(args.out_dir):
        print(f"error: {args.out_dir} is a file, not a folder", file=sys.stderr)
        return 1
    if os.path.isdir(args.out_dir) and os.listdir(args.out_dir) and not args.force:
        print(f"error: {args.out_dir} is not empty: pass --force to replace it as a whole",
              file=sys.stderr)
        return 1
    # Imported after the arguments are checked: JAX and transformers take seconds.
    from agentjax.models.gguf import import_gguf

    start = time.perf_counter()
    try:
        cfg = import_gguf(args.gguf_file, args.out_dir)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.out_dir} in {time.perf_counter() - start:.1f} s: {cfg.arch}, "
          f"{cfg.num_layers} layers, hidden {cfg.hidden_size}, vocab {cfg.vocab_size}, "
          f"float32")
    return 0


if __name__ == "__main__":
    sys.exit(main())
