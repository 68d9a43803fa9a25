#!/usr/bin/env python3
"""Compare kiln's logits for a LoRA-adapted model against PyTorch + PEFT.

Usage:
  /tmp/torchenv/bin/python scripts/peft_logits_check.py ADAPTER_DIR --base MODEL \
      --tokens 1,2,3,... --kiln-logits FILE.npy [--atol 1e-3] [--save-torch-logits OUT.npy]

  ADAPTER_DIR  a PEFT adapter folder (adapter_config.json + adapter_model.safetensors), e.g. one
               kiln exported.
  MODEL        the base: a Hugging Face folder, or a .gguf file (loaded with transformers'
               `gguf_file=`, which dequantizes to float32 and needs the `gguf` pip package).
  --tokens     comma-separated token ids (no BOS is added).
  --kiln-logits  float32/float64 .npy of shape [n_tokens, vocab] (a leading batch axis of 1 is
               accepted) holding kiln's logits for the same tokens.

Loads the base in float32 (eager attention, eval mode), wraps it with
PeftModel.from_pretrained(base, ADAPTER_DIR), runs one forward over the tokens and prints
  max abs diff            max |kiln - torch|
  max rel diff            max |kiln - torch| / max(|torch|, 1e-6)   (element-wise)
  max abs / max |torch|   the abs diff relative to the logits' scale
  top-1 agreement         per position
Exits 1 if the max abs diff exceeds --atol (default 1e-3), 2 on a shape mismatch.

Tested (torch 2.15.0, peft 0.21.2, transformers 5.24.0, gguf 0.19.0) on the adapter that
scripts/lora_reference.py --save-adapter writes, against its own saved logits (diff 0).
"""

import argparse
import os
import sys

import numpy as np
import torch


def load_base(base):
    from transformers import AutoModelForCausalLM

    if base.endswith(".gguf"):
        d, f = os.path.split(os.path.abspath(base))
        m = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32,
                                                 attn_implementation="eager")
    else:
        m = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, attn_implementation="eager")
    m.config.use_cache = False
    # (a GGUF-loaded model is flagged "quantized" by transformers and refuses .float(); its
    # weights are already dequantized float32 tensors)
    assert all(p.dtype == torch.float32 for p in m.parameters()), {p.dtype for p in m.parameters()}
    return m.eval()


def main():
    ap = argparse.ArgumentParser(description="kiln vs PEFT logits")
    ap.add_argument("adapter_dir")
    ap.add_argument("--base", required=True, help="HF model folder or .gguf file")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--kiln-logits", required=True, help=".npy [n_tokens, vocab]")
    ap.add_argument("--atol", type=float, default=1e-3)
    ap.add_argument("--save-torch-logits", default=None, help="also write torch's logits here (.npy)")
    args = ap.parse_args()

    from peft import PeftModel
    import peft
    import transformers

    print(f"torch {torch.__version__}, peft {peft.__version__}, transformers {transformers.__version__}")
    ids = [int(t) for t in args.tokens.replace(" ", "").split(",") if t]
    base = load_base(args.base)
    model = PeftModel.from_pretrained(base, args.adapter_dir).eval()
    n_lora = sum(1 for n, _ in model.named_modules() if n.endswith("lora_A.default"))
    print(f"base {args.base}: vocab {model.config.vocab_size}; adapter {args.adapter_dir}: {n_lora} LoRA modules")
    if n_lora == 0:
        print("error: the adapter attached to no module")
        return 2
    with torch.no_grad():
        t = model(input_ids=torch.tensor([ids], dtype=torch.long)).logits[0].double().numpy()
    if args.save_torch_logits:
        np.save(args.save_torch_logits, t.astype(np.float32))

    k = np.load(args.kiln_logits).astype(np.float64)
    if k.ndim == 3 and k.shape[0] == 1:
        k = k[0]
    if k.shape != t.shape:
        print(f"shape mismatch: kiln {k.shape} vs torch {t.shape}")
        return 2
    diff = np.abs(k - t)
    max_abs = float(diff.max())
    max_rel = float((diff / np.maximum(np.abs(t), 1e-6)).max())
    scale = float(np.abs(t).max())
    pos = int(diff.max(axis=1).argmax())
    top1 = int((k.argmax(-1) == t.argmax(-1)).sum())
    print(f"tokens: {len(ids)}, logits shape {t.shape}")
    print(f"max abs diff: {max_abs:.6e} (at position {pos})")
    print(f"max rel diff: {max_rel:.6e}")
    print(f"max abs diff / max |torch logit| ({scale:.4g}): {max_abs / max(scale, 1e-30):.6e}")
    print(f"top-1 agreement: {top1}/{len(ids)}")
    if max_abs > args.atol:
        print(f"FAIL: max abs diff {max_abs:.3e} > atol {args.atol:g}")
        return 1
    print(f"PASS (atol {args.atol:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
