#!/usr/bin/env python3
"""Writes a random-weight GGUF of a real model's shape, for speed and memory measurements.

The tokenizer and chat template come from a donor GGUF (by default kiln's starter model), so
the file tokenizes, templates and generates like a real model; the weights are N(0, 0.02)
(norms 1), written as F16 (norms F32) and then quantized by llama-quantize to each type asked
for. Speed and memory do not depend on the values; the output is meaningless text.

A shape's vocabulary is its real size (128,256 for Llama 3, 151,936 for Qwen3): the donor's
tokens are kept and the rest are padded with reserved control tokens that no text produces,
so the embedding and the head have their real sizes. `--vocab donor` keeps the donor's size.

Usage (bench/synth_model.sh makes the venv and passes the arguments through):
    synth_model.py --shape 3b --donor SmolLM2.gguf --out DIR --types Q4_K_M,Q8_0
The files are DIR/<shape>-<TYPE>.gguf; the F16 source is deleted unless --keep-f16.
They are model weights: never commit them (the repository ignores *.gguf).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover - the wrapper installs it
    sys.exit("synth_model.py: the gguf package is missing (run bench/synth_model.sh)")


@dataclass(frozen=True)
class Shape:
    """One published model's dimensions (from its config.json)."""

    arch: str  # GGUF architecture name: "llama" or "qwen3"
    label: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tied: bool  # the head shares the embedding matrix
    rope_theta: float
    norm_eps: float
    context: int


SHAPES = {
    "1b": Shape("llama", "Llama-3.2-1B", 2048, 16, 32, 8, 64, 8192, 128256, True, 500000.0, 1e-5, 131072),
    "3b": Shape("llama", "Llama-3.2-3B", 3072, 28, 24, 8, 128, 8192, 128256, True, 500000.0, 1e-5, 131072),
    "8b": Shape("llama", "Llama-3.1-8B", 4096, 32, 32, 8, 128, 14336, 128256, False, 500000.0, 1e-5, 131072),
    "qwen3-4b": Shape("qwen3", "Qwen3-4B", 2560, 36, 32, 8, 128, 9728, 151936, True, 1000000.0, 1e-6, 40960),
}

# llama-quantize's names for the target types the benchmarks use.
QUANT_TYPES = {"Q4_0", "Q4_1", "Q5_0", "Q5_K_M", "Q4_K_M", "Q6_K", "Q8_0", "F16"}

CONTROL_TOKEN = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL
WEIGHT_STD = 0.02
ROWS_PER_CHUNK = 4096  # rows generated at once: bounds memory at 128k vocabularies


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", required=True, choices=sorted(SHAPES), help="which model's dimensions")
    p.add_argument("--donor", required=True, type=Path, help="GGUF whose tokenizer and chat template are copied")
    p.add_argument("--out", required=True, type=Path, help="folder for the files")
    p.add_argument("--types", default="Q4_K_M,Q8_0", help="comma-separated llama-quantize types (default Q4_K_M,Q8_0)")
    p.add_argument("--vocab", default="shape", help="'shape' (the model's real vocabulary, padded) or 'donor'")
    p.add_argument("--layers", type=int, help="override the layer count (a quicker, smaller file)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama-quantize threads")
    p.add_argument(
        "--llama-quantize",
        default=os.environ.get("LLAMA_QUANTIZE", "/opt/llama.cpp/bin/llama-quantize"),
        help="llama-quantize binary [LLAMA_QUANTIZE]",
    )
    p.add_argument("--keep-f16", action="store_true", help="keep the F16 source file")
    args = p.parse_args(argv)
    types = [t.strip() for t in args.types.split(",") if t.strip()]
    bad = [t for t in types if t not in QUANT_TYPES]
    if not types or bad:
        p.error(f"--types: unknown {bad or 'empty list'}; choose from {sorted(QUANT_TYPES)}")
    args.types = types
    if args.vocab not in ("shape", "donor"):
        p.error("--vocab must be 'shape' or 'donor'")
    if args.layers is not None and args.layers < 1:
        p.error("--layers must be at least 1")
    if args.threads < 1:
        p.error("--threads must be at least 1")
    if not args.donor.is_file():
        p.error(f"--donor: no such file: {args.donor}")
    return args


