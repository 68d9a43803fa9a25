// A C model of the AVX2 Q8_0 prefill kernel (one 16-row group, an 8-token tile, weights in
// L1): every token on the integer path (`vpmaddubsw` + `vpmaddwd`), or some tokens on the
// float pipes instead (codes widened to f32, exact per block), to see whether the second
// multiply pipe helps. Prints multiply-adds per cycle at a fixed 3.35 GHz and checks that
// both paths give the same bits (docs/benchmarks.md, issue 20, "night" section).
//   gcc -O3 -mavx2 -mfma -mf16c bench/q8_float_path.c -o /tmp/q8_float_path && /tmp/q8_float_path
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
typedef struct { uint16_t d; int8_t qs[32]; } __attribute__((packed)) bq8;
static uint8_t W[G][NB][GB] __attribute__((aligned(64)));
static bq8 A[8][NB];
static float AF[8][NB*32] __attribute__((aligned(32)));
static float AD[8][NB];
static float out[G][8][16];
#define NTOK 8
static inline __attribute__((always_inline)) void kern(const uint8_t (*w)[GB], int nint, float o[8][16]){
  const __m256i flip=_mm256_set1_epi8(-128), ones=_mm256_set1_epi16(1);
  __m256 acc[NTOK][2]; for(int t=0;t<NTOK;t++){acc[t][0]=acc[t][1]=_mm256_setzero_ps();}
  for(int b=0;b<NB;b++){ const uint8_t*base=w[b];
    for(int h=0;h<2;h++){
      __m256 dw=_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(base+16*h)));
      __m256i sg[8],ab[8];
      for(int i=0;i<8;i++){__m256i c=_mm256_loadu_si256((const __m256i*)(base+32+64*i+32*h)); sg[i]=_mm256_xor_si256(c,flip); ab[i]=_mm256_abs_epi8(sg[i]);}
      for(int t=0;t<nint;t++){ const int32_t*q=(const int32_t*)A[t][b].qs; __m256i s=_mm256_setzero_si256();
        for(int i=0;i<8;i++){__m256i yi=_mm256_set1_epi32(q[i]); __m256i p=_mm256_maddubs_epi16(ab[i],_mm256_sign_epi8(yi,sg[i])); s=_mm256_add_epi32(s,_mm256_madd_epi16(p,ones));}
        __m256 d=_mm256_mul_ps(dw,_mm256_set1_ps(AD[t][b])); acc[t][h]=_mm256_fmadd_ps(d,_mm256_cvtepi32_ps(s),acc[t][h]); }
      if(nint<NTOK){
        __m256 p[NTOK][2];
        for(int t=nint;t<NTOK;t++){p[t][0]=p[t][1]=_mm256_setzero_ps();}
        for(int i=0;i<8;i++){ __m256i c=sg[i];
          __m256 wf[4]; wf[0]=_mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(c,24),24));
          wf[1]=_mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(c,16),24));
          wf[2]=_mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(c,8),24));
          wf[3]=_mm256_cvtepi32_ps(_mm256_srai_epi32(c,24));
          for(int t=nint;t<NTOK;t++){ const float*y=&AF[t][b*32+4*i];
            for(int j=0;j<4;j++) p[t][j&1]=_mm256_fmadd_ps(wf[j],_mm256_broadcast_ss(y+j),p[t][j&1]); }
        }
        for(int t=nint;t<NTOK;t++){ __m256 d=_mm256_mul_ps(dw,_mm256_set1_ps(AD[t][b])); acc[t][h]=_mm256_fmadd_ps(d,_mm256_add_ps(p[t][0],p[t][1]),acc[t][h]); }
      }
    }
  }
  for(int t=0;t<NTOK;t++){_mm256_storeu_ps(o[t],acc[t][0]);_mm256_storeu_ps(o[t]+8,acc[t][1]);}
}

__attribute__((target("avx2,fma,f16c"),noinline)) static void k8(const uint8_t (*w)[GB], float o[8][16]){kern(w,8,o);}
__attribute__((target("avx2,fma,f16c"),noinline)) static void k7(const uint8_t (*w)[GB], float o[8][16]){kern(w,7,o);}
__attribute__((target("avx2,fma,f16c"),noinline)) static void k6(const uint8_t (*w)[GB], float o[8][16]){kern(w,6,o);}
__attribute__((target("avx2,fma,f16c"),noinline)) static void k5(const uint8_t (*w)[GB], float o[8][16]){kern(w,5,o);}
__attribute__((target("avx2,fma,f16c"),noinline)) static void k4(const uint8_t (*w)[GB], float o[8][16]){kern(w,4,o);}
typedef void (*kf)(const uint8_t (*)[GB], float[8][16]);
static kf KS[9]={0,0,0,0,k4,k5,k6,k7,k8};
int main(int argc,char**argv){
  srand(1); for(int g=0;g<G;g++)for(int b=0;b<NB;b++)for(int i=0;i<GB;i++)W[g][b][i]=rand();
  for(int g=0;g<G;g++)for(int b=0;b<NB;b++)for(int i=0;i<32;i+=2)((uint16_t*)W[g][b])[i/2]=0x3c00; // scale 1.0
  for(int t=0;t<8;t++)for(int b=0;b<NB;b++){A[t][b].d=0x3c00; AD[t][b]=1.0f; for(int i=0;i<32;i++){int v=(rand()%255)-127;A[t][b].qs[i]=v;AF[t][b*32+i]=v;}}
  float ref[8][16]; k8(W[0],out[0]); memcpy(ref,out[0],sizeof ref);
  for(int nint=8;nint>=4;nint--){
    KS[nint](W[0],out[0]); int same=memcmp(ref,out[0],sizeof ref)==0;
    double best=1e9; for(int r=0;r<7;r++){ double t0=now(); for(int k=0;k<20000;k++) for(int g=0;g<G;g++) KS[nint](W[g],out[g]); double d=now()-t0; if(d<best)best=d;}
    double macs=20000.0*G*NB*32*16*NTOK; printf("nint %d fp %d: %.2f GMAC/s (%.2f MAC/cycle at 3.35GHz) same bits %d\n",nint,NTOK-nint,macs/best/1e9,macs/best/3.35e9,same);
  }
}
