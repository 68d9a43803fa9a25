#!/usr/bin/env python3
"""PyTorch + PEFT reference values for kiln's LoRA trainer (crates/kiln-train).

Writes ONE safetensors file (default crates/kiln-train/tests/data/lora_reference.safetensors)
holding the losses and LoRA gradients of six objectives on the tiny Llama checkpoint
/work/shared/reference/tiny/llama, so the Rust trainer can be checked against them.

How it was made
  Run with: /tmp/torchenv/bin/python scripts/lora_reference.py --out PATH [--save-adapter DIR]
  Versions used for the committed file (printed by the script and stored in the file's
  metadata): torch 2.15.0+cu132 (run on CPU), peft 0.21.2, transformers 5.24.0,
  safetensors 0.8.0, numpy 2.4.6, Python 3.11.

Setup (the conventions the Rust trainer uses)
  * Model: LlamaForCausalLM.from_pretrained(tiny llama, float32, attn_implementation="eager"),
    model.eval() -> no dropout. Vocabulary 1024, 4 layers, hidden 64.
  * LoRA (PEFT LoraConfig) on q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj of every
    layer, r=4, lora_alpha=8 (scaling s = alpha/r = 2.0), lora_dropout=0, no bias.
    Forward: y = base(x) + s * (x @ A) @ B with kiln's A = lora_A.weight.T ([in, r]) and
    B = lora_B.weight.T ([r, out]). The file stores PEFT layout: lora_A [r, in], lora_B [out, r].
  * Init: modules sorted by path (Python sorted() on the strings, e.g.
    "model.layers.0.mlp.down_proj" < "model.layers.0.mlp.gate_proj" < ... <
    "model.layers.0.self_attn.v_proj" < "model.layers.1.mlp.down_proj"); one
    rng = np.random.default_rng(1234); for each module in that order:
      lora_A.weight = rng.uniform(-1/sqrt(in), 1/sqrt(in), size=(r, in)).astype(float32)
      lora_B.weight = rng.normal(0, 0.05, size=(out, r)).astype(float32)
  * Tokens: rng = np.random.default_rng(7); seq0 = rng.integers(3, 1024, size=14);
    seq1 = rng.integers(3, 1024, size=9) (same rng, drawn after seq0);
    seq2 = seq0[:5] ++ np.random.default_rng(8).integers(3, 1024, size=6).
    prompt_len = [5, 3, 5] for seq0, seq1, seq2.
  * Loss tokens of a sequence of length n with prompt length p: targets tokens[j] for
    j in max(p,1)..n-1, predicted from the logits at position j-1.
  * Each sequence is run as its own batch-1 forward (no padding, no attention mask); the
    log-softmax and everything after it is done in float64 (logits cast from float32).
  Objectives ("{method}" in the file):
    sft           mean over ALL loss tokens of seq0 and seq1 of -log p(target)
                  (token mean across the batch: 9 + 6 = 15 tokens).
    dpo_sigmoid   pair chosen = seq0, rejected = seq2, prompt 5. logpi(y) = SUM of response
                  log-probs; reference = the same model with the adapter disabled (no grad);
                  h = beta*((lp_c - lpref_c) - (lp_r - lpref_r)), beta = 0.1; loss = -logsigmoid(h)
    dpo_ipo       (h - 1/(2 beta))^2      (h as above, i.e. already multiplied by beta)
    dpo_smooth    -[(1-eps) logsigmoid(h) + eps logsigmoid(-h)], eps = 0.1
    orpo_full     l_w, l_r = MEAN response log-prob of chosen/rejected;
                  log_odds = (l_w - l_r) - (log1mexp(l_w) - log1mexp(l_r)), log1mexp(x)=log(1-e^x);
                  L_OR = -logsigmoid(log_odds); L_NLL = token-mean CE over the whole chosen
                  sequence (targets j in 1..n-1, prompt included); loss = L_NLL + 0.1 * L_OR
    orpo_response same but L_NLL = -l_w
  Gradients are d loss / d lora_A.weight and d lora_B.weight (PEFT layout), float32, from one
  backward of the float32 model (loss tail in float64).

File contents
  tokens.seq0 / seq1 / seq2            int64 [14] / [9] / [11]
  prompt_len                           int64 [3]   (5, 3, 5)
  init.{path}.lora_A / .lora_B         float32 [r, in] / [out, r]
  {method}.loss                        float64 [1]
  {method}.grad.{path}.lora_A / .lora_B float32 [r, in] / [out, r]
  logits.seq0                          float32 [14, 1024]  adapted model's logits for seq0
  where {path} is e.g. model.layers.0.self_attn.q_proj. The safetensors metadata key "reference" holds a JSON
  object with the versions, hyper-parameters and losses.

Self-checks done on every run (the script stops if one fails):
  * the PEFT model's logits equal those of a plain model whose weights are W + s * B_peft @ A_peft
    (i.e. the y = base(x) + s (x A) B convention), max abs diff < 1e-4;
  * the reference (adapter disabled) logits equal the plain base model's logits exactly;
  * autograd vs central finite differences in float64 along a random direction, per method.
"""

