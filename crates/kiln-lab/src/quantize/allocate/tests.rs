//! Tests of the allocator.
//!
//! The expected allocations come from optiq itself: `tests/data/allocate_oracle.py` runs
//! mlx-optiq 0.7.7's `optimize_mixed_precision` on the tables defined there and writes
//! `allocate_oracle.json` (inputs and outputs, floats as Python `repr`). Each rule below has a
//! table built so that breaking the rule changes the answer; the test names the layers the
//! rule decides, so a failure says which rule broke. The same file pins Python's `list.sort`
//! and `heapq` on NaN-laden inputs, and optiq's name rules.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde_json::Value;

use super::*;

const ORACLE: &str = include_str!("../../../tests/data/allocate_oracle.json");

fn oracle() -> &'static Value {
    static PARSED: OnceLock<Value> = OnceLock::new();
    PARSED.get_or_init(|| serde_json::from_str(ORACLE).expect("allocate_oracle.json parses"))
}

/// A float written by Python's `repr` (which round-trips, NaN and inf included).
fn py_float(v: &Value) -> f64 {
    let s = v.as_str().expect("a repr string");
    s.parse().unwrap_or_else(|_| panic!("{s} is a float"))
}

fn int(v: &Value) -> u64 {
    v.as_u64().expect("an unsigned integer")
}

/// One oracle case: the table, the options and optiq's answer.
struct Case {
    layers: Vec<LayerSensitivity>,
    opts: AllocatorOptions,
    expected: Allocation,
}

fn parse_layer(l: &Value) -> LayerSensitivity {
    let kl = l["kl"]
        .as_object()
        .expect("kl object")
        .iter()
        .map(|(b, v)| (b.parse().expect("bits key"), py_float(v)))
        .collect();
    LayerSensitivity {
        name: l["name"].as_str().expect("name").to_string(),
        param_count: int(&l["params"]),
        kl,
    }
}

fn parse_options(o: &Value) -> AllocatorOptions {
    let bits = o["candidate_bits"]
        .as_array()
        .map(|a| a.iter().map(|b| int(b) as u32).collect());
    AllocatorOptions {
        target_bpw: py_float(&o["target_bpw"]),
        candidate_bits: bits,
        protect_first_last: o["protect_first_last"].as_bool().expect("bool"),
        n_protect: int(&o["n_protect"]) as usize,
        n_floor_per_block: int(&o["n_floor_per_block"]) as usize,
        max_low_bit_run: int(&o["max_low_bit_run"]) as usize,
    }
}

fn parse_case(c: &Value) -> Case {
    let layers: Vec<LayerSensitivity> = c["layers"]
        .as_array()
        .expect("layers")
        .iter()
        .map(parse_layer)
        .collect();
    let e = &c["expected"];
    let bits = layers
        .iter()
        .zip(e["bits"].as_array().expect("bits"))
        .map(|(l, b)| (l.name.clone(), int(b) as u32))
        .collect();
    let expected = Allocation {
        bits,
        achieved_bpw: py_float(&e["achieved_bpw"]),
        n_high: int(&e["n_high"]) as usize,
        n_low: int(&e["n_low"]) as usize,
        estimated_mb: py_float(&e["estimated_mb"]),
    };
    Case {
        layers,
        opts: parse_options(&c["options"]),
        expected,
    }
}

fn case(name: &str) -> Case {
    let cases = oracle()["cases"].as_array().expect("cases");
    let c = cases
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no oracle case {name}"));
    parse_case(c)
}

/// Bit-for-bit equality with optiq's answer.
fn assert_same(got: &Allocation, want: &Allocation, label: &str) {
    assert_eq!(got.bits, want.bits, "{label}: bits");
    assert_eq!(
        got.achieved_bpw.to_bits(),
        want.achieved_bpw.to_bits(),
        "{label}: achieved_bpw {} vs {}",
        got.achieved_bpw,
        want.achieved_bpw
    );
    assert_eq!(
        (got.n_high, got.n_low),
        (want.n_high, want.n_low),
        "{label}: counts"
    );
    assert_eq!(
        got.estimated_mb.to_bits(),
        want.estimated_mb.to_bits(),
        "{label}: estimated_mb"
    );
}

