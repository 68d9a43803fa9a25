// Writes encode_golden.bin: the bytes llama.cpp's ggml produces for a fixed input, per weight
// type, through `ggml_quantize_chunk` without an importance matrix -- the path llama-quantize
// takes, which for these types is the `quantize_row_*_ref` reference. kiln's encoder test
// (src/encode/tests.rs) regenerates the same input and compares byte for byte.
//
// Built and run by make_encode_golden.sh. Compile without FMA contraction so the input
// arithmetic below is the plain IEEE single-precision sequence the Rust test repeats.
//
// Run it on x86-64: the blocks holding ±inf / NaN / subnormals make ggml convert out-of-range
// floats to 8-bit integers, which C leaves undefined; x86-64 gives the low byte of
// 0x80000000 (0), and kiln reproduces that (AArch64 saturates instead).
//
// File layout (little-endian):
//   "KENC", u32 version (1), u32 rows, u32 cols, u64 FNV-1a of the input's f32 bit patterns,
//   u32 number of entries, then per entry: u32 ggml type id, u32 rows encoded, u32 byte count,
//   the bytes (rows × row size).

#include "ggml.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ROWS = 4, COLS = 512, BLOCK = 32 };

// A 32-bit LCG (Numerical Recipes constants): trivially portable to Rust.
static uint32_t lcg_state = 0x2545F491u;

static uint32_t lcg_next(void) {
    lcg_state = lcg_state * 1664525u + 1013904223u;
    return lcg_state;
}

// Uniform in [0, 1): a 24-bit integer times 2^-24, both exact in f32.
static float lcg_unit(void) {
    return (float) (lcg_next() >> 8) * (1.0f / 16777216.0f);
}

// What a 32-element block of the input looks like.
enum kind { NOISE, POSITIVE, NEGATIVE, ZERO, CONSTANT, TINY, POS_INF, NEG_INF, NOT_A_NUMBER };

static enum kind block_kind(int row, int blk) {
    if (row == 1 && blk == 7) return POSITIVE;      // min > 0: the affine fits clamp it to 0
    if (row == 1 && blk == 12) return NEGATIVE;     // max < 0
    if (row == 2 && blk == 1) return CONSTANT;      // max == min
    if (row == 2 && blk == 3) return ZERO;          // one empty block inside a super-block
    if (row == 2 && blk >= 8) return ZERO;          // a whole empty K-quant super-block
    if (row == 3 && blk == 1) return POS_INF;       // noise with one +inf
    if (row == 3 && blk == 2) return NEG_INF;       // noise with one -inf
    if (row == 3 && blk == 4) return NOT_A_NUMBER;  // noise with one NaN
    if (row == 3 && blk == 10) return TINY;         // subnormals: reciprocal scales overflow
    return NOISE;
}

static const float MAGS[8] = {1.0f, 0.02f, 3.0f, 0.001f, 0.25f, 40.0f, 1e-5f, 0.07f};

// Two draws per element whatever the block kind, so every element's stream position is fixed.
static float element(int row, int col) {
    const int blk = col / BLOCK;
    const int j = col % BLOCK;
    const float mag = MAGS[(row * 5 + blk) % 8];
    const float u = lcg_unit();
    const uint32_t o = lcg_next();
    const float s = u * 2.0f - 1.0f;
    switch (block_kind(row, blk)) {
        case POSITIVE: return u * mag + mag;
        case NEGATIVE: return -(u * mag) - 0.5f * mag;
        case ZERO: return 0.0f;
        case CONSTANT: return 0.75f;
        case TINY: return s * 1e-39f;
        case POS_INF: if (j == 3) return INFINITY; break;
        case NEG_INF: if (j == 20) return -INFINITY; break;
        case NOT_A_NUMBER: if (j == 9) return NAN; break;
        case NOISE: break;
    }
    float v = s * mag;
    if (o % 61 == 0) v *= 12.0f; // an outlier now and then
    return v;
}

static uint64_t fnv1a(const float * x, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; ++i) {
        uint32_t b;
        memcpy(&b, &x[i], 4);
        for (int k = 0; k < 4; ++k) {
            h ^= (b >> (8 * k)) & 0xFF;
            h *= 0x100000001b3ull;
        }
    }
    return h;
}

static void put_u32(FILE * f, uint32_t v) {
    uint8_t b[4] = {(uint8_t) v, (uint8_t) (v >> 8), (uint8_t) (v >> 16), (uint8_t) (v >> 24)};
    fwrite(b, 1, 4, f);
}

static void put_u64(FILE * f, uint64_t v) {
    put_u32(f, (uint32_t) v);
    put_u32(f, (uint32_t) (v >> 32));
}

// One entry: the first `rows` rows of `x` encoded as `type`.
static void put_entry(FILE * f, enum ggml_type type, const float * x, int rows) {
    const size_t row_size = ggml_row_size(type, COLS);
    uint8_t * buf = calloc(rows, row_size);
    const size_t n = ggml_quantize_chunk(type, x, buf, 0, rows, COLS, NULL);
    if (n != rows * row_size) {
        fprintf(stderr, "%s: %zu bytes, expected %zu\n", ggml_type_name(type), n, rows * row_size);
        exit(1);
    }
    put_u32(f, (uint32_t) type);
    put_u32(f, (uint32_t) rows);
    put_u32(f, (uint32_t) n);
    fwrite(buf, 1, n, f);
    free(buf);
}

int main(int argc, char ** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT.bin\n", argv[0]);
        return 2;
    }
    static float x[ROWS * COLS];
    for (int r = 0; r < ROWS; ++r) {
        for (int c = 0; c < COLS; ++c) {
            x[r * COLS + c] = element(r, c);
        }
    }
    const enum ggml_type quants[] = {
        GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0,
        GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,
    };
    const int n_quants = (int) (sizeof(quants) / sizeof(quants[0]));
    FILE * f = fopen(argv[1], "wb");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    fwrite("KENC", 1, 4, f);
    put_u32(f, 1);
    put_u32(f, ROWS);
    put_u32(f, COLS);
    put_u64(f, fnv1a(x, ROWS * COLS));
    put_u32(f, (uint32_t) (n_quants + 2));
    // The float types only need one row to pin down their rounding.
    put_entry(f, GGML_TYPE_F16, x, 1);
    put_entry(f, GGML_TYPE_BF16, x, 1);
    for (int i = 0; i < n_quants; ++i) {
        put_entry(f, quants[i], x, ROWS);
    }
    fclose(f);
    return 0;
}