import argparse
import json
import math
import platform
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import peft
import safetensors
import transformers
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file
from transformers import LlamaForCausalLM

ROOT = Path(__file__).resolve().parent.parent
MODEL_DIR = "/work/shared/reference/tiny/llama"
DEFAULT_OUT = ROOT / "crates/kiln-train/tests/data/lora_reference.safetensors"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
R, ALPHA = 4, 8
BETA, EPS, LAMBDA = 0.1, 0.1, 0.1
PREFIX = "base_model.model."
METHODS = ["sft", "dpo_sigmoid", "dpo_ipo", "dpo_smooth", "orpo_full", "orpo_response"]


def versions():
    return {
        "torch": torch.__version__,
        "peft": peft.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }


def make_tokens(vocab):
    rng = np.random.default_rng(7)
    seq0 = rng.integers(3, vocab, size=14).astype(np.int64)
    seq1 = rng.integers(3, vocab, size=9).astype(np.int64)
    seq2 = np.concatenate([seq0[:5], np.random.default_rng(8).integers(3, vocab, size=6)]).astype(np.int64)
    return seq0, seq1, seq2


def load_base(dtype=torch.float32):
    m = LlamaForCausalLM.from_pretrained(MODEL_DIR, dtype=dtype, attn_implementation="eager")
    m.config.use_cache = False
    return m.eval()


def lora_modules(model):
    """{path: peft LoraLayer} with path like model.layers.0.self_attn.q_proj."""
    out = {}
    for name, mod in model.named_modules():
        if hasattr(mod, "lora_A") and "default" in getattr(mod, "lora_A", {}):
            assert name.startswith(PREFIX), name
            out[name[len(PREFIX):]] = mod
    return dict(sorted(out.items()))


def build_peft(dtype=torch.float32):
    base = load_base(dtype)
    cfg = LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=TARGETS, bias="none",
                     task_type="CAUSAL_LM")
    model = get_peft_model(base, cfg).eval()
    mods = lora_modules(model)
    assert len(mods) == 7 * base.config.num_hidden_layers, len(mods)
    rng = np.random.default_rng(1234)
    init = {}
    for path in sorted(mods):
        m = mods[path]
        a, b = m.lora_A["default"], m.lora_B["default"]
        fan_in, fan_out = a.in_features, b.out_features
        assert m.scaling["default"] == ALPHA / R
        av = rng.uniform(-1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in), size=(R, fan_in)).astype(np.float32)
        bv = rng.normal(0, 0.05, size=(fan_out, R)).astype(np.float32)
        with torch.no_grad():
            a.weight.copy_(torch.from_numpy(av))
            b.weight.copy_(torch.from_numpy(bv))
        init[path] = (av, bv)
    return model, mods, init


def token_logprobs(model, seq):
    """float64 log p(tokens[j] | tokens[:j]) for j = 1..n-1 (index j-1 of the result)."""
    ids = torch.from_numpy(seq).unsqueeze(0)
    logits = model(input_ids=ids).logits[0]  # [n, V]
    lp = torch.log_softmax(logits.to(torch.float64), dim=-1)
    tgt = ids[0, 1:]
    return lp[:-1].gather(-1, tgt.unsqueeze(-1)).squeeze(-1), logits


def resp(lp, p):
    """log-probs of targets j in max(p,1)..n-1 (lp[j-1])."""
    return lp[max(p, 1) - 1:]


def log1mexp(x):
    return torch.log(-torch.expm1(x))


