// Throughput of the integer multiply instructions the AVX-512 and AVX-VNNI kernels lean on
// (`vpdpbusd` on zmm and ymm, EVEX and VEX encodings, `vpdpwssd`, `vpmulld`, `vpmaddubsw`,
// `vpmaddwd`): eight independent chains of one instruction, per cycle of a clock measured with
// a chain of dependent integer adds. Bounds the repacked prefill kernels: at two `vpdpbusd` zmm
// per cycle a core does 128 8-bit multiply-adds per cycle (docs/benchmarks.md, issue 36).
//   gcc -O2 -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mavxvnni bench/vnnirate.c -o /tmp/vnnirate
//   /tmp/vnnirate
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

// Eight chains into registers 0-7, sources 8 and 9 (never written).
#define CHAINS(ins, r)                                                                         \
    __asm__ volatile(ins " %%" r "8, %%" r "9, %%" r "0\n\t" ins " %%" r "8, %%" r "9, %%" r  \
                     "1\n\t" ins " %%" r "8, %%" r "9, %%" r "2\n\t" ins " %%" r "8, %%" r     \
                     "9, %%" r "3\n\t" ins " %%" r "8, %%" r "9, %%" r "4\n\t" ins " %%" r    \
                     "8, %%" r "9, %%" r "5\n\t" ins " %%" r "8, %%" r "9, %%" r "6\n\t" ins  \
                     " %%" r "8, %%" r "9, %%" r "7\n\t" ::                                    \
                         : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7")

#define RATE(name, body)                                                                       \
    do {                                                                                       \
        double t0 = now();                                                                     \
        for (long i = 0; i < M; i++) {                                                         \
            body;                                                                              \
        }                                                                                      \
        printf("%-22s %.2f per cycle\n", name, 8.0 * M / ((now() - t0) * ghz * 1e9));         \
    } while (0)

int main(void) {
    const long N = 200000000, M = 50000000;
    uint64_t x = 1;
    double t0 = now();
    for (long i = 0; i < N; i++)
        __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
    double ghz = 4.0 * N / (now() - t0) / 1e9;
    printf("clock                  ~%.2f GHz\n", ghz);
    RATE("vpdpbusd zmm", CHAINS("vpdpbusd", "zmm"));
    RATE("vpdpbusd ymm (EVEX)", CHAINS("vpdpbusd", "ymm"));
    RATE("vpdpbusd ymm (VEX)", CHAINS("%{vex%} vpdpbusd", "ymm"));
    RATE("vpdpwssd zmm", CHAINS("vpdpwssd", "zmm"));
    RATE("vpmulld zmm", CHAINS("vpmulld", "zmm"));
    RATE("vpmaddubsw zmm", CHAINS("vpmaddubsw", "zmm"));
    RATE("vpmaddwd zmm", CHAINS("vpmaddwd", "zmm"));
    RATE("vpmaddubsw ymm", CHAINS("vpmaddubsw", "ymm"));
    return 0;
}