def donor_tokenizer(path: Path) -> dict[str, tuple[object, gguf.GGUFValueType, gguf.GGUFValueType | None]]:
    """Every `tokenizer.*` key of the donor: value, type and (for arrays) element type."""
    reader = gguf.GGUFReader(path)
    keys = {}
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        main = field.types[0]
        sub = field.types[-1] if main == gguf.GGUFValueType.ARRAY else None
        keys[name] = (field.contents(), main, sub)
    if "tokenizer.ggml.tokens" not in keys:
        sys.exit(f"synth_model.py: {path} has no tokenizer.ggml.tokens")
    return keys


def pad_vocab(keys: dict, vocab: int) -> int:
    """Pads the token list (and its types and scores) with reserved control tokens up to `vocab`."""
    tokens = keys["tokenizer.ggml.tokens"][0]
    have = len(tokens)
    if vocab < have:
        sys.exit(f"synth_model.py: the donor has {have} tokens, more than the shape's {vocab}")
    extra = [f"<|kiln_reserved_{i}|>" for i in range(vocab - have)]
    v, t, s = keys["tokenizer.ggml.tokens"]
    keys["tokenizer.ggml.tokens"] = (list(v) + extra, t, s)
    if "tokenizer.ggml.token_type" in keys:
        v, t, s = keys["tokenizer.ggml.token_type"]
        keys["tokenizer.ggml.token_type"] = (list(v) + [CONTROL_TOKEN] * len(extra), t, s)
    if "tokenizer.ggml.scores" in keys:
        v, t, s = keys["tokenizer.ggml.scores"]
        keys["tokenizer.ggml.scores"] = (list(v) + [0.0] * len(extra), t, s)
    return vocab


def tensor_plan(shape: Shape, layers: int, vocab: int) -> list[tuple[str, tuple[int, ...], type]]:
    """(name, numpy shape as rows x columns, dtype) of every tensor, in llama.cpp's order."""
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    plan = [("token_embd.weight", (vocab, h), np.float16)]
    for i in range(layers):
        b = f"blk.{i}."
        plan.append((b + "attn_norm.weight", (h,), np.float32))
        plan += [(b + "attn_q.weight", (q, h), np.float16), (b + "attn_k.weight", (kv, h), np.float16)]
        plan += [(b + "attn_v.weight", (kv, h), np.float16), (b + "attn_output.weight", (h, q), np.float16)]
        if shape.arch == "qwen3":
            plan.append((b + "attn_q_norm.weight", (shape.head_dim,), np.float32))
            plan.append((b + "attn_k_norm.weight", (shape.head_dim,), np.float32))
        plan.append((b + "ffn_norm.weight", (h,), np.float32))
        plan.append((b + "ffn_gate.weight", (shape.ffn, h), np.float16))
        plan.append((b + "ffn_up.weight", (shape.ffn, h), np.float16))
        plan.append((b + "ffn_down.weight", (h, shape.ffn), np.float16))
    plan.append(("output_norm.weight", (h,), np.float32))
    if not shape.tied:
        plan.append(("output.weight", (vocab, h), np.float16))
    return plan


