#!/usr/bin/env python3
"""Writes a random-weight BERT GGUF of a real encoder's shape, for embedding speed measurements.

The file is laid out as llama.cpp's converter writes a BERT (`general.architecture = bert`, its
tensor names, a phantom-space WordPiece vocabulary), so both kiln and llama-server read it. The
vocabulary comes from a donor BERT GGUF (default: the tiny fixture in kiln's embedding tests),
padded with pieces no text produces up to the shape's real size, so the embedding table has its
real size. Weights are N(0, 0.02) (norms 1, biases 0); speed does not depend on the values.

Usage (bench/synth_bert.sh makes the venv and passes the arguments through):
    synth_bert.py --shape bert-base --out DIR --types F16,Q8_0
The files are DIR/<shape>-<TYPE>.gguf. They are model weights: never commit them.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover - the wrapper installs it
    sys.exit("synth_bert.py: the gguf package is missing (run bench/synth_bert.sh)")

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DONOR = ROOT / "crates/kiln-engine/tests/data/embed/bert-cls.gguf"
POOLING = {"mean": 1, "cls": 2}


@dataclass(frozen=True)
class Shape:
    """One published encoder's dimensions (from its config.json)."""

    label: str
    hidden: int
    layers: int
    heads: int
    ffn: int
    vocab: int
    positions: int


SHAPES = {
    "bert-base": Shape("BERT-base (bge-base-en-v1.5)", 768, 12, 12, 3072, 30522, 512),
    "bert-small": Shape("bge-small-en-v1.5", 384, 12, 12, 1536, 30522, 512),
    "minilm": Shape("all-MiniLM-L6-v2", 384, 6, 12, 1536, 30522, 512),
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="bert-base", choices=sorted(SHAPES))
    p.add_argument("--donor", type=Path, default=DEFAULT_DONOR, help="BERT GGUF whose vocabulary is copied")
    p.add_argument("--out", required=True, type=Path, help="folder for the files")
    p.add_argument("--types", default="F16,Q8_0", help="comma-separated: F32, F16, Q8_0 (default F16,Q8_0)")
    p.add_argument("--pooling", default="cls", choices=sorted(POOLING))
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def field_value(reader: gguf.GGUFReader, key: str):
    f = reader.fields[key]
    if f.types[0] == gguf.GGUFValueType.ARRAY:
        if f.types[-1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode() for i in f.data]
        return [f.parts[i][0].item() for i in f.data]
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode()
    return f.parts[f.data[0]][0].item()


def vocabulary(donor: Path, size: int) -> tuple[list[str], list[int], dict[str, int]]:
    """The donor's tokens and types padded to `size` with `▁[unusedN]` pieces, and its special ids."""
    r = gguf.GGUFReader(donor)
    tokens = field_value(r, "tokenizer.ggml.tokens")
    types = field_value(r, "tokenizer.ggml.token_type")
    if len(tokens) > size:
        sys.exit(f"synth_bert.py: the donor has {len(tokens)} tokens, more than the shape's {size}")
    pad = size - len(tokens)
    tokens += [f"\u2581[unused{i}]" for i in range(pad)]
    types += [int(gguf.TokenType.NORMAL)] * pad
    ids = {}
    for key in ["bos", "eos", "unknown", "seperator", "padding", "mask"]:
        name = f"tokenizer.ggml.{key}_token_id"
        if name in r.fields:
            ids[key] = int(field_value(r, name))
    return tokens, types, ids


def matrix(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    return rng.normal(0.0, 0.02, size=(rows, cols)).astype(np.float32)


def add_matrix(w: gguf.GGUFWriter, name: str, data: np.ndarray, ty: str) -> None:
    if ty == "F32":
        w.add_tensor(name, data)
    elif ty == "F16":
        w.add_tensor(name, data.astype(np.float16))
    else:
        q = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)


def write(args: argparse.Namespace, shape: Shape, ty: str, path: Path) -> None:
    tokens, types, ids = vocabulary(args.donor, shape.vocab)
    rng = np.random.default_rng(args.seed)
    w = gguf.GGUFWriter(path, "bert")
    w.add_name(f"{shape.label} shape (random weights)")
    w.add_description("random N(0, 0.02) weights for speed measurements (kiln bench/synth_bert.py)")
    w.add_context_length(shape.positions)
    w.add_embedding_length(shape.hidden)
    w.add_block_count(shape.layers)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType(POOLING[args.pooling]))
    w.add_file_type({"F32": 0, "F16": 1, "Q8_0": 7}[ty])
    w.add_token_type_count(2)
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("bert-bge")
    w.add_token_list(tokens)
    w.add_token_types(types)
    for key, value in ids.items():
        w.add_uint32(f"tokenizer.ggml.{key}_token_id", value)
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    w.add_bool("tokenizer.ggml.add_eos_token", True)

    h, f = shape.hidden, shape.ffn
    ones, zeros = np.ones(h, np.float32), np.zeros(h, np.float32)
    add_matrix(w, "token_embd.weight", matrix(rng, shape.vocab, h), ty)
    add_matrix(w, "position_embd.weight", matrix(rng, shape.positions, h), "F16" if ty != "F32" else ty)
    add_matrix(w, "token_types.weight", matrix(rng, 2, h), "F32")
    w.add_tensor("token_embd_norm.weight", ones)
    w.add_tensor("token_embd_norm.bias", zeros)
    for n in range(shape.layers):
        for name, rows, cols in [("attn_q", h, h), ("attn_k", h, h), ("attn_v", h, h),
                                 ("attn_output", h, h), ("ffn_up", f, h), ("ffn_down", h, f)]:
            add_matrix(w, f"blk.{n}.{name}.weight", matrix(rng, rows, cols), ty)
            w.add_tensor(f"blk.{n}.{name}.bias", np.zeros(rows, np.float32))
        for norm in ["attn_output_norm", "layer_output_norm"]:
            w.add_tensor(f"blk.{n}.{norm}.weight", ones)
            w.add_tensor(f"blk.{n}.{norm}.bias", zeros)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    shape = SHAPES[args.shape]
    args.out.mkdir(parents=True, exist_ok=True)
    for ty in args.types.split(","):
        if ty not in ("F32", "F16", "Q8_0"):
            sys.exit(f"synth_bert.py: type {ty!r} is not one of F32, F16, Q8_0")
        path = args.out / f"{args.shape}-{ty}.gguf"
        write(args, shape, ty, path)
        print(path)


if __name__ == "__main__":
    main(sys.argv[1:])
