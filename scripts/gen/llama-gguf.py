#!/usr/bin/env python3
"""Writes a llama-architecture GGUF of about a requested size, for benchmarks over model size
(e2e/bench/sizes.sh): seeded random weights, with the real tokenizer and chat template of
SmolLM2-135M (every `tokenizer.*` key of scripts/ensure/llm-models.sh's smollm2-135m-q4_1.gguf,
copied as is: a 49152-token GPT-2 BPE vocabulary, its merges and ChatML template), so
`kiln-agent fixtures --chat` and llama-server's /completion work on it as on a real model.

    scripts/gen/llama-gguf.py --size-gb 1 --type f16 --out /var/cache/kiln/sizes/llama-1gb-f16.gguf
    scripts/gen/llama-gguf.py --size-gb 0.1 --type q4_0 --out FILE [--seed 1] [--tokenizer-from GGUF]

--type: the weights' type. f16: a float source, which kiln compiles to the type a target names
(`backend.llamacpp.quantization`: Q8_0, Q4_K_M, ...). q8_0 / q4_0: an already quantised source,
made by the gguf package's own numpy quantiser, which a target with no `quantization` serves as
is. 1-D tensors (the norms) are F32 in all three, as llama.cpp's converter writes them.

The shape is chosen for the size: the narrowest width (a multiple of 256, so k-quants take every
row) whose layer count stays at most width/64, like real llamas (Llama 3.2 1B: 2048 wide, 16
layers); head size 64, grouped-query attention with a quarter of the heads for key/value,
feed-forward 4x the width, the output matrix tied to the token embedding (no output.weight). The
file is within a few percent of the size asked (one layer's worth); the size and shape are
printed on stderr.

Weights are numpy PCG64 normals (the bit stream is stable across numpy versions), scaled so that
the residual stream stays the last token's embedding plus small block contributions: the last
position's logits stay finite and small (the token's own about 16, the others about +-1), so the
greedy continuation (the last token again) is decided by a wide margin that Q8_0 or Q4_K_M does
not flip. Such a model computes exactly as much as a trained one of its shape.

Runs in its own virtual environment: with any other python it creates (once) and re-executes in
$KILN_CACHE_DIR/gguf-0.19.0 (default /var/cache/kiln as root, ~/.cache/kiln otherwise), holding
PyPI's gguf 0.19.0 and numpy 2.4.6, pinned like scripts/ensure/v2-client.sh's. Writes FILE.tmp,
then renames it. Exit status 1, with the reason on stderr, on failure.
"""
import argparse
import os
import subprocess
import sys

GGUF = "0.19.0"
NUMPY = "2.4.6"


