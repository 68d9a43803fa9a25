#!/usr/bin/env python3
"""Expected values for kiln-lab's mixed-precision allocator tests, from optiq itself.

Runs the real `optimize_mixed_precision` of mlx-optiq 0.7.7 (optiq/core/optimizer.py)
on the small sensitivity tables below and writes inputs plus outputs as JSON, which
`crates/kiln-lab/src/quantize/allocate_tests.rs` replays against the Rust port.

optiq's source is not copied here. Fetch the wheel and point this script at it:

    pip download mlx-optiq==0.7.7 --no-deps -d /tmp/optiq
    python3 allocate_oracle.py /tmp/optiq/mlx_optiq-0.7.7-py3-none-any.whl > allocate_oracle.json

optimizer.py only needs `SensitivityResult` and `KEEP_BF16_BITS` from its sibling
`sensitivity` module (which imports mlx, so it cannot load on Linux); a stub provides them.
Floats are written with repr() so the Rust side can compare them bit for bit (and so NaN and
inf survive JSON). Besides whole allocations the file pins three building blocks where
Python's semantics are subtle: list.sort with NaN keys, heapq with NaN in the tuples, and
the name rules (protection, block index).
"""

import contextlib
import dataclasses
import hashlib
import heapq
import importlib.util
import io
import json
import math
import random
import sys
import types
import zipfile

OPTIMIZER_IN_WHEEL = "optiq/core/optimizer.py"