/// Runs an oracle case and checks it against optiq.
fn run(name: &str) -> Allocation {
    let c = case(name);
    let got = allocate(&c.layers, &c.opts).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_same(&got, &c.expected, name);
    got
}

fn bits_of(a: &Allocation, name: &str) -> u32 {
    a.bits
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, b)| *b)
        .unwrap_or_else(|| panic!("no layer {name}"))
}

fn layer(name: &str, params: u64, kl: &[(u32, f64)]) -> LayerSensitivity {
    LayerSensitivity {
        name: name.to_string(),
        param_count: params,
        kl: kl.iter().copied().collect(),
    }
}

/// Options with protection, floor and run guard off: only the greedy decides.
fn greedy_only(target: f64, bits: &[u32]) -> AllocatorOptions {
    AllocatorOptions {
        target_bpw: target,
        candidate_bits: Some(bits.to_vec()),
        protect_first_last: false,
        n_protect: 1,
        n_floor_per_block: 0,
        max_low_bit_run: 0,
    }
}

fn config_field(r: Result<Allocation, LabError>) -> String {
    match r {
        Err(LabError::Config { field, .. }) => field,
        other => panic!("expected a config error, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Whole allocations against optiq
// ---------------------------------------------------------------------------------------------

#[test]
fn allocate_matches_optiq_on_every_oracle_case() {
    let cases = oracle()["cases"].as_array().expect("cases");
    assert!(cases.len() >= 20);
    for c in cases {
        let name = c["name"].as_str().expect("name");
        let c = parse_case(c);
        let got = allocate(&c.layers, &c.opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_same(&got, &c.expected, name);
    }
}

#[test]
fn allocate_reproduces_mlx_bun_documented_allocation() {
    // mlx-bun's tests/quantize-allocator.test.ts captured this from optiq on 2026-06-14; the
    // table is rebuilt here rather than read from the oracle file, as an independent check.
    let comps = [
        ("self_attn.q_proj", 1_048_576),
        ("self_attn.k_proj", 262_144),
        ("self_attn.v_proj", 262_144),
        ("self_attn.o_proj", 1_048_576),
        ("mlp.gate_proj", 3_145_728),
        ("mlp.up_proj", 3_145_728),
        ("mlp.down_proj", 3_145_728),
    ];
    let mut layers = Vec::new();
    for b in 0..3 {
        for (i, (c, p)) in comps.iter().enumerate() {
            let kl8 = f64::from(b + 1) * 0.001 * (1.0 + 0.1 * i as f64);
            layers.push(layer(
                &format!("model.layers.{b}.{c}"),
                *p,
                &[(4, 0.0), (8, kl8)],
            ));
        }
    }
    let opts = AllocatorOptions {
        target_bpw: 5.0,
        candidate_bits: Some(vec![4, 8]),
        ..AllocatorOptions::default()
    };
    let got = allocate(&layers, &opts).expect("allocates");
    let bits: Vec<u32> = got.bits.iter().map(|(_, b)| *b).collect();
    let want = [
        8, 8, 8, 4, 4, 4, 4, 8, 8, 4, 4, 4, 4, 4, 8, 8, 8, 8, 4, 8, 8,
    ];
    assert_eq!(bits, want);
    assert_eq!(got.achieved_bpw, 5.304347826086956);
    assert_eq!((got.n_high, got.n_low), (11, 10));
}

#[test]
fn defaults_are_optiqs_function_defaults() {
    let d = AllocatorOptions::default();
    assert_eq!(d.target_bpw, 4.0);
    assert_eq!(d.candidate_bits, None);
    assert!(d.protect_first_last);
    assert_eq!(
        (d.n_protect, d.n_floor_per_block, d.max_low_bit_run),
        (1, 2, 3)
    );
    run("three_tier_defaults");
}

// ---------------------------------------------------------------------------------------------
// The greedy's heap order
// ---------------------------------------------------------------------------------------------

#[test]
fn heap_tie_on_efficiency_is_broken_by_name_as_a_string() {
    // Equal efficiency and one upgrade to give: "layers.10" < "layers.9" as strings, though
    // layers.9 comes first in the input and has the lower block number.
    let a = run("heap_tie_broken_by_name");
    assert_eq!(bits_of(&a, "model.layers.10.mlp.up_proj"), 8);
    assert_eq!(bits_of(&a, "model.layers.9.mlp.up_proj"), 4);
}

#[test]
fn heap_entries_compare_like_python_tuples() {
    let names = ["b", "a", "a"];
    let u = |neg_eff, layer, old, klred| Upgrade {
        neg_eff,
        layer,
        old,
        new: 8,
        klred,
    };
    // -eff first (smaller = more efficient), then the name, then the remaining fields.
    assert!(upgrade_lt(&u(-2.0, 0, 4, 0.1), &u(-1.0, 1, 4, 0.1), &names));
    assert!(upgrade_lt(&u(-1.0, 1, 4, 0.1), &u(-1.0, 0, 4, 0.1), &names));
    assert!(upgrade_lt(&u(-1.0, 1, 2, 0.1), &u(-1.0, 2, 4, 0.1), &names));
    assert!(upgrade_lt(&u(-1.0, 1, 4, 0.1), &u(-1.0, 2, 4, 0.2), &names));
    // A NaN is not == to anything, so it decides — and is never less nor greater.
    let nan = f64::NAN;
    assert!(!upgrade_lt(&u(nan, 1, 4, 0.1), &u(-1.0, 0, 4, 0.1), &names));
    assert!(!upgrade_lt(&u(-1.0, 0, 4, 0.1), &u(nan, 1, 4, 0.1), &names));
    assert!(!upgrade_lt(
        &u(-1.0, 1, 4, nan),
        &u(-1.0, 2, 4, nan),
        &names
    ));
}

#[test]
fn duplicate_layer_names_are_refused() {
    // optiq keys its allocation by name, so two entries with one name would share a slot and
    // the heap would hold two entries comparing equal up to `old`: kiln refuses the table.
    let layers = [
        layer("model.layers.0.mlp.up_proj", 10, &[(4, 0.1), (8, 0.0)]),
        layer("model.layers.0.mlp.up_proj", 20, &[(4, 0.2), (8, 0.0)]),
    ];
    let field = config_field(allocate(&layers, &greedy_only(5.0, &[4, 8])));
    assert_eq!(field, "name");
}

#[test]
fn python_heapq_order_with_nan_entries_is_reproduced() {
    for (k, h) in oracle()["heaps"]
        .as_array()
        .expect("heaps")
        .iter()
        .enumerate()
    {
        let names: Vec<String> = h["ops"]
            .as_array()
            .expect("ops")
            .iter()
            .filter(|op| !op.is_null())
            .map(|op| op[1].as_str().expect("name").to_string())
            .collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let lt = |a: &Upgrade, b: &Upgrade| upgrade_lt(a, b, &refs);
        let mut heap = py_heap::Heap::default();
        let (mut popped, mut pushed) = (Vec::new(), 0);
        for op in h["ops"].as_array().expect("ops") {
            if op.is_null() {
                let u = heap.pop(&lt).expect("a heap entry");
                popped.push(names[u.layer].clone());
                continue;
            }
            let item = Upgrade {
                neg_eff: py_float(&op[0]),
                layer: pushed,
                old: int(&op[2]) as u32,
                new: int(&op[3]) as u32,
                klred: py_float(&op[4]),
            };
            pushed += 1;
            heap.push(item, &lt);
        }
        let want: Vec<String> = h["popped"]
            .as_array()
            .expect("popped")
            .iter()
            .map(|n| n.as_str().expect("name").to_string())
            .collect();
        assert_eq!(popped, want, "heap case {k}");
    }
}

// ---------------------------------------------------------------------------------------------
// Protection
// ---------------------------------------------------------------------------------------------

#[test]
fn protected_output_layer_is_upgraded_first() {
    // Raw efficiency: up_proj 0.05/4000 beats embed_tokens 0.01/16000; ×100 reverses it. The
    // average still counts real bits: 8·4000 + 4·1000 over 5000 = 7.2.
    let a = run("output_layer_boost");
    assert_eq!(bits_of(&a, "model.embed_tokens"), 8);
    assert_eq!(bits_of(&a, "model.layers.0.mlp.up_proj"), 4);
    assert_eq!(a.achieved_bpw, 7.2);
    // The same table under an unprotected name: the raw order wins.
    let c = case("output_layer_boost");
    let mut layers = c.layers;
    layers[1].name = "model.layers.0.mlp.down_proj".to_string();
    let b = allocate(&layers, &c.opts).expect("allocates");
    assert_eq!(bits_of(&b, "model.layers.0.mlp.up_proj"), 8);
    assert_eq!(bits_of(&b, "model.layers.0.mlp.down_proj"), 4);
    assert_eq!(b.achieved_bpw, 4.8);
}

#[test]
fn boundary_blocks_are_boosted_by_n_protect() {
    // KL at 4 bits per block: 0.010, 0.050, 0.040, 0.002; two upgrades to give.
    let a = run("boundary_boost");
    let bits: Vec<u32> = a.bits.iter().map(|(_, b)| *b).collect();
    assert_eq!(
        bits,
        [8, 4, 4, 8],
        "blocks 0 and 3 protected: boosted past 1 and 2"
    );
    let all = run("boundary_boost_n_protect_2");
    let bits: Vec<u32> = all.bits.iter().map(|(_, b)| *b).collect();
    assert_eq!(
        bits,
        [4, 8, 8, 4],
        "every block protected: the raw order again"
    );
    let off = run("boundary_off");
    let bits: Vec<u32> = off.bits.iter().map(|(_, b)| *b).collect();
    assert_eq!(bits, [4, 8, 8, 4], "protect_first_last false");
}

#[test]
fn moe_routers_and_shared_experts_are_boosted() {
    let a = run("moe_boost");
    assert_eq!(bits_of(&a, "model.layers.1.mlp.gate"), 8);
    assert_eq!(bits_of(&a, "model.layers.1.router.proj"), 8);
    assert_eq!(
        bits_of(&a, "model.layers.1.mlp.shared_experts.down_proj"),
        8
    );
    // gate_proj has ten times the router's KL but no bonus; `experts.gate` is not a router.
    assert_eq!(bits_of(&a, "model.layers.1.mlp.gate_proj"), 4);
    assert_eq!(bits_of(&a, "model.layers.1.mlp.experts.gate"), 4);
}

#[test]
fn name_rules_match_optiq() {
    let rules = &oracle()["name_rules"];
    let names: Vec<&str> = rules["names"]
        .as_array()
        .expect("names")
        .iter()
        .map(|n| n.as_str().expect("name"))
        .collect();
    for (i, n) in names.iter().enumerate() {
        let want_block = rules["block_index"][i].as_i64().map(i128::from);
        assert_eq!(block_index(n), want_block, "block index of {n}");
        let want_attn = rules["attention"][i].as_bool().expect("bool");
        assert_eq!(is_attention_component(n), want_attn, "attention {n}");
        let unprotected = rules["unprotected_boundary_off"][i]
            .as_bool()
            .expect("bool");
        assert_eq!(
            protected_layers(&names, false, 1)[i],
            !unprotected,
            "protection of {n}"
        );
    }
    for by in rules["by_n_protect"].as_array().expect("by_n_protect") {
        let k = int(&by["n_protect"]) as usize;
        let got = protected_layers(&names, true, k);
        for (i, n) in names.iter().enumerate() {
            let want = by["protected"][i].as_bool().expect("bool");
            assert_eq!(got[i], want, "n_protect {k}: {n}");
        }
    }
}

#[test]
fn is_protected_follows_the_rules_for_contiguous_blocks() {
    assert!(is_protected("lm_head", 4, 1));
    assert!(is_protected("model.embed_tokens", 4, 1));
    assert!(is_protected("model.norm", 4, 1), "no `layers` segment");
    assert!(is_protected("model.layers.2.mlp.gate", 4, 1));
    assert!(is_protected(
        "model.layers.2.mlp.shared_expert.up_proj",
        4,
        1
    ));
    assert!(is_protected("model.layers.0.mlp.up_proj", 4, 1));
    assert!(is_protected("model.layers.3.mlp.up_proj", 4, 1));
    assert!(!is_protected("model.layers.1.mlp.up_proj", 4, 1));
    assert!(is_protected("model.layers.1.mlp.up_proj", 4, 2));
    assert!(
        !is_protected("model.layers.0.mlp.up_proj", 4, 0),
        "n_protect 0: no block"
    );
    // The same answers as the allocator's rule on a full 0..n model.
    let names: Vec<String> = (0..6)
        .flat_map(|b| {
            ["self_attn.q_proj", "mlp.gate", "mlp.down_proj"]
                .map(|c| format!("model.layers.{b}.{c}"))
        })
        .chain(["lm_head".to_string()])
        .collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    for k in 1..=4 {
        let exact = protected_layers(&refs, true, k);
        for (n, want) in refs.iter().zip(exact) {
            assert_eq!(is_protected(n, 6, k), want, "{n} with n_protect {k}");
        }
    }
}

#[test]
fn python_int_accepts_what_int_accepts() {
    for (s, want) in [
        ("7", Some(7)),
        ("007", Some(7)),
        ("+2", Some(2)),
        ("-4", Some(-4)),
        ("1_0", Some(10)),
        (" 8 ", Some(8)),
        ("\t9\n", Some(9)),
        ("\u{3000}5", Some(5)),
        ("8__0", None),
        ("_1", None),
        ("1_", None),
        ("- 1", None),
        ("x", None),
        ("", None),
        ("+", None),
        ("\x1c3", None),
        ("1e3", None),
    ] {
        assert_eq!(python_int(s), want, "int({s:?})");
    }
}

// ---------------------------------------------------------------------------------------------
// NaN
// ---------------------------------------------------------------------------------------------

#[test]
fn nan_sensitivities_become_large_values() {
    let kl: BTreeMap<u32, f64> = [(2, f64::NAN), (4, 0.02), (8, 0.01)].into_iter().collect();
    let fixed = clean_nan(&kl, 8);
    // maxFinite 0.02, ·10·(8/2).
    assert_eq!(fixed[&2], 0.02 * 10.0 * 4.0);
    assert_eq!((fixed[&4], fixed[&8]), (0.02, 0.01));
    let all_nan: BTreeMap<u32, f64> = [(4, f64::NAN), (8, f64::NAN)].into_iter().collect();
    let fixed = clean_nan(&all_nan, 8);
    assert_eq!(
        (fixed[&4], fixed[&8]),
        (2e7, 1e7),
        "maxFinite falls back to 1e6"
    );
    let clean: BTreeMap<u32, f64> = [(4, 0.5)].into_iter().collect();
    assert_eq!(clean_nan(&clean, 8), clean);
}

#[test]
fn nan_layer_is_treated_as_sensitive() {
    let a = run("nan_layers");
    // All-NaN q_proj (4e7 at 2 bits) goes to the top; gate_proj's NaN at 8 bits becomes
    // 0.3·10 = 3.0 > kl[4], which reads as uniform-reference mode: a big benefit.
    assert_eq!(bits_of(&a, "model.layers.0.self_attn.q_proj"), 8);
    assert_eq!(bits_of(&a, "model.layers.0.mlp.gate_proj"), 8);
    assert_eq!(bits_of(&a, "model.layers.0.mlp.up_proj"), 4);
    assert_eq!(bits_of(&a, "model.layers.0.self_attn.k_proj"), 2);
}

#[test]
fn floor_sorts_raw_nan_keys_like_python() {
    // kl[2] of q, k, v, o = 0.03, NaN, 0.05, 0.01. optiq's floor runs before NaN cleaning:
    // in CPython's sort the NaN-keyed k_proj keeps q, k, v, o in input order, so the two
    // reserved attention slots go to q and k — not to v (the largest number) nor k alone.
    let a = run("nan_in_floor_sort");
    assert_eq!(bits_of(&a, "model.layers.0.self_attn.q_proj"), 4);
    assert_eq!(bits_of(&a, "model.layers.0.self_attn.k_proj"), 4);
    assert_eq!(bits_of(&a, "model.layers.0.self_attn.v_proj"), 2);
    assert_eq!(
        bits_of(&a, "model.layers.0.mlp.gate_proj"),
        4,
        "third slot: most sensitive"
    );
}

#[test]
fn infinite_kl_gives_nan_efficiencies_ordered_like_heapq() {
    run("inf_kl_nan_efficiency");
}

// ---------------------------------------------------------------------------------------------
// Block-aware floor
// ---------------------------------------------------------------------------------------------

#[test]
fn block_floor_reserves_attention() {
    let a = run("block_floor_attention");
    // Block 0, full attention: the MLP is far more sensitive, yet both slots go to the two
    // most sensitive attention projections (k 0.03, v 0.02).
    for (c, want) in [
        ("self_attn.k_proj", 4),
        ("self_attn.v_proj", 4),
        ("self_attn.o_proj", 2),
        ("self_attn.q_proj", 2),
        ("mlp.down_proj", 2),
        ("mlp.gate_proj", 2),
    ] {
        assert_eq!(
            bits_of(&a, &format!("model.layers.0.{c}")),
            want,
            "block 0 {c}"
        );
    }
    // Block 1, linear attention (2 projections): one slot, reserved for out_proj.
    assert_eq!(bits_of(&a, "model.layers.1.linear_attn.out_proj"), 4);
    assert_eq!(bits_of(&a, "model.layers.1.linear_attn.in_proj_qkv"), 2);
    assert_eq!(bits_of(&a, "model.layers.1.mlp.up_proj"), 2);
    // Block 2, no attention: one slot, the most sensitive layer.
    assert_eq!(bits_of(&a, "model.layers.2.mixer.in_proj"), 4);
    assert_eq!(bits_of(&a, "model.layers.2.mixer.x_proj"), 2);
    // Block 3, tied attention KLs: the stable sort keeps input order (q, k).
    assert_eq!(bits_of(&a, "model.layers.3.self_attn.q_proj"), 4);
    assert_eq!(bits_of(&a, "model.layers.3.self_attn.k_proj"), 4);
    assert_eq!(bits_of(&a, "model.layers.3.self_attn.v_proj"), 2);
    // Outside any block: untouched by the floor (and the target is already met).
    assert_eq!(bits_of(&a, "lm_head"), 2);
}

#[test]
fn block_floor_fills_remaining_slots_by_sensitivity() {
    let a = run("block_floor_three");
    // n_floor 3 in a full-attention block: two attention slots, then the most sensitive rest.
    assert_eq!(bits_of(&a, "model.layers.0.mlp.down_proj"), 4);
    assert_eq!(bits_of(&a, "model.layers.0.mlp.gate_proj"), 2);
    // Other blocks stay capped at one.
    assert_eq!(bits_of(&a, "model.layers.1.mlp.up_proj"), 2);
    assert_eq!(bits_of(&a, "model.layers.2.mixer.x_proj"), 2);
    // The tied block takes its third slot from the top of the stable order (v_proj).
    assert_eq!(bits_of(&a, "model.layers.3.self_attn.v_proj"), 4);
}

// ---------------------------------------------------------------------------------------------
// Run guard
// ---------------------------------------------------------------------------------------------

#[test]
fn run_guard_lifts_every_max_run_th_block_of_long_runs() {
    let a = run("run_guard");
    let lifted: Vec<&str> = a
        .bits
        .iter()
        .filter(|(_, b)| *b == 4)
        .map(|(n, _)| n.as_str())
        .collect();
    // Greedy: block 4 (both) and 8 (one of two: exactly half, so not low-dominated).
    // Runs: 0-3 (4 > 3: blocks 0 and 3), 5-7 (3: left alone), 9-13 (5: blocks 9 and 12),
    // each time the layer with the larger KL at 2 bits.
    assert_eq!(
        lifted,
        [
            "model.layers.0.mlp.down_proj",
            "model.layers.3.mlp.down_proj",
            "model.layers.4.mlp.up_proj",
            "model.layers.4.mlp.down_proj",
            "model.layers.8.mlp.up_proj",
            "model.layers.9.mlp.up_proj",
            "model.layers.12.mlp.up_proj",
        ]
    );
}

#[test]
fn run_guard_counts_runs_in_sorted_index_order() {
    // Blocks 0, 2, 4, … are adjacent for the guard: one run of six, stride 2 → 0, 4, 8.
    let a = run("run_guard_sparse_indices");
    for b in [0, 4, 8] {
        assert_eq!(
            bits_of(&a, &format!("model.layers.{b}.mlp.up_proj")),
            4,
            "block {b}"
        );
    }
    for b in [2, 6, 10] {
        assert_eq!(
            bits_of(&a, &format!("model.layers.{b}.mlp.up_proj")),
            2,
            "block {b}"
        );
    }
}

#[test]
fn long_runs_finds_runs_longer_than_max() {
    let f = [
        true, true, true, true, false, true, true, true, false, true, true,
    ];
    assert_eq!(long_runs(&f, 3), [(0, 4)]);
    assert_eq!(long_runs(&f, 2), [(0, 4), (5, 8)]);
    assert_eq!(long_runs(&f, 1), [(0, 4), (5, 8), (9, 11)]);
    assert_eq!(long_runs(&[], 1), []);
}

// ---------------------------------------------------------------------------------------------
// Target
// ---------------------------------------------------------------------------------------------

#[test]
fn target_already_met_at_min_bits_upgrades_nothing() {
    // Everything at 4 bits averages exactly 4.0, which is not below the target.
    let a = run("target_met_at_min_bits");
    assert!(a.bits.iter().all(|(_, b)| *b == 4));
    assert_eq!(a.achieved_bpw, 4.0);
    assert_eq!(a.n_low, a.bits.len());
}

#[test]
fn unreachable_target_stops_when_nothing_is_left() {
    // 16 bpw from [4, 8]: every layer that gains from 8 bits gets it; down_proj (same KL at 4
    // and 8: no reduction) stays. The loop ends with the heap, below the target.
    let a = run("target_unreachable");
    assert_eq!(bits_of(&a, "model.layers.0.mlp.up_proj"), 8);
    assert_eq!(
        bits_of(&a, "model.layers.1.mlp.up_proj"),
        8,
        "uniform-reference gain"
    );
    assert_eq!(bits_of(&a, "model.layers.0.mlp.down_proj"), 4);
    assert_eq!(a.achieved_bpw, 6.0);
    // With every layer gaining, all reach the maximum.
    let layers = [
        layer("model.layers.0.mlp.up_proj", 10, &[(4, 0.2), (8, 0.1)]),
        layer("model.layers.0.mlp.down_proj", 30, &[(4, 0.3), (8, 0.2)]),
    ];
    let all = allocate(&layers, &greedy_only(16.0, &[4, 8])).expect("allocates");
    assert_eq!((all.achieved_bpw, all.n_high, all.n_low), (8.0, 2, 0));
}

#[test]
fn candidate_bits_are_inferred_from_the_table() {
    // Union {2, 3, 4, 8}; a width a layer lacks counts as KL 0 (down_proj of block 0 jumps
    // 2 → 3 for its whole kl[2]).
    run("inferred_candidate_bits");
    // No widths at all: [4, 8]; nothing has a KL reduction, only the floor acts.
    let a = run("no_kl_keys_default_4_8");
    assert_eq!((a.n_high, a.n_low), (4, 10));
}

#[test]
fn given_candidate_bits_are_sorted() {
    let layers = [
        layer(
            "model.layers.0.mlp.up_proj",
            10,
            &[(2, 0.5), (4, 0.2), (8, 0.1)],
        ),
        layer(
            "model.layers.0.mlp.down_proj",
            10,
            &[(2, 0.4), (4, 0.3), (8, 0.2)],
        ),
    ];
    let a = allocate(&layers, &greedy_only(1.0, &[8, 2, 4])).expect("allocates");
    assert!(
        a.bits.iter().all(|(_, b)| *b == 2),
        "lowest is 2, not the first listed"
    );
    assert_eq!((a.n_high, a.n_low), (0, 2));
}

#[test]
fn empty_table_gives_an_empty_allocation() {
    let a = allocate(&[], &AllocatorOptions::default()).expect("allocates");
    assert_eq!(a, Allocation::default());
}

// ---------------------------------------------------------------------------------------------
// Bad input
// ---------------------------------------------------------------------------------------------

#[test]
fn bad_options_are_config_errors_naming_the_field() {
    let layers = [layer(
        "model.layers.0.mlp.up_proj",
        10,
        &[(4, 0.2), (8, 0.1)],
    )];
    let with = |f: &dyn Fn(&mut AllocatorOptions)| {
        let mut o = AllocatorOptions::default();
        f(&mut o);
        config_field(allocate(&layers, &o))
    };
    for t in [f64::NAN, f64::INFINITY, 0.5, 16.5, -4.0] {
        assert_eq!(with(&|o| o.target_bpw = t), "target_bpw", "target {t}");
    }
    for bits in [vec![], vec![0, 4], vec![4, 17], vec![4, 4, 8]] {
        let b = bits.clone();
        assert_eq!(
            with(&|o| o.candidate_bits = Some(b.clone())),
            "candidate_bits",
            "{bits:?}"
        );
    }
    assert_eq!(with(&|o| o.n_protect = 0), "n_protect");
    // n_protect 0 is fine once boundary protection is off.
    let mut o = AllocatorOptions {
        protect_first_last: false,
        n_protect: 0,
        ..AllocatorOptions::default()
    };
    assert!(allocate(&layers, &o).is_ok());
    o.target_bpw = 16.0;
    assert!(allocate(&layers, &o).is_ok(), "16 is allowed");
}

#[test]
fn bad_layers_are_config_errors_naming_the_field() {
    let opts = AllocatorOptions::default();
    let zero = [layer("model.layers.0.mlp.up_proj", 0, &[(4, 0.2)])];
    assert_eq!(config_field(allocate(&zero, &opts)), "param_count");
    let empty = [layer("", 10, &[(4, 0.2)])];
    assert_eq!(config_field(allocate(&empty, &opts)), "name");
    let huge = [
        layer("model.layers.0.mlp.up_proj", u64::MAX, &[(4, 0.2)]),
        layer("model.layers.1.mlp.up_proj", u64::MAX, &[(4, 0.2)]),
    ];
    assert_eq!(config_field(allocate(&huge, &opts)), "param_count");
    // Inferred widths are checked like given ones.
    let odd = [layer(
        "model.layers.0.mlp.up_proj",
        10,
        &[(0, 0.2), (4, 0.1)],
    )];
    assert_eq!(config_field(allocate(&odd, &opts)), "kl");
    let wide = [layer(
        "model.layers.0.mlp.up_proj",
        10,
        &[(4, 0.2), (32, 0.1)],
    )];
    assert_eq!(config_field(allocate(&wide, &opts)), "kl");
}

// ---------------------------------------------------------------------------------------------
// Python's list.sort
// ---------------------------------------------------------------------------------------------

#[test]
fn python_sort_order_with_nan_keys_is_reproduced() {
    for (k, s) in oracle()["sorts"]
        .as_array()
        .expect("sorts")
        .iter()
        .enumerate()
    {
        let vals: Vec<f64> = s["values"]
            .as_array()
            .expect("values")
            .iter()
            .map(py_float)
            .collect();
        let want: Vec<usize> = s["order"]
            .as_array()
            .expect("order")
            .iter()
            .map(|i| int(i) as usize)
            .collect();
        // `sorted(range(n), key=lambda i: -vals[i])`
        let mut order: Vec<usize> = (0..vals.len()).collect();
        py_sort::sort(&mut order, &|a: &usize, b: &usize| -vals[*a] < -vals[*b]);
        assert_eq!(order, want, "sort case {k} (n = {})", vals.len());
    }
}

#[test]
fn python_sort_is_a_stable_sort_for_consistent_keys() {
    // A small xorshift: long mostly-ordered stretches to make the merges gallop.
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for n in [2, 10, 64, 65, 200, 1000, 5000] {
        let mut keys: Vec<u64> = (0..n).map(|_| next() % 50).collect();
        let cut = n / 3;
        keys[..cut].sort_unstable();
        keys[cut..2 * cut].sort_unstable_by(|a, b| b.cmp(a));
        let mut got: Vec<usize> = (0..n).collect();
        py_sort::sort(&mut got, &|a: &usize, b: &usize| keys[*a] < keys[*b]);
        let mut want: Vec<usize> = (0..n).collect();
        want.sort_by_key(|&i| keys[i]);
        assert_eq!(got, want, "n = {n}");
    }
}
