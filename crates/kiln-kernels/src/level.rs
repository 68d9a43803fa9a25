//! Instruction-set level: detected once, optionally lowered with `KILN_CPU_LEVEL`.

use std::sync::OnceLock;

/// A SIMD level the kernels are compiled for; ordered, so `a <= b` means "a is a subset".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CpuLevel {
    /// Portable Rust only.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// AVX2 level plus AVX-512 F/BW/VL and VNNI.
    Avx512,
}

impl CpuLevel {
    /// Every level, lowest first.
    pub const ALL: [CpuLevel; 3] = [CpuLevel::Scalar, CpuLevel::Avx2, CpuLevel::Avx512];

    /// Parses `scalar`, `avx2` or `avx512` (case-insensitive).
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "scalar" => Some(CpuLevel::Scalar),
            "avx2" => Some(CpuLevel::Avx2),
            "avx512" => Some(CpuLevel::Avx512),
            _ => None,
        }
    }

    /// Lowercase name, as accepted by [`CpuLevel::parse`].
    pub fn name(self) -> &'static str {
        match self {
            CpuLevel::Scalar => "scalar",
            CpuLevel::Avx2 => "avx2",
            CpuLevel::Avx512 => "avx512",
        }
    }

    /// This level lowered to what the hardware supports; the result is always safe to run.
    pub fn clamp_to_hardware(self) -> Self {
        self.min(hardware_level())
    }
}

/// The best level this CPU supports (ignores `KILN_CPU_LEVEL`).
pub fn hardware_level() -> CpuLevel {
    static HW: OnceLock<CpuLevel> = OnceLock::new();
    *HW.get_or_init(detect)
}

#[cfg(target_arch = "x86_64")]
fn detect() -> CpuLevel {
    let avx2 = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    if !avx2 {
        return CpuLevel::Scalar;
    }
    let avx512 = is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni");
    if avx512 {
        CpuLevel::Avx512
    } else {
        CpuLevel::Avx2
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> CpuLevel {
    CpuLevel::Scalar
}

/// The level kernels use: the hardware level, lowered by `KILN_CPU_LEVEL` if set (a request
/// above the hardware is clamped down; an unrecognised value is ignored).
pub fn cpu_level() -> CpuLevel {
    static LEVEL: OnceLock<CpuLevel> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let hw = hardware_level();
        match std::env::var("KILN_CPU_LEVEL")
            .ok()
            .as_deref()
            .and_then(CpuLevel::parse)
        {
            Some(req) => req.min(hw),
            None => hw,
        }
    })
}

/// All levels this machine can run, lowest first (what tests iterate over).
pub fn supported_levels() -> Vec<CpuLevel> {
    CpuLevel::ALL
        .into_iter()
        .filter(|l| *l <= hardware_level())
        .collect()
}
