// Read bandwidth of this machine: T threads each sum a private 512 MiB buffer with AVX-512
// loads (AVX2 loads when built without AVX-512), best of 5. Build and run:
//   gcc -O2 -march=native -pthread bench/membw.c -o /tmp/membw && /tmp/membw 2
// With HUGE=1 in the environment the buffers are advised MADV_HUGEPAGE (2 MiB pages, as kiln's
// weights: kiln-kernels/src/arena.rs); without it they use the system's default pages.
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#define BYTES (512ul << 20)
static char *bufs[8];
static volatile double sink;
#ifdef __AVX512F__
static void *run(void *arg) {
    char *b = bufs[(long)arg];
    __m512i acc = _mm512_setzero_si512();
    for (size_t i = 0; i < BYTES; i += 256) {
        acc = _mm512_add_epi64(acc, _mm512_load_si512(b + i));
        acc = _mm512_add_epi64(acc, _mm512_load_si512(b + i + 64));
        acc = _mm512_add_epi64(acc, _mm512_load_si512(b + i + 128));
        acc = _mm512_add_epi64(acc, _mm512_load_si512(b + i + 192));
    }
    sink += _mm512_reduce_add_epi64(acc);
    return 0;
}
#else
static void *run(void *arg) {
    char *b = bufs[(long)arg];
    __m256i acc = _mm256_setzero_si256(), acc2 = _mm256_setzero_si256();
    for (size_t i = 0; i < BYTES; i += 256) {
        for (int j = 0; j < 256; j += 64) {
            acc = _mm256_add_epi64(acc, _mm256_load_si256((const __m256i *)(b + i + j)));
            acc2 = _mm256_add_epi64(acc2, _mm256_load_si256((const __m256i *)(b + i + j + 32)));
        }
    }
    acc = _mm256_add_epi64(acc, acc2);
    long long out[4];
    _mm256_storeu_si256((__m256i *)out, acc);
    sink += out[0] + out[1] + out[2] + out[3];
    return 0;
}
#endif
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
    int T = argc == 2 ? atoi(argv[1]) : 0;
    if (T < 1 || T > 8) { fprintf(stderr, "usage: %s THREADS (1 to 8)\n", argv[0]); return 2; }
    for (int t = 0; t < T; t++) { bufs[t] = aligned_alloc(2ul << 20, BYTES); if (!bufs[t]) { fprintf(stderr, "out of memory\n"); return 1; } if (getenv("HUGE")) madvise(bufs[t], BYTES, MADV_HUGEPAGE); memset(bufs[t], 1, BYTES); }
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        pthread_t th[8];
        double t0 = now();
        for (long t = 0; t < T; t++) pthread_create(&th[t], 0, run, (void *)t);
        for (int t = 0; t < T; t++) pthread_join(th[t], 0);
        double gbs = T * BYTES / (now() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    printf("threads %d%s: best read bandwidth %.1f GB/s\n", T, getenv("HUGE") ? " (huge pages)" : "", best);
}
