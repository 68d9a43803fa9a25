// Throughput of the 256-bit instructions the AVX2 kernels lean on: eight independent chains of
// one instruction in a loop, per cycle of a clock measured with a chain of dependent integer
// adds (one cycle each). Says how many integer multiplies (`vpmaddubsw`, `vpmaddwd`) a core
// issues per cycle, which bounds the quantized matmuls (docs/benchmarks.md, issue 20). The last
// line mixes three `vpmaddubsw` chains with six `vpaddw` chains, the ratio of a kernel's 16-bit
// sums to its multiplies: whether the adds take the multiplier's pipe.
//   gcc -O2 -mavx2 bench/mulrate.c -o /tmp/mulrate && /tmp/mulrate
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define CHAINS8(ins, a, src)                                                              \
    __asm__ volatile(ins " %8, %0, %0\n\t" ins " %8, %1, %1\n\t" ins " %8, %2, %2\n\t"      \
                     ins " %8, %3, %3\n\t" ins " %8, %4, %4\n\t" ins " %8, %5, %5\n\t"      \
                     ins " %8, %6, %6\n\t" ins " %8, %7, %7\n\t"                            \
                     : "+x"(a##0), "+x"(a##1), "+x"(a##2), "+x"(a##3), "+x"(a##4),          \
                       "+x"(a##5), "+x"(a##6), "+x"(a##7)                                  \
                     : "x"(src))

#define RATE(name, ins, type, init, src)                                                  \
    do {                                                                                  \
        /* Eight named variables: an array would live in memory, not registers. */      \
        type a0 = init, a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;   \
        double t0 = now();                                                                \
        for (long i = 0; i < M; i++) CHAINS8(ins, a, src);                                \
        double t1 = now();                                                                \
        printf("%-11s %.2f per cycle\n", name, 8.0 * M / ((t1 - t0) * ghz * 1e9));       \
        sink ^= ((volatile char *)&a0)[0] ^ ((volatile char *)&a7)[0];                   \
    } while (0)

static volatile char sink;

int main(void) {
    const long N = 200000000, M = 100000000;
    uint64_t x = 1;
    double t0 = now();
    for (long i = 0; i < N; i++)
        __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
    double ghz = 4.0 * N / (now() - t0) / 1e9;
    printf("clock       ~%.2f GHz\n", ghz);
    __m256i b = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
    __m256 f = _mm256_set1_ps(1.0000001f);
    RATE("vpmaddubsw", "vpmaddubsw", __m256i, _mm256_set1_epi8(1), b);
    RATE("vpmaddwd", "vpmaddwd", __m256i, _mm256_set1_epi8(1), ones);
    RATE("vpaddw", "vpaddw", __m256i, _mm256_set1_epi8(1), b);
    RATE("vpsignb", "vpsignb", __m256i, _mm256_set1_epi8(1), b);
    RATE("vmulps", "vmulps", __m256, _mm256_set1_ps(1.0f), f);
    RATE("vaddps", "vaddps", __m256, _mm256_set1_ps(1.0f), f);
    {
        __m256i m0 = _mm256_set1_epi8(1), m1 = m0, m2 = m0, d0 = m0, d1 = m0, d2 = m0, d3 = m0,
                d4 = m0, d5 = m0;
        double t0 = now();
        for (long i = 0; i < M; i++)
            __asm__ volatile("vpmaddubsw %9, %0, %0\n\tvpaddw %9, %3, %3\n\tvpaddw %9, %4, %4\n\t"
                             "vpmaddubsw %9, %1, %1\n\tvpaddw %9, %5, %5\n\tvpaddw %9, %6, %6\n\t"
                             "vpmaddubsw %9, %2, %2\n\tvpaddw %9, %7, %7\n\tvpaddw %9, %8, %8\n\t"
                             : "+x"(m0), "+x"(m1), "+x"(m2), "+x"(d0), "+x"(d1), "+x"(d2),
                               "+x"(d3), "+x"(d4), "+x"(d5)
                             : "x"(b));
        double t1 = now();
        printf("%-11s %.2f vpmaddubsw per cycle with 2 vpaddw each\n", "mixed",
               3.0 * M / ((t1 - t0) * ghz * 1e9));
        sink ^= ((volatile char *)&m0)[0] ^ ((volatile char *)&d5)[0];
    }
    return 0;
}
