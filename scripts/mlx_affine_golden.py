#!/usr/bin/env python3
"""Writes crates/kiln-model/tests/data/mlx_affine_golden.safetensors: MLX's own affine
quantization of one small deterministic bf16 matrix, the golden data kiln's
`mlx::affine_quantize` / `affine_dequantize` are tested against.

The file holds
  input                          bf16 [8, 256]   the matrix quantized
  b{bits}_g{group}.weight        uint32          mx.quantize(...)[0]
  b{bits}_g{group}.scales        bf16            mx.quantize(...)[1]
  b{bits}_g{group}.biases        bf16            mx.quantize(...)[2]
  b{bits}_g{group}.dequantized   bf16 [8, 256]   mx.dequantize of the three above
for bits in {2,3,4,5,6,8} x group in {32,64,128}, and metadata naming the MLX version.

Usage: python3 scripts/mlx_affine_golden.py
When `mlx` is not importable, the script makes a venv under /tmp with pinned `mlx[cpu]` and
numpy (CPU wheels for Linux are on PyPI) and reruns itself there. The output is deterministic:
rerunning it with the same MLX version rewrites the same bytes.
"""

import os
import subprocess
import sys
from pathlib import Path

PINS = ["mlx[cpu]==0.32.4", "numpy==2.4.6"]
VENV = Path("/tmp/kiln-mlx-venv")
ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates/kiln-model/tests/data/mlx_affine_golden.safetensors"
BITS = [2, 3, 4, 5, 6, 8]
GROUPS = [32, 64, 128]


def ensure_mlx():
    try:
        import mlx.core  # noqa: F401
        import numpy  # noqa: F401

        return
    except ImportError:
        pass
    if os.environ.get("KILN_MLX_VENV_CHILD"):
        sys.exit("mlx is still not importable inside the venv; see the pip output above")
    python = VENV / "bin/python"
    if not python.exists():
        subprocess.check_call([sys.executable, "-m", "venv", str(VENV)])
    subprocess.check_call(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *PINS]
    )
    env = dict(os.environ, KILN_MLX_VENV_CHILD="1")
    os.execve(str(python), [str(python), __file__, *sys.argv[1:]], env)


def golden_input():
    """8 x 256 rows chosen to reach every branch of MLX's scale/bias choice."""
    import numpy as np

    rng = np.random.default_rng(20240607)
    cols = 256
    rows = []
    # 0: plain Gaussian weights.
    rows.append(rng.standard_normal(cols) * 0.05)
    # 1: positive outliers: the max is the larger-magnitude extreme (negative scale).
    r = rng.standard_normal(cols) * 0.02
    r[::37] = 0.9
    rows.append(r)
    # 2: negative outliers: the min is the larger-magnitude extreme (positive scale).
    r = rng.standard_normal(cols) * 0.02
    r[5::41] = -1.3
    rows.append(r)
    # 3: all positive, 4: all negative (the bias is not the group's near-zero end).
    rows.append(np.abs(rng.standard_normal(cols)) * 0.1 + 0.5)
    rows.append(-np.abs(rng.standard_normal(cols)) * 0.1 - 0.25)
    # 5: an all-zero quarter (scale falls to eps and q0 = 0), a constant quarter, then small
    # values whose scales are below f16's normal range.
    r = np.zeros(cols)
    r[64:128] = 0.375
    r[128:] = rng.standard_normal(128) * 3e-6
    rows.append(r)
    # 6: large values beyond f16's range in the second half.
    r = rng.standard_normal(cols) * 2.0
    r[128:] *= 60000.0
    rows.append(r)
    # 7: a ramp with many exact ties in (w - bias) / scale, to pin the rounding rule.
    rows.append((np.arange(cols) % 32 - 15.5) / 8.0)
    return np.stack(rows).astype(np.float32)


def main():
    ensure_mlx()
    import mlx.core as mx

    # MLX's CPU kernel (mlx/backend/cpu/quantized.cpp) is the reference; pin it explicitly.
    mx.set_default_device(mx.cpu)
    x = mx.array(golden_input()).astype(mx.bfloat16)
    tensors = {"input": x}
    for bits in BITS:
        for group in GROUPS:
            w, scales, biases = mx.quantize(x, group_size=group, bits=bits, mode="affine")
            deq = mx.dequantize(w, scales, biases, group_size=group, bits=bits, mode="affine")
            key = f"b{bits}_g{group}"
            tensors[f"{key}.weight"] = w
            tensors[f"{key}.scales"] = scales
            tensors[f"{key}.biases"] = biases
            tensors[f"{key}.dequantized"] = deq
    mx.eval(tensors)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(
        str(OUT), tensors, metadata={"mlx_version": mx.__version__, "device": "cpu"}
    )
    print(f"{OUT.relative_to(ROOT)}: {OUT.stat().st_size} bytes, mlx {mx.__version__}")


if __name__ == "__main__":
    main()