def compute_loss(method, model, toks, plens):
    seq0, seq1, seq2 = toks
    p0, p1, p2 = plens
    if method == "sft":
        r0 = resp(token_logprobs(model, seq0)[0], p0)
        r1 = resp(token_logprobs(model, seq1)[0], p1)
        return -(r0.sum() + r1.sum()) / (r0.numel() + r1.numel())
    lp_c_all = token_logprobs(model, seq0)[0]
    lp_r_all = token_logprobs(model, seq2)[0]
    rc, rr = resp(lp_c_all, p0), resp(lp_r_all, p2)
    if method.startswith("dpo"):
        with torch.no_grad(), model.disable_adapter():
            ref_c = resp(token_logprobs(model, seq0)[0], p0).sum()
            ref_r = resp(token_logprobs(model, seq2)[0], p2).sum()
        h = BETA * ((rc.sum() - ref_c) - (rr.sum() - ref_r))
        if method == "dpo_sigmoid":
            return -F.logsigmoid(h)
        if method == "dpo_ipo":
            return (h - 1 / (2 * BETA)) ** 2
        if method == "dpo_smooth":
            return -((1 - EPS) * F.logsigmoid(h) + EPS * F.logsigmoid(-h))
    if method.startswith("orpo"):
        lw, lr = rc.mean(), rr.mean()
        log_odds = (lw - lr) - (log1mexp(lw) - log1mexp(lr))
        l_or = -F.logsigmoid(log_odds)
        if method == "orpo_full":
            l_nll = -lp_c_all.mean()  # targets j in 1..n-1 of the chosen sequence
        else:
            l_nll = -lw
        return l_nll + LAMBDA * l_or
    raise ValueError(method)


def lora_params(mods):
    ps = []
    for path in sorted(mods):
        ps.append(mods[path].lora_A["default"].weight)
        ps.append(mods[path].lora_B["default"].weight)
    return ps


def check_merge_convention(model, mods, toks):
    """PEFT logits == plain model with W' = W + s * B_peft @ A_peft, and disabled == base."""
    plain = load_base()
    base_only = load_base()
    sd = dict(plain.named_parameters())
    with torch.no_grad():
        for path, m in mods.items():
            A = m.lora_A["default"].weight.double()  # [r, in]
            B = m.lora_B["default"].weight.double()  # [out, r]
            w = sd[path + ".weight"]
            w.copy_((w.double() + (ALPHA / R) * (B @ A)).float())
        worst = 0.0
        for seq in toks:
            ids = torch.from_numpy(seq).unsqueeze(0)
            a = model(input_ids=ids).logits
            b = plain(input_ids=ids).logits
            worst = max(worst, (a - b).abs().max().item())
            with model.disable_adapter():
                c = model(input_ids=ids).logits
            d = base_only(input_ids=ids).logits
            assert torch.equal(c, d), "adapter-disabled logits differ from the base model"
    print(f"check: PEFT vs merged-weights logits max abs diff {worst:.3e}")
    assert worst < 1e-4, worst


def _rmsnorm_keep_dtype(self, x):
    var = x.pow(2).mean(-1, keepdim=True)
    return self.weight * (x * torch.rsqrt(var + self.variance_epsilon))


def _make_f64_exact(model):
    """transformers' Llama computes RMSNorm and the eager attention softmax in float32 even for a
    float64 model; that rounding noise would swamp a finite-difference check, so for the check
    only, RMSNorm is replaced by a dtype-preserving copy and softmax's dtype=float32 is dropped
    for float64 inputs. (The reference values themselves come from the unpatched f32 model.)"""
    import types
    from transformers.models.llama import modeling_llama
    for m in model.modules():
        if isinstance(m, modeling_llama.LlamaRMSNorm):
            m.forward = types.MethodType(_rmsnorm_keep_dtype, m)
    orig = F.softmax

    def softmax(x, dim=None, _stacklevel=3, dtype=None):
        if x.dtype == torch.float64 and dtype == torch.float32:
            dtype = None
        return orig(x, dim=dim, _stacklevel=_stacklevel, dtype=dtype)
    return orig, softmax


def check_finite_differences(toks, plens):
    """float64 model: directional derivative from autograd vs central differences."""
    torch.manual_seed(0)
    model, mods, _ = build_peft(torch.float64)
    orig_softmax, softmax64 = _make_f64_exact(model)
    torch.nn.functional.softmax = softmax64
    try:
        _fd(model, mods, toks, plens)
    finally:
        torch.nn.functional.softmax = orig_softmax


