//! Instruction-set level: detected once, optionally lowered with `KILN_CPU_LEVEL`.

use std::sync::OnceLock;

/// A SIMD level the kernels are compiled for, ordered by preference: a higher level's kernels
/// are chosen over a lower one's. Every level above `Scalar` includes the AVX2 set, but
/// `AvxVnni` is not part of `Avx512` (Ice Lake servers and Zen 4 have AVX-512 VNNI without
/// the VEX-encoded AVX-VNNI), so which levels a CPU runs is a set ([`hardware_supports`]), not a
/// prefix, and [`CpuLevel::clamp_to_hardware`] picks from that set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CpuLevel {
    /// Portable Rust only.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// The AVX2 level plus AVX-VNNI (`vpdpbusd` on `ymm`), as Alder Lake and later Intel
    /// cores and Zen 5 have it.
    AvxVnni,
    /// AVX2 level plus AVX-512 F/BW/VL and VNNI.
    Avx512,
}

impl CpuLevel {
    /// Every level, lowest first.
    pub const ALL: [CpuLevel; 4] = [
        CpuLevel::Scalar,
        CpuLevel::Avx2,
        CpuLevel::AvxVnni,
        CpuLevel::Avx512,
    ];

    /// Parses `scalar`, `avx2`, `avxvnni` (also `avx_vnni`, `avx-vnni`) or `avx512`
    /// (case-insensitive).
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "scalar" => Some(CpuLevel::Scalar),
            "avx2" => Some(CpuLevel::Avx2),
            "avxvnni" | "avx_vnni" | "avx-vnni" => Some(CpuLevel::AvxVnni),
            "avx512" => Some(CpuLevel::Avx512),
            _ => None,
        }
    }

    /// Lowercase name, as accepted by [`CpuLevel::parse`].
    pub fn name(self) -> &'static str {
        match self {
            CpuLevel::Scalar => "scalar",
            CpuLevel::Avx2 => "avx2",
            CpuLevel::AvxVnni => "avxvnni",
            CpuLevel::Avx512 => "avx512",
        }
    }

    /// The highest level at or below this one that the hardware supports; the result is
    /// always safe to run.
    pub fn clamp_to_hardware(self) -> Self {
        hardware().clamped[self as usize]
    }
}

/// What the CPU runs, detected once: `supports[l]` for each level of [`CpuLevel::ALL`], and
/// `clamped[l]`, the answer of [`CpuLevel::clamp_to_hardware`] (kernels ask it per call).
struct Hardware {
    supports: [bool; 4],
    clamped: [CpuLevel; 4],
}

fn hardware() -> &'static Hardware {
    static HW: OnceLock<Hardware> = OnceLock::new();
    HW.get_or_init(|| {
        let supports = detect();
        let clamped = CpuLevel::ALL.map(|req| {
            CpuLevel::ALL
                .into_iter()
                .rev()
                .find(|l| *l <= req && supports[*l as usize])
                .unwrap_or(CpuLevel::Scalar)
        });
        Hardware { supports, clamped }
    })
}

/// Whether this CPU can run the kernels of `level`.
pub fn hardware_supports(level: CpuLevel) -> bool {
    hardware().supports[level as usize]
}

/// The best level this CPU supports (ignores `KILN_CPU_LEVEL`).
pub fn hardware_level() -> CpuLevel {
    CpuLevel::Avx512.clamp_to_hardware()
}

/// Which of [`CpuLevel::ALL`] the CPU runs.
#[cfg(target_arch = "x86_64")]
fn detect() -> [bool; 4] {
    let avx2 = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    let avx_vnni = avx2 && is_x86_feature_detected!("avxvnni");
    let avx512 = avx2
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni");
    [true, avx2, avx_vnni, avx512]
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> [bool; 4] {
    [true, false, false, false]
}

/// The level kernels use: the hardware level, lowered by `KILN_CPU_LEVEL` if set (a request
/// the hardware cannot run is lowered to the next level it can; an unrecognised value is
/// ignored).
pub fn cpu_level() -> CpuLevel {
    static LEVEL: OnceLock<CpuLevel> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let hw = hardware_level();
        match std::env::var("KILN_CPU_LEVEL")
            .ok()
            .as_deref()
            .and_then(CpuLevel::parse)
        {
            Some(req) => req.min(hw).clamp_to_hardware(),
            None => hw,
        }
    })
}

/// All levels this machine can run, lowest first (what tests iterate over).
pub fn supported_levels() -> Vec<CpuLevel> {
    CpuLevel::ALL
        .into_iter()
        .filter(|l| hardware_supports(*l))
        .collect()
}
