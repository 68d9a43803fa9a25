// Throughput of the 256-bit instructions the AVX2 kernels lean on: eight independent chains of
// one instruction in a loop, per cycle of a clock measured with a chain of dependent integer
// adds (one cycle each). Says how many integer multiplies (`vpmaddubsw`, `vpmaddwd`) a core
// issues per cycle, which bounds the quantized matmuls (docs/benchmarks.md, issue 20).
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
    return 0;
}
