"""Writes random LoRA adapters in mlx-lm's layout (adapters.safetensors with lora_a [in, r] and
lora_b [r, out], adapter_config.json), without numpy: the safetensors format is a JSON header
and raw little-endian floats."""

import array
import json
import math
import os
import random
import struct

# The starter model (SmolLM2-135M-Instruct): hidden 576, 9 query heads and 3 KV heads of 64,
# MLP 1536, 30 layers.
SMOLLM2 = {"hidden": 576, "q": 576, "kv": 192, "inter": 1536, "layers": 30}

PROJECTIONS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


def _shape(cfg, m):
    h = cfg["hidden"]
    return {
        "self_attn.q_proj": (h, cfg["q"]),
        "self_attn.k_proj": (h, cfg["kv"]),
        "self_attn.v_proj": (h, cfg["kv"]),
        "self_attn.o_proj": (cfg["q"], h),
        "mlp.gate_proj": (h, cfg["inter"]),
        "mlp.up_proj": (h, cfg["inter"]),
        "mlp.down_proj": (cfg["inter"], h),
    }[m]


def write_safetensors(path, tensors):
    """`tensors`: name -> (shape, array('f'))."""
    header, offset, blobs = {"__metadata__": {"format": "mlx"}}, 0, []
    for name, (shape, values) in tensors.items():
        data = values.tobytes()
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def write_adapter(folder, cfg=SMOLLM2, rank=8, scale=2.0, seed=0, b_amp=0.2,
                  projections=PROJECTIONS, widen=None):
    """A random adapter on `projections` of every layer; `widen` = (layer, projection) gets one
    input too many (a shape the model does not have)."""
    os.makedirs(folder, exist_ok=True)
    rng = random.Random(seed)
    tensors = {}
    for layer in range(cfg["layers"]):
        for m in projections:
            n_in, n_out = _shape(cfg, m)
            if widen == (layer, m):
                n_in += 1
            bound = 1.0 / math.sqrt(n_in)
            a = array.array("f", (rng.uniform(-bound, bound) for _ in range(n_in * rank)))
            b = array.array("f", (rng.uniform(-b_amp, b_amp) for _ in range(rank * n_out)))
            key = f"model.layers.{layer}.{m}"
            tensors[key + ".lora_a"] = ((n_in, rank), a)
            tensors[key + ".lora_b"] = ((rank, n_out), b)
    write_safetensors(os.path.join(folder, "adapters.safetensors"), tensors)
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump({"fine_tune_type": "lora", "num_layers": cfg["layers"],
                   "lora_parameters": {"rank": rank, "scale": scale, "dropout": 0.0}}, f)
    return folder


if __name__ == "__main__":
    import sys
    write_adapter(sys.argv[1], seed=int(sys.argv[2]) if len(sys.argv) > 2 else 0)
