//! `KILN_CPU_LEVEL` lowers the level (own test binary: the level is cached process-wide).

use kiln_kernels::*;

#[test]
fn env_override_lowers_level_and_never_exceeds_hardware() {
    // SAFETY: this binary has a single test, so no other thread reads the environment.
    unsafe { std::env::set_var("KILN_CPU_LEVEL", "scalar") };
    assert_eq!(cpu_level(), CpuLevel::Scalar);
    assert_eq!(CpuLevel::Avx512.clamp_to_hardware(), hardware_level());
    assert_eq!(CpuLevel::parse("AVX2"), Some(CpuLevel::Avx2));
    assert_eq!(CpuLevel::parse("sse"), None);
    let levels = supported_levels();
    assert_eq!(levels[0], CpuLevel::Scalar);
    assert_eq!(*levels.last().unwrap(), hardware_level());
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512vnni")
        && std::is_x86_feature_detected!("avx512bw")
        && std::is_x86_feature_detected!("avx512vl")
        && std::is_x86_feature_detected!("avx2")
        && std::is_x86_feature_detected!("fma")
    {
        assert_eq!(hardware_level(), CpuLevel::Avx512);
    }
    // AVX-VNNI is its own feature: a CPU with AVX-512 VNNI alone must not be offered it.
    assert_eq!(CpuLevel::parse("avx_vnni"), Some(CpuLevel::AvxVnni));
    #[cfg(target_arch = "x86_64")]
    {
        let vnni =
            std::is_x86_feature_detected!("avxvnni") && std::is_x86_feature_detected!("avx2");
        assert_eq!(hardware_supports(CpuLevel::AvxVnni), vnni);
        assert_eq!(levels.contains(&CpuLevel::AvxVnni), vnni);
        let want = if vnni {
            CpuLevel::AvxVnni
        } else {
            CpuLevel::Avx2.clamp_to_hardware()
        };
        assert_eq!(CpuLevel::AvxVnni.clamp_to_hardware(), want);
    }
    println!("hardware level: {:?}, levels {levels:?}", hardware_level());
}