def add_metadata(w: gguf.GGUFWriter, shape: Shape, layers: int, vocab: int, keys: dict, name: str) -> None:
    a = shape.arch
    w.add_name(name)
    w.add_description("random N(0, 0.02) weights for speed measurements (kiln bench/synth_model.py)")
    w.add_uint32(f"{a}.context_length", shape.context)
    w.add_uint32(f"{a}.embedding_length", shape.hidden)
    w.add_uint32(f"{a}.block_count", layers)
    w.add_uint32(f"{a}.feed_forward_length", shape.ffn)
    w.add_uint32(f"{a}.attention.head_count", shape.heads)
    w.add_uint32(f"{a}.attention.head_count_kv", shape.kv_heads)
    w.add_uint32(f"{a}.attention.key_length", shape.head_dim)
    w.add_uint32(f"{a}.attention.value_length", shape.head_dim)
    w.add_uint32(f"{a}.rope.dimension_count", shape.head_dim)
    w.add_float32(f"{a}.rope.freq_base", shape.rope_theta)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", shape.norm_eps)
    w.add_uint32(f"{a}.vocab_size", vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for key, (value, main, sub) in keys.items():
        w.add_key_value(key, value, main, sub_type=sub)


def write_f16(args: argparse.Namespace, shape: Shape, path: Path) -> None:
    keys = donor_tokenizer(args.donor)
    donor_vocab = len(keys["tokenizer.ggml.tokens"][0])
    vocab = pad_vocab(keys, shape.vocab) if args.vocab == "shape" else donor_vocab
    layers = args.layers or shape.layers
    plan = tensor_plan(shape, layers, vocab)

    w = gguf.GGUFWriter(path, shape.arch)
    add_metadata(w, shape, layers, vocab, keys, f"{shape.label} shape (random weights)")
    for name, dims, dtype in plan:
        nbytes = int(np.prod(dims)) * np.dtype(dtype).itemsize
        w.add_tensor_info(name, dims, np.dtype(dtype), nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()

    # Tensors are streamed in row chunks (gguf-py's write_tensor_data takes whole arrays, which
    # would hold a 128k x 4096 matrix in memory three times over).
    fout = w.fout[0]
    rng = np.random.default_rng(args.seed)
    total = sum(int(np.prod(d)) for _, d, _ in plan)
    done, start = 0, time.time()
    for name, dims, dtype in plan:
        w.write_padding(fout, fout.tell())
        if len(dims) == 1:
            np.ones(dims, dtype=dtype).tofile(fout)
        else:
            rows, cols = dims
            for r in range(0, rows, ROWS_PER_CHUNK):
                n = min(ROWS_PER_CHUNK, rows - r)
                block = rng.standard_normal((n, cols), dtype=np.float32)
                block *= WEIGHT_STD
                block.astype(np.float16).tofile(fout)
        nbytes = int(np.prod(dims)) * np.dtype(dtype).itemsize
        w.write_padding(fout, nbytes)
        done += int(np.prod(dims))
        print(f"\r{path.name}: {done / total:6.1%} of {total / 1e9:.2f}B parameters"
              f" ({time.time() - start:.0f} s)", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    w.close()


def quantize(args: argparse.Namespace, src: Path, dst: Path, qtype: str) -> None:
    cmd = [args.llama_quantize, str(src), str(dst), qtype, str(args.threads)]
    print("synth_model.py: " + " ".join(cmd), file=sys.stderr)
    result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stdout[-4000:])
        sys.exit(f"synth_model.py: llama-quantize failed for {qtype} (exit {result.returncode})")


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    shape = SHAPES[args.shape]
    if any(t != "F16" for t in args.types) and not os.access(args.llama_quantize, os.X_OK):
        sys.exit(f"synth_model.py: llama-quantize not found at {args.llama_quantize} "
                 "(docs/benchmarks.md says how to build it, or pass --llama-quantize)")
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.shape + (f"-L{args.layers}" if args.layers else "") + ("-dv" if args.vocab == "donor" else "")
    f16 = args.out / f"{stem}-F16.gguf"
    write_f16(args, shape, f16)
    for qtype in args.types:
        if qtype != "F16":
            quantize(args, f16, args.out / f"{stem}-{qtype}.gguf", qtype)
    if "F16" not in args.types and not args.keep_f16:
        f16.unlink()
    for qtype in args.types:
        out = args.out / f"{stem}-{qtype}.gguf"
        print(f"{out}\t{out.stat().st_size}")


if __name__ == "__main__":
    main(sys.argv[1:])
