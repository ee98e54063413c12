#!/usr/bin/env python3
"""Regenerates model.gguf, the llama.cpp example and test model (committed; CI does not run this).

A llama-architecture language model with seeded random weights and its tokenizer inside the file,
written by the PyPI `gguf` package (the llama.cpp project's own GGUF writer): 2 blocks, embedding
128, 4 query heads over 2 key/value heads (grouped-query attention), feed-forward 256, context 256,
a SentencePiece-style vocabulary of 3 control tokens, the 256 byte tokens and 53 word pieces
(312 in all). Weights are F32, so every quantisation type is a real requantisation; the rows are
128 wide, which k-quants (256-wide blocks) cannot take, so llama.cpp's quantiser falls back per
tensor there, as it does for real models with such tensors.

The weights are drawn from numpy's PCG64 `Generator.random` (its bit stream is stable across numpy
versions) and scaled so that logits spread over several units: greedy continuations are then
decided by clear margins, not by ties a quantisation flips.

Usage:
  python3 -m venv /tmp/gguf-venv && /tmp/gguf-venv/bin/pip install gguf==0.19.0 numpy
  /tmp/gguf-venv/bin/python examples/tiny-llama/make.py
"""
import os

import gguf
import numpy as np

here = os.path.dirname(os.path.abspath(__file__))

N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_LAYER, N_CTX = 128, 4, 2, 256, 2, 256
WORDS = (
    "the of and to in is was for on that with as by at from his her it an are were be this "
    "which or had not but have first one their also its new after who they two has been more "
    "other all when into time there only most can year"
).split()


def vocab():
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256
    scores = [0.0] * len(tokens)
    pieces = ["\u2581"] + ["\u2581" + w for w in WORDS]
    for i, p in enumerate(pieces):
        tokens.append(p)
        types.append(gguf.TokenType.NORMAL)
        scores.append(-float(i))
    return tokens, scores, types


def weights(rng, rows, cols, scale):
    return ((rng.random((rows, cols), dtype=np.float32) * 2 - 1) * scale).astype(np.float32)


def main():
    rng = np.random.Generator(np.random.PCG64(27))
    tokens, scores, types = vocab()
    n_vocab = len(tokens)
    n_kv = N_EMBD // N_HEAD * N_HEAD_KV
    w = gguf.GGUFWriter(os.path.join(here, "model.gguf"), "llama")
    w.add_name("kiln tiny llama (random weights)")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    s = 1.0 / np.sqrt(N_EMBD)
    w.add_tensor("token_embd.weight", weights(rng, n_vocab, N_EMBD, 1.0))
    for i in range(N_LAYER):
        b = f"blk.{i}"
        w.add_tensor(f"{b}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(f"{b}.attn_q.weight", weights(rng, N_EMBD, N_EMBD, 3 * s))
        w.add_tensor(f"{b}.attn_k.weight", weights(rng, n_kv, N_EMBD, 3 * s))
        w.add_tensor(f"{b}.attn_v.weight", weights(rng, n_kv, N_EMBD, 3 * s))
        w.add_tensor(f"{b}.attn_output.weight", weights(rng, N_EMBD, N_EMBD, 3 * s))
        w.add_tensor(f"{b}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(f"{b}.ffn_gate.weight", weights(rng, N_FF, N_EMBD, 3 * s))
        w.add_tensor(f"{b}.ffn_up.weight", weights(rng, N_FF, N_EMBD, 3 * s))
        w.add_tensor(f"{b}.ffn_down.weight", weights(rng, N_EMBD, N_FF, 3 / np.sqrt(N_FF)))
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    w.add_tensor("output.weight", weights(rng, n_vocab, N_EMBD, 6 * s))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