def ensure_venv():
    """Re-executes this script under its pinned venv unless already there (pinned_venv.py)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import pinned_venv
    pinned_venv.reexec("gen-llama-gguf", f"gguf-{GGUF}", {"gguf": GGUF, "numpy": NUMPY}, __file__)


BPW = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


def shape_for(size_bytes, typ, n_vocab):
    """(n_embd, n_layer, n_ff, n_head, n_head_kv, bytes): the narrowest width whose layer count
    for the size stays at most width/64."""
    bpw = BPW[typ]
    for n in range(256, 16384 + 1, 256):
        n_head = n // 64
        n_kv_head = max(1, n_head // 4)
        n_ff = 4 * n
        per_layer = (2 * n * n + 2 * n * (64 * n_kv_head) + 3 * n * n_ff) * bpw + 2 * n * 4
        fixed = n_vocab * n * bpw + n * 4
        layers = round((size_bytes - fixed) / per_layer)
        if layers < 1:
            layers = 1
        if layers <= max(2, n // 64):
            return n, layers, n_ff, n_head, n_kv_head, int(fixed + layers * per_layer)
    sys.exit("gen-llama-gguf: size too large for widths up to 16384")


def main():
    ensure_venv()
    import gguf
    import numpy as np
    from gguf import quants

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-gb", type=float, required=True, help="about this many GB (1e9 bytes)")
    ap.add_argument("--type", choices=sorted(BPW), default="f16")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tokenizer-from", help="GGUF whose tokenizer.* keys are copied "
                    "(default: scripts/ensure/llm-models.sh's smollm2-135m-q4_1.gguf)")
    a = ap.parse_args()

    tok = a.tokenizer_from
    if not tok:
        here = os.path.dirname(os.path.abspath(__file__))
        d = subprocess.run(["bash", os.path.join(here, "..", "ensure", "llm-models.sh")], check=True,
                           capture_output=True, text=True).stdout.strip()
        tok = os.path.join(d, "smollm2-135m-q4_1.gguf")
    reader = gguf.GGUFReader(tok)
    tok_fields = {k: f for k, f in reader.fields.items() if k.startswith("tokenizer.")}
    n_vocab = len(tok_fields["tokenizer.ggml.tokens"].data)

    n, n_layer, n_ff, n_head, n_kv_head, est = shape_for(a.size_gb * 1e9, a.type, n_vocab)
    n_kv = 64 * n_kv_head
    print(f"gen-llama-gguf: {a.type}, vocab {n_vocab}, n_embd {n}, n_layer {n_layer}, n_ff {n_ff}, "
          f"heads {n_head}/{n_kv_head} kv, about {est / 1e9:.3f} GB -> {a.out}", file=sys.stderr)

    qtype = {"f16": None, "q8_0": gguf.GGMLQuantizationType.Q8_0,
             "q4_0": gguf.GGMLQuantizationType.Q4_0}[a.type]
    ftype = {"f16": gguf.LlamaFileType.MOSTLY_F16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
             "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}[a.type]

    # Scales (see the module doc): embedding s_e with the own logit n*s_e = 16; the norms ahead of
    # each block 0.05, the projections into a block 1/sqrt(n), out of a block c/sqrt(fan_in) so
    # each block adds about 0.2*s_e/sqrt(2L) per component.
    s_e = 16.0 / n
    norm_w = 0.05
    c = 4 * s_e / np.sqrt(2 * n_layer)
    # name, rows (ne1), cols (ne0), std; None std: a norm (F32, value norm_w or 1).
    tensors = [("token_embd.weight", n_vocab, n, s_e)]
    for i in range(n_layer):
        b = f"blk.{i}"
        tensors += [
            (f"{b}.attn_norm.weight", None, n, norm_w),
            (f"{b}.attn_q.weight", n, n, 1 / np.sqrt(n)),
            (f"{b}.attn_k.weight", n_kv, n, 1 / np.sqrt(n)),
            (f"{b}.attn_v.weight", n_kv, n, 1 / np.sqrt(n)),
            (f"{b}.attn_output.weight", n, n, c / np.sqrt(n)),
            (f"{b}.ffn_norm.weight", None, n, norm_w),
            (f"{b}.ffn_gate.weight", n_ff, n, 1 / np.sqrt(n)),
            (f"{b}.ffn_up.weight", n_ff, n, 1 / np.sqrt(n)),
            (f"{b}.ffn_down.weight", n, n_ff, c / np.sqrt(n_ff)),
        ]
    tensors.append(("output_norm.weight", None, n, 1.0))

    def nbytes(rows, cols):
        if rows is None:
            return cols * 4
        if qtype is None:
            return rows * cols * 2
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        return rows * cols // block * size

    tmp = a.out + ".tmp"
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    w = gguf.GGUFWriter(tmp, "llama")
    w.add_name(f"kiln generated llama {a.size_gb:g} GB {a.type} (random weights, seed {a.seed})")
    w.add_context_length(4096)
    w.add_embedding_length(n)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(100000.0)
    w.add_rope_dimension_count(64)
    w.add_vocab_size(n_vocab)
    w.add_file_type(ftype)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for k, f in tok_fields.items():
        sub = f.types[1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(k, f.contents(), f.types[0], sub)
    for name, rows, cols, _ in tensors:
        if rows is None:
            w.add_tensor_info(name, [cols], np.dtype(np.float32), cols * 4)
        elif qtype is None:
            w.add_tensor_info(name, [rows, cols], np.dtype(np.float16), nbytes(rows, cols))
        else:
            w.add_tensor_info(name, [rows, cols], np.dtype(np.float32), nbytes(rows, cols),
                              raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.Generator(np.random.PCG64(a.seed))
    chunk = 1 << 22  # rows per piece are chosen so a piece holds about this many values
    for name, rows, cols, std in tensors:
        if rows is None:
            w.write_tensor_data(np.full(cols, std, dtype=np.float32))
            continue
        # Written piecewise (write_tensor_data pops one tensor info per call, so the pieces of
        # one tensor are concatenated into one buffer of the tensor's final bytes).
        step = max(1, chunk // cols)
        parts = []
        for r0 in range(0, rows, step):
            x = rng.standard_normal((min(step, rows - r0), cols), dtype=np.float32)
            x *= np.float32(std)
            parts.append(x.astype(np.float16) if qtype is None else quants.quantize(x, qtype))
        w.write_tensor_data(np.concatenate(parts))
    w.close()
    os.replace(tmp, a.out)
    print(f"gen-llama-gguf: wrote {os.path.getsize(a.out)} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