def load_optimizer(path):
    """Import optimizer.py from the wheel (or a plain .py path) with a stub sibling module."""
    if path.endswith(".whl"):
        with zipfile.ZipFile(path) as whl:
            source = whl.read(OPTIMIZER_IN_WHEEL)
    else:
        with open(path, "rb") as f:
            source = f.read()
    pkg = types.ModuleType("optiq_stub")
    pkg.__path__ = []
    sens = types.ModuleType("optiq_stub.sensitivity")

    @dataclasses.dataclass
    class SensitivityResult:
        layer_name: str
        sensitivities: dict
        param_count: int
        metadata: dict = dataclasses.field(default_factory=dict)

    sens.SensitivityResult = SensitivityResult
    sens.KEEP_BF16_BITS = 16
    sys.modules["optiq_stub"] = pkg
    sys.modules["optiq_stub.sensitivity"] = sens
    spec = importlib.util.spec_from_loader("optiq_stub.optimizer", loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "optiq_stub"
    exec(compile(source, OPTIMIZER_IN_WHEEL, "exec"), mod.__dict__)
    return mod, hashlib.sha256(source).hexdigest()


# ---------------------------------------------------------------------------------------------
# Sensitivity tables
# ---------------------------------------------------------------------------------------------

COMPS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
         "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
PARAMS = {"self_attn.q_proj": 1048576, "self_attn.k_proj": 262144,
          "self_attn.v_proj": 262144, "self_attn.o_proj": 1048576,
          "mlp.gate_proj": 3145728, "mlp.up_proj": 3145728, "mlp.down_proj": 3145728}
NAN = float("nan")
INF = float("inf")


def layer(name, params, kl):
    return {"name": name, "params": params, "kl": kl}


def opts(target, bits=None, protect=True, n_protect=1, n_floor=2, max_run=3):
    return {"target_bpw": target, "candidate_bits": bits, "protect_first_last": protect,
            "n_protect": n_protect, "n_floor_per_block": n_floor, "max_low_bit_run": max_run}


def uniform_ref(n_blocks):
    """mlx-bun's uniformRefDataset: KL 0 at 4 bits (the baseline), the benefit at 8."""
    return [layer(f"model.layers.{b}.{c}", PARAMS[c], {4: 0.0, 8: (b + 1) * 0.001 * (1.0 + 0.1 * i)})
            for b in range(n_blocks) for i, c in enumerate(COMPS)]


def bf16_three_tier(n_blocks):
    """mlx-bun's bf16RefThreeTier: KL falls with bits; embed_tokens and lm_head included."""
    out = []
    for b in range(n_blocks):
        for i, c in enumerate(COMPS):
            base = ((b % 2) + 1) * 0.01 * (1 + 0.07 * i)
            out.append(layer(f"model.layers.{b}.{c}", PARAMS[c], {2: base, 4: base * 0.3, 8: base * 0.05}))
    out.append(layer("model.embed_tokens", 4194304, {2: 0.4, 4: 0.15, 8: 0.02}))
    out.append(layer("lm_head", 4194304, {2: 0.5, 4: 0.2, 8: 0.03}))
    return out


def heap_tie():
    # Equal efficiency: the name decides, as a string ("layers.10" < "layers.9").
    return [layer("model.layers.9.mlp.up_proj", 1000, {4: 0.5, 8: 0.1}),
            layer("model.layers.10.mlp.up_proj", 1000, {4: 0.5, 8: 0.1}),
            layer("model.layers.11.mlp.down_proj", 2000, {4: 0.0, 8: 0.0})]


def output_boost():
    # Raw efficiency favours up_proj; the x100 bonus of embed_tokens (no `layers` segment) wins.
    return [layer("model.layers.0.mlp.up_proj", 1000, {4: 0.05, 8: 0.0}),
            layer("model.embed_tokens", 4000, {4: 0.01, 8: 0.0})]


def boundary_boost():
    return [layer(f"model.layers.{b}.mlp.down_proj", 1000, {4: kl, 8: 0.0})
            for b, kl in enumerate([0.010, 0.050, 0.040, 0.002])]


def moe_boost():
    return [layer("model.layers.1.mlp.gate_proj", 100, {4: 0.001, 8: 0.0}),
            layer("model.layers.1.mlp.gate", 100, {4: 0.0001, 8: 0.0}),
            layer("model.layers.1.router.proj", 100, {4: 0.00005, 8: 0.0}),
            layer("model.layers.1.mlp.shared_experts.down_proj", 100, {4: 0.00002, 8: 0.0}),
            layer("model.layers.1.mlp.experts.gate", 100, {4: 0.000001, 8: 0.0})]


def nan_layers():
    return [layer("model.layers.0.mlp.up_proj", 1000, {2: NAN, 4: 0.02, 8: 0.01}),
            layer("model.layers.0.mlp.down_proj", 1000, {2: 0.5, 4: 0.05, 8: 0.01}),
            layer("model.layers.0.mlp.gate_proj", 1000, {2: 0.3, 4: 0.1, 8: NAN}),
            layer("model.layers.0.self_attn.q_proj", 1000, {2: NAN, 4: NAN, 8: NAN}),
            layer("model.layers.0.self_attn.k_proj", 1000, {2: 0.2, 4: 0.06, 8: 0.02})]


def nan_in_floor():
    # Raw NaN keys reach the floor's sort (optiq cleans NaN only after the floor).
    kl2 = [0.03, NAN, 0.05, 0.01, 0.6, NAN, 0.4]
    return [layer(f"model.layers.0.{c}", PARAMS[c], {2: kl2[i], 4: 0.001, 8: 0.0001})
            for i, c in enumerate(COMPS)]


def floor_blocks():
    def blk(b, comps_kl):
        return [layer(f"model.layers.{b}.{c}", 1000, {2: kl, 4: kl * 0.2, 8: kl * 0.01})
                for c, kl in comps_kl]
    return (blk(0, [("self_attn.q_proj", .01), ("self_attn.k_proj", .03), ("self_attn.v_proj", .02),
                    ("self_attn.o_proj", .015), ("mlp.gate_proj", .5), ("mlp.up_proj", .4),
                    ("mlp.down_proj", .6)])
            + blk(1, [("linear_attn.in_proj_qkv", .05), ("linear_attn.out_proj", .07),
                      ("mlp.up_proj", .9), ("mlp.down_proj", .8)])
            + blk(2, [("mixer.x_proj", .2), ("mixer.in_proj", .3), ("mlp.up_proj", .1)])
            + blk(3, [("self_attn.q_proj", .02), ("self_attn.k_proj", .02), ("self_attn.v_proj", .02),
                      ("self_attn.o_proj", .02), ("mlp.up_proj", .001)])
            + [layer("lm_head", 1000, {2: 0.9, 4: 0.1, 8: 0.01})])


def run_guard_blocks():
    # 14 blocks x 2 layers at [2, 4]; greedy lifts both of block 4 and one of block 8.
    out = []
    for b in range(14):
        for j, c in enumerate(["mlp.up_proj", "mlp.down_proj"]):
            kl2 = 0.01 + 0.001 * ((b * 7 + j * 3) % 5)
            if b == 4 or (b == 8 and j == 0):
                kl2 = 5.0
            out.append(layer(f"model.layers.{b}.{c}", 1000, {2: kl2, 4: kl2 * 0.1}))
    return out


def sparse_blocks():
    # Block indices 0, 2, 4, ... are "consecutive" in sorted order for the run guard.
    return [layer(f"model.layers.{b}.mlp.{c}", 1000, {2: 0.01 * (b + 1) + (0.001 if c == "up_proj" else 0), 4: 0.0})
            for b in range(0, 12, 2) for c in ["up_proj", "down_proj"]]


def unreachable():
    return [layer("model.layers.0.mlp.up_proj", 1000, {4: 0.2, 8: 0.1}),
            layer("model.layers.0.mlp.down_proj", 3000, {4: 0.3, 8: 0.3}),
            layer("model.layers.1.mlp.up_proj", 2000, {4: 0.0, 8: 0.4})]


def inferred_bits():
    return [layer("model.layers.0.mlp.up_proj", 1000, {2: 0.5, 3: 0.3, 4: 0.1, 8: 0.01}),
            layer("model.layers.0.mlp.down_proj", 1000, {2: 0.4, 4: 0.12, 8: 0.02}),
            layer("model.layers.1.mlp.up_proj", 1000, {2: 0.45, 3: 0.25, 4: 0.11, 8: 0.01}),
            layer("model.layers.1.mlp.down_proj", 1000, {8: 0.0})]


def no_keys():
    return [layer(f"model.layers.{b}.{c}", PARAMS[c], {}) for b in range(2) for c in COMPS]


def inf_kl():
    return [layer("model.layers.0.mlp.up_proj", 1000, {2: INF, 4: INF, 8: 1.0}),
            layer("model.layers.0.mlp.down_proj", 1000, {2: 0.5, 4: 0.2, 8: 0.1}),
            layer("model.layers.1.mlp.up_proj", 1000, {2: INF, 4: INF, 8: INF}),
            layer("model.layers.1.mlp.down_proj", 1000, {2: 0.6, 4: 0.1, 8: 0.05}),
            layer("model.layers.2.mlp.up_proj", 1000, {2: 0.7, 4: INF, 8: 0.2}),
            layer("model.layers.2.mlp.down_proj", 1000, {2: 0.3, 4: 0.25, 8: 0.2})]


def random_table(seed):
    """A 12-block model with MoE-style names, ties and repeated values: exercises everything."""
    rng = random.Random(seed)
    comps = COMPS + ["mlp.gate", "mlp.shared_expert.up_proj"]
    vals = [0.0, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1]
    out = []
    for b in range(12):
        for c in comps:
            lo = rng.choice(vals[3:])
            kl = {2: lo * 4, 3: lo * 2, 4: lo, 8: rng.choice(vals[:3])}
            out.append(layer(f"model.layers.{b}.{c}", rng.choice([1000, 2000, 4000]), kl))
    out.append(layer("model.embed_tokens", 16000, {2: 0.3, 3: 0.2, 4: 0.1, 8: 0.01}))
    out.append(layer("lm_head", 16000, {2: 0.3, 3: 0.2, 4: 0.1, 8: 0.01}))
    return out


CASES = [
    ("mlx_bun_uniform_ref_3_blocks", uniform_ref(3), opts(5.0, [4, 8])),
    ("mlx_bun_uniform_ref_6_blocks", uniform_ref(6), opts(4.5, [4, 8])),
    ("mlx_bun_three_tier_run_guard", bf16_three_tier(5), opts(3.5, [2, 4, 8], n_floor=2, max_run=2)),
    ("mlx_bun_three_tier_target_6", bf16_three_tier(4), opts(6.0, [2, 4, 8])),
    ("three_tier_defaults", bf16_three_tier(4), opts(4.0)),
    ("heap_tie_broken_by_name", heap_tie(), opts(4.5, [4, 8], protect=False, n_floor=0, max_run=0)),
    ("output_layer_boost", output_boost(), opts(4.5, [4, 8], protect=False, n_floor=0, max_run=0)),
    ("boundary_boost", boundary_boost(), opts(5.5, [4, 8], n_floor=0, max_run=0)),
    ("boundary_boost_n_protect_2", boundary_boost(), opts(5.5, [4, 8], n_protect=2, n_floor=0, max_run=0)),
    ("boundary_off", boundary_boost(), opts(5.5, [4, 8], protect=False, n_floor=0, max_run=0)),
    ("moe_boost", moe_boost(), opts(6.0, [4, 8], protect=False, n_floor=0, max_run=0)),
    ("nan_layers", nan_layers(), opts(4.5, [2, 4, 8], protect=False, n_floor=0, max_run=0)),
    ("nan_in_floor_sort", nan_in_floor(), opts(1.0, [2, 4, 8], protect=False, n_floor=3, max_run=0)),
    ("block_floor_attention", floor_blocks(), opts(1.0, [2, 4, 8], protect=False, n_floor=2, max_run=0)),
    ("block_floor_three", floor_blocks(), opts(1.0, [2, 4, 8], protect=False, n_floor=3, max_run=0)),
    ("run_guard", run_guard_blocks(), opts(2.2, [2, 4], protect=False, n_floor=0, max_run=3)),
    ("run_guard_sparse_indices", sparse_blocks(), opts(1.0, [2, 4], protect=False, n_floor=0, max_run=2)),
    ("target_met_at_min_bits", uniform_ref(2), opts(4.0, [4, 8], n_floor=0, max_run=0)),
    ("target_unreachable", unreachable(), opts(16.0, [4, 8], protect=False, n_floor=0, max_run=0)),
    ("inferred_candidate_bits", inferred_bits(), opts(3.5, None, protect=False, n_floor=0, max_run=0)),
    ("no_kl_keys_default_4_8", no_keys(), opts(6.0, None)),
    ("inf_kl_nan_efficiency", inf_kl(), opts(5.0, [2, 4, 8], protect=False, n_floor=0, max_run=0)),
    ("random_moe_table", random_table(7), opts(3.25, [2, 3, 4, 8])),
    ("random_moe_table_high", random_table(11), opts(5.0, None, n_protect=2, n_floor=1, max_run=2)),
]

# ---------------------------------------------------------------------------------------------
# Name rules
# ---------------------------------------------------------------------------------------------

NAMES = [
    "model.layers.0.self_attn.q_proj", "model.layers.03.mlp.up_proj", "model.layers.3.mlp.down_proj",
    "model.sublayers.1.mlp.up_proj", "model.layers.+2.mlp.up_proj", "model.layers.1_0.mlp.up_proj",
    "model.layers.x.mlp.up_proj", "model.layers.0.lm_head_adapter", "model.layers.5.head.proj",
    "model.layers.5.Head", "model.layers.7.mlp.experts.gate", "model.layers.-4.mlp.up_proj",
    "model.layers.6.mlp.gate", "model.layers.6.router", "model.layers.6.moe.router.proj",
    "model.layers.6.mlp.shared_expert.up_proj", "model.layers.6.mlp.shared_experts_x.up_proj",
    "model.layers.6.mlp.shared_experts.down_proj", "model.embed_tokens", "lm_head", "wte",
    "transformer.h.0.attn.c_attn", "model.layers. 8 .mlp.up_proj", "model.layers.8__0.mlp.up_proj",
    "model.layers.4.layers.9.mlp.up_proj", "model.layers.2.mlp.wpe_bias", "model.layers.2.embed_out.x",
    "model.layers.2.output_proj_b", "model.layers.2.head_x.proj", "model.layers", "layers.12",
    "model.xlayers.11.mlp.up_proj", "model.layers.1.mlp.Gate", "model.layers.1.MLP.gate",
] + [f"model.layers.9.attn.{t}" for t in [
    "q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_a", "in_proj_b", "in_proj_z",
    "out_proj", "qkv_proj", "wqkv", "Wqkv", "attn_qkv", "WQKV", "Q_proj", "q_proj_x", "in_proj"]]


def name_rules(opt):
    out = []
    for n_protect in [1, 2, 5]:
        prot = set()
        prot |= opt._identify_output_layers(NAMES)
        prot |= opt._identify_moe_protected_layers(NAMES)
        prot |= opt._identify_boundary_layers(NAMES, n_protect)
        out.append({"n_protect": n_protect, "protected": [n in prot for n in NAMES]})
    return {"names": NAMES,
            "unprotected_boundary_off": [n not in (opt._identify_output_layers(NAMES)
                                                   | opt._identify_moe_protected_layers(NAMES))
                                         for n in NAMES],
            "block_index": [opt._block_index(n) for n in NAMES],
            "attention": [opt._is_attention_component(n) for n in NAMES],
            "by_n_protect": out}


# ---------------------------------------------------------------------------------------------
# list.sort with NaN keys, heapq with NaN
# ---------------------------------------------------------------------------------------------

def sort_cases():
    rng = random.Random(20260614)
    cases = []
    pool = [NAN, 0.0, -0.0, 1.0, 2.0, 3.0, 0.5, INF, -INF]
    for n in [0, 1, 2, 3, 5, 7, 8, 13, 31, 63, 64, 65, 100, 130, 257, 600]:
        for pattern in range(4):
            if pattern == 0:    # random small alphabet with NaN
                vals = [rng.choice(pool) for _ in range(n)]
            elif pattern == 1:  # long descending/ascending runs with sprinkled NaN (gallops)
                vals = sorted(round(rng.random(), 3) for _ in range(n))
                if rng.random() < 0.5:
                    vals.reverse()
                cut = rng.randrange(n + 1)
                vals = vals[cut:] + vals[:cut]
                for _ in range(max(1, n // 40)):
                    if n:
                        vals[rng.randrange(n)] = NAN
            elif pattern == 2:  # blocks of sorted runs, no NaN (a plain stable sort)
                vals = [float(rng.randrange(8)) for _ in range(n)]
                step = max(1, n // 6)
                vals = sum((sorted(vals[i:i + step], reverse=(i // step) % 2 == 1)
                            for i in range(0, n, step)), [])
            else:               # mostly NaN
                vals = [NAN if rng.random() < 0.7 else float(rng.randrange(4)) for _ in range(n)]
            order = sorted(range(n), key=lambda i: -vals[i])
            cases.append({"values": [repr(v) for v in vals], "order": order})
            if n < 200 or pattern:
                continue
            for nan_rate in [0.1, 0.3, 0.5]:
                vals = collapse_choice_values(rng, n, nan_rate)
                order = sorted(range(n), key=lambda i: -vals[i])
                cases.append({"values": [repr(v) for v in vals], "order": order})
    return cases


def _run_stack_needs_collapse_choice(lengths, n):
    """Whether CPython 3.11's merge_force_collapse would merge below the top for these natural
    run lengths (each >= minrun): a plain model of its powersort run stack, used only to pick
    inputs; the expected orders below always come from Python's own sorted()."""
    def power(s1, n1, n2):
        r, a = 0, 2 * s1 + n1
        b = a + n1 + n2
        while True:
            r += 1
            if a >= n:
                a, b = a - n, b - n
            elif b >= n:
                return r
            a, b = a << 1, b << 1
    stack, lo = [], 0
    for run in lengths:
        if stack:
            p = power(stack[-1][0], stack[-1][1], run)
            while len(stack) > 1 and stack[-2][2] > p:
                b, a = stack.pop(), stack.pop()
                stack.append([a[0], a[1] + b[1], a[2]])
            stack[-1][2] = p
        stack.append([lo, run, 0])
        lo += run
    while len(stack) > 1:
        k = len(stack) - 2
        if k > 0 and stack[k - 1][1] < stack[k + 1][1]:
            return True
        stack[k] = [stack[k][0], stack[k][1] + stack[k + 1][1], stack[k][2]]
        del stack[k + 1]
    return False


def collapse_choice_values(rng, n, nan_rate):
    """Natural runs (ascending keys, NaN inside, strict descents between) whose final collapse
    takes the `p[n-1].len < p[n+1].len` branch."""
    r, m = 0, n
    while m >= 64:
        r |= m & 1
        m >>= 1
    minrun = m + r
    while True:
        lengths, left = [], n
        while left:
            run = min(left, rng.randrange(minrun, max(minrun + 1, n // 2)))
            if left - run < minrun:
                run = left
            lengths.append(run)
            left -= run
        if _run_stack_needs_collapse_choice(lengths, n):
            break
    keys = []
    for j, run in enumerate(lengths):
        ks = sorted(round(rng.random(), 2) for _ in range(run))
        ks[0] = -1.0 - j  # below the previous run's last key: a strict descent ends that run
        keys += [k if i in (0, run - 1) or rng.random() > nan_rate else NAN for i, k in enumerate(ks)]
    return [-k for k in keys]


def heap_cases():
    rng = random.Random(99)
    cases = []
    for n_ops in [5, 20, 60, 200]:
        for _ in range(3):
            heap, ops, popped, k = [], [], [], 0
            for _ in range(n_ops):
                if heap and rng.random() < 0.35:
                    popped.append(heapq.heappop(heap)[1])
                    ops.append(None)
                else:
                    # float(...) makes a fresh object, as optiq's `-efficiency` does: tuple
                    # comparison treats an object as equal to itself, even a NaN.
                    neg = float(rng.choice(["nan", "-1.0", "-2.0", "-0.5", "-1.0", "-inf", "0.0"]))
                    klred = float(rng.choice(["0.1", "nan"]))
                    item = (neg, f"l{rng.randrange(50):02d}.{k}", 4, 8, klred)
                    k += 1
                    heapq.heappush(heap, item)
                    ops.append([repr(item[0]), item[1], item[2], item[3], repr(item[4])])
            while heap:
                popped.append(heapq.heappop(heap)[1])
                ops.append(None)
            cases.append({"ops": ops, "popped": popped})
    return cases


def run_case(opt, name, layers, o):
    results = [opt.SensitivityResult(layer_name=l["name"], sensitivities=dict(l["kl"]),
                                     param_count=l["params"]) for l in layers]
    with contextlib.redirect_stdout(io.StringIO()):
        res = opt.optimize_mixed_precision(
            results, target_bpw=o["target_bpw"], candidate_bits=o["candidate_bits"],
            protect_first_last=o["protect_first_last"], n_protect=o["n_protect"],
            n_floor_per_block=o["n_floor_per_block"], max_low_bit_run=o["max_low_bit_run"])
    return {
        "name": name,
        "layers": [{"name": l["name"], "params": l["params"],
                    "kl": {str(b): repr(v) for b, v in l["kl"].items()}} for l in layers],
        "options": dict(o, target_bpw=repr(o["target_bpw"])),
        "expected": {"bits": [c.bits for c in res.configs],
                     "achieved_bpw": repr(res.achieved_bpw),
                     "n_high": res.n_high_bits, "n_low": res.n_low_bits,
                     "estimated_mb": repr(res.estimated_size_mb)},
    }


def main():
    opt, digest = load_optimizer(sys.argv[1])
    out = {
        "source": "mlx-optiq 0.7.7 (PyPI wheel) " + OPTIMIZER_IN_WHEEL,
        "source_sha256": digest,
        "python": sys.version.split()[0],
        "cases": [run_case(opt, *c) for c in CASES],
        "name_rules": name_rules(opt),
        "sorts": sort_cases(),
        "heaps": heap_cases(),
    }
    json.dump(out, sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
