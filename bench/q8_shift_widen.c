// A C model of the AVX2 Q8_0 prefill kernel (one 16-row group, an 8-token tile, weights in
// L1, as bench/q8_float_path.c): can the second multiply per 32 multiply-adds (`vpmaddwd` by
// ones, which widens the 16-bit pair sums of `vpmaddubsw` to 32 bits) move off the one integer
// multiplier? The widening can also be done with shifts (`(p << 16 >> 16) + (p >> 16)`, exact),
// which run on other pipes. Here the first NSHIFT tokens of the tile widen every SHIFT_EVERY-th
// product vector with shifts and the rest with `vpmaddwd`. Prints multiply-adds per cycle at a
// fixed 3.35 GHz, and whether every variant gives the all-`vpmaddwd` kernel's bits
// (docs/benchmarks.md, issue 20, "where Q8_0 stops").
//   gcc -O3 -mavx2 -mfma -mf16c bench/q8_shift_widen.c -o /tmp/q8_shift_widen && /tmp/q8_shift_widen
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define NB 18
#define G 8
#define GB 544
#define NTOK 8
typedef struct { uint16_t d; int8_t qs[32]; } __attribute__((packed)) bq8;
static uint8_t W[G][NB][GB] __attribute__((aligned(64)));
static bq8 A[NTOK][NB];
static float AD[NTOK][NB];
static float out[G][NTOK][16];
static inline __attribute__((always_inline)) void kern(const uint8_t (*w)[GB], int nshift, int every, float o[NTOK][16]){
  const __m256i flip=_mm256_set1_epi8(-128), ones=_mm256_set1_epi16(1);
  __m256 acc[NTOK][2]; for(int t=0;t<NTOK;t++){acc[t][0]=acc[t][1]=_mm256_setzero_ps();}
  for(int b=0;b<NB;b++){ const uint8_t*base=w[b];
    for(int h=0;h<2;h++){
      __m256 dw=_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(base+16*h)));
      __m256i sg[8],ab[8];
      for(int i=0;i<8;i++){__m256i c=_mm256_loadu_si256((const __m256i*)(base+32+64*i+32*h)); sg[i]=_mm256_xor_si256(c,flip); ab[i]=_mm256_abs_epi8(sg[i]);}
      for(int t=0;t<NTOK;t++){ const int32_t*q=(const int32_t*)A[t][b].qs; __m256i s=_mm256_setzero_si256();
        if(t<nshift){ __m256i hi=_mm256_setzero_si256(), lo=hi;
          for(int i=0;i<8;i++){ __m256i p=_mm256_maddubs_epi16(ab[i],_mm256_sign_epi8(_mm256_set1_epi32(q[i]),sg[i]));
            if(i%every==0){ hi=_mm256_add_epi32(hi,_mm256_srai_epi32(p,16)); lo=_mm256_add_epi32(lo,_mm256_srai_epi32(_mm256_slli_epi32(p,16),16)); }
            else s=_mm256_add_epi32(s,_mm256_madd_epi16(p,ones)); }
          s=_mm256_add_epi32(s,_mm256_add_epi32(hi,lo));
        } else {
          for(int i=0;i<8;i++){ __m256i p=_mm256_maddubs_epi16(ab[i],_mm256_sign_epi8(_mm256_set1_epi32(q[i]),sg[i])); s=_mm256_add_epi32(s,_mm256_madd_epi16(p,ones)); }
        }
        __m256 d=_mm256_mul_ps(dw,_mm256_set1_ps(AD[t][b])); acc[t][h]=_mm256_fmadd_ps(d,_mm256_cvtepi32_ps(s),acc[t][h]); }
    }
  }
  for(int t=0;t<NTOK;t++){_mm256_storeu_ps(o[t],acc[t][0]);_mm256_storeu_ps(o[t]+8,acc[t][1]);}
}
// Each variant its own function with constant arguments, so the compiler drops the branches.
#define K(ns,ev) __attribute__((target("avx2,fma,f16c"),noinline)) static void k_##ns##_##ev(const uint8_t (*w)[GB], float o[NTOK][16]){kern(w,ns,ev,o);}
K(0,1) K(2,2) K(4,2) K(8,2) K(4,4) K(8,4) K(8,1)
typedef void (*kf)(const uint8_t (*)[GB], float[NTOK][16]);
static const struct { const char*label; kf f; } VARIANTS[]={
  {"all vpmaddwd (the kernel)",k_0_1},{"2 tokens, every 2nd by shifts",k_2_2},{"4 tokens, every 2nd",k_4_2},
  {"8 tokens, every 2nd",k_8_2},{"4 tokens, every 4th",k_4_4},{"8 tokens, every 4th",k_8_4},{"8 tokens, all by shifts",k_8_1}};
int main(void){
  srand(1); for(int g=0;g<G;g++)for(int b=0;b<NB;b++)for(int i=0;i<GB;i++)W[g][b][i]=rand();
  for(int g=0;g<G;g++)for(int b=0;b<NB;b++)for(int i=0;i<32;i+=2)((uint16_t*)W[g][b])[i/2]=0x3c00; // scale 1.0
  for(int t=0;t<NTOK;t++)for(int b=0;b<NB;b++){A[t][b].d=0x3c00; AD[t][b]=1.0f; for(int i=0;i<32;i++)A[t][b].qs[i]=(rand()%255)-127;}
  float ref[NTOK][16]; k_0_1(W[0],out[0]); memcpy(ref,out[0],sizeof ref);
  for(size_t v=0;v<sizeof VARIANTS/sizeof VARIANTS[0];v++){
    VARIANTS[v].f(W[0],out[0]); int same=memcmp(ref,out[0],sizeof ref)==0;
    double best=1e9; for(int r=0;r<7;r++){ double t0=now(); for(int k=0;k<20000;k++) for(int g=0;g<G;g++) VARIANTS[v].f(W[g],out[g]); double d=now()-t0; if(d<best)best=d;}
    double macs=20000.0*G*NB*32*16*NTOK; printf("%-32s %.2f MAC/cycle at 3.35 GHz, same bits %s\n",VARIANTS[v].label,macs/best/3.35e9,same?"yes":"NO");
  }
}
