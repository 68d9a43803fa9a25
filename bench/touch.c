// First-touch cost of fresh anonymous memory: maps SIZE_MB, optionally advised MADV_HUGEPAGE
// (as kiln's weight arena is: kiln-kernels/src/arena.rs), writes one byte per 4 KiB and prints
// the rate. Loading a model copies every weight into such memory, so this bounds the load.
//   gcc -O2 bench/touch.c -o /tmp/touch && /tmp/touch 2048 1 && /tmp/touch 2048 0
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: touch SIZE_MB HUGE(0|1)\n");
        return 2;
    }
    size_t size = (size_t)atol(argv[1]) << 20, huge = 2ul << 20;
    int advise = atoi(argv[2]);
    char *raw = mmap(NULL, size + huge, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    char *p = (char *)(((size_t)raw + huge - 1) & ~(huge - 1));
    if (advise)
        madvise(p, size, MADV_HUGEPAGE);
    double t0 = now();
    for (size_t i = 0; i < size; i += 4096)
        p[i] = 1;
    double secs = now() - t0;
    printf("%s pages: %zu MB touched in %.2f s = %.2f GB/s\n", advise ? "huge" : "4 KiB",
           size >> 20, secs, size / secs / 1e9);
    return 0;
}