def _fd(model, mods, toks, plens):
    params = lora_params(mods)
    dirs = [torch.randn_like(p) for p in params]
    for method in METHODS:
        for p in params:
            p.grad = None
        loss = compute_loss(method, model, toks, plens)
        loss.backward()
        ad = sum((p.grad * d).sum().item() for p, d in zip(params, dirs))
        h = 1e-6
        vals = []
        for sgn in (1, -1):
            with torch.no_grad():
                for p, d in zip(params, dirs):
                    p.add_(sgn * h * d)
            with torch.no_grad():
                vals.append(compute_loss(method, model, toks, plens).item())
            with torch.no_grad():
                for p, d in zip(params, dirs):
                    p.sub_(sgn * h * d)
        fd = (vals[0] - vals[1]) / (2 * h)
        rel = abs(ad - fd) / max(abs(fd), 1e-12)
        print(f"check: {method:14s} f64 loss {loss.item():.12f}  autograd {ad:+.10e}  fd {fd:+.10e}  rel {rel:.1e}")
        assert rel < 1e-5, (method, ad, fd)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--save-adapter", default=None,
                    help="also save_pretrained the adapter here, with logits_seq0.npy and tokens_seq0.txt")
    ap.add_argument("--no-fd-check", action="store_true")
    args = ap.parse_args()

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    v = versions()
    print("versions:", json.dumps(v))

    model, mods, init = build_peft()
    vocab = model.config.vocab_size
    toks = make_tokens(vocab)
    plens = (5, 3, 5)
    for i, s in enumerate(toks):
        print(f"seq{i} (prompt_len {plens[i]}):", s.tolist())

    check_merge_convention(model, mods, toks)

    tensors = {
        "tokens.seq0": torch.from_numpy(toks[0]),
        "tokens.seq1": torch.from_numpy(toks[1]),
        "tokens.seq2": torch.from_numpy(toks[2]),
        "prompt_len": torch.tensor(plens, dtype=torch.int64),
    }
    for path, (a, b) in init.items():
        tensors[f"init.{path}.lora_A"] = torch.from_numpy(a)
        tensors[f"init.{path}.lora_B"] = torch.from_numpy(b)

    params = lora_params(mods)
    losses = {}
    for method in METHODS:
        for p in params:
            p.grad = None
        loss = compute_loss(method, model, toks, plens)
        loss.backward()
        losses[method] = loss.item()
        tensors[f"{method}.loss"] = loss.detach().to(torch.float64).reshape(1)
        gnorm = 0.0
        for path, m in mods.items():
            ga = m.lora_A["default"].weight.grad
            gb = m.lora_B["default"].weight.grad
            assert ga is not None and gb is not None and ga.abs().max() > 0, (method, path)
            tensors[f"{method}.grad.{path}.lora_A"] = ga.detach().float().contiguous().clone()
            tensors[f"{method}.grad.{path}.lora_B"] = gb.detach().float().contiguous().clone()
            gnorm += ga.double().pow(2).sum().item() + gb.double().pow(2).sum().item()
        print(f"{method:14s} loss {loss.item():.12f}  grad L2 norm {math.sqrt(gnorm):.9e}")

    with torch.no_grad():
        logits0 = model(input_ids=torch.from_numpy(toks[0]).unsqueeze(0)).logits[0].float().contiguous()
    tensors["logits.seq0"] = logits0.clone()

    # One metadata key: safetensors writes the metadata map in hash order, so with several keys
    # the header bytes would differ between runs; with one the file is byte-for-byte reproducible.
    meta = {"reference": json.dumps({
        "how": "scripts/lora_reference.py (PyTorch + PEFT reference for kiln-train)",
        "model": MODEL_DIR,
        "versions": v,
        "lora": {"r": R, "alpha": ALPHA, "scaling": ALPHA / R, "dropout": 0.0, "targets": TARGETS,
                 "init": "sorted paths, default_rng(1234): A ~ U(+-1/sqrt(in)) [r,in], B ~ N(0,0.05) [out,r]"},
        "hparams": {"dpo_beta": BETA, "dpo_smooth_eps": EPS, "orpo_lambda": LAMBDA},
        "losses": losses,
    }, sort_keys=True)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out), metadata=meta)
    size = out.stat().st_size
    print(f"wrote {out} ({size} bytes, {len(tensors)} tensors)")
    if size >= 1 << 20:
        tensors["logits.seq0"] = logits0[:4].clone()
        save_file(tensors, str(out), metadata=meta)
        print(f"over 1 MiB: rewrote with logits.seq0 first 4 positions ({out.stat().st_size} bytes)")

    if args.save_adapter:
        d = Path(args.save_adapter)
        model.save_pretrained(str(d))
        np.save(d / "logits_seq0.npy", logits0.numpy())
        (d / "tokens_seq0.txt").write_text(",".join(str(t) for t in toks[0].tolist()) + "\n")
        print(f"saved adapter + logits_seq0.npy + tokens_seq0.txt to {d}")

    if not args.no_fd_check:
        check_finite_differences(toks, plens)
    print("ok")


if __name__ == "__main__":
    sys.exit(main())
