// Whether an integer multiply (`vpmaddubsw`, `vpmaddwd`) and a float multiply (`vmulps`,
// `vfmadd231ps`) issue in the same cycle: independent instructions, cycles per loop at the
// clock a chain of dependent adds measures (docs/benchmarks.md, issue 20, "night" section).
//   gcc -O2 -mavx2 -mfma bench/mulmix.c -o /tmp/mulmix && /tmp/mulmix
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define T(label, nint, nfp, body) { t0=now(); for(long i=0;i<M;i++) __asm__ volatile(body ::"x"(b),"x"(f),"x"(g):"xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11"); double c=(now()-t0)*ghz*1e9/M; printf("%-40s %.2f cyc/iter: int %.2f/c fp %.2f/c\n",label,c,nint/c,nfp/c);}
int main(void){
  const long N=200000000,M=50000000; uint64_t x=1; double t0=now();
  for(long i=0;i<N;i++) __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0":"+r"(x));
  double ghz=4.0*N/(now()-t0)/1e9; printf("clock ~%.2f GHz\n",ghz);
  __m256i b=_mm256_set1_epi8(3); __m256 f=_mm256_set1_ps(1.0000001f), g=_mm256_set1_ps(0.9999f);
  T("8 maddubs", 8.0, 0.0, "vpmaddubsw %0,%0,%%ymm0\n\tvpmaddubsw %0,%0,%%ymm1\n\tvpmaddubsw %0,%0,%%ymm2\n\tvpmaddubsw %0,%0,%%ymm3\n\tvpmaddubsw %0,%0,%%ymm4\n\tvpmaddubsw %0,%0,%%ymm5\n\tvpmaddubsw %0,%0,%%ymm6\n\tvpmaddubsw %0,%0,%%ymm7\n\t")
  T("8 vmulps", 0.0, 8.0, "vmulps %1,%2,%%ymm0\n\tvmulps %1,%2,%%ymm1\n\tvmulps %1,%2,%%ymm2\n\tvmulps %1,%2,%%ymm3\n\tvmulps %1,%2,%%ymm4\n\tvmulps %1,%2,%%ymm5\n\tvmulps %1,%2,%%ymm6\n\tvmulps %1,%2,%%ymm7\n\t")
  T("4 maddubs + 4 vmulps", 4.0, 4.0, "vpmaddubsw %0,%0,%%ymm0\n\tvmulps %1,%2,%%ymm1\n\tvpmaddubsw %0,%0,%%ymm2\n\tvmulps %1,%2,%%ymm3\n\tvpmaddubsw %0,%0,%%ymm4\n\tvmulps %1,%2,%%ymm5\n\tvpmaddubsw %0,%0,%%ymm6\n\tvmulps %1,%2,%%ymm7\n\t")
  T("4 maddubs + 8 vmulps", 4.0, 8.0, "vpmaddubsw %0,%0,%%ymm0\n\tvmulps %1,%2,%%ymm1\n\tvmulps %1,%2,%%ymm8\n\tvpmaddubsw %0,%0,%%ymm2\n\tvmulps %1,%2,%%ymm3\n\tvmulps %1,%2,%%ymm9\n\tvpmaddubsw %0,%0,%%ymm4\n\tvmulps %1,%2,%%ymm5\n\tvmulps %1,%2,%%ymm10\n\tvpmaddubsw %0,%0,%%ymm6\n\tvmulps %1,%2,%%ymm7\n\tvmulps %1,%2,%%ymm11\n\t")
  T("4 maddwd + 4 vfmadd(indep)", 4.0, 4.0, "vpmaddwd %0,%0,%%ymm0\n\tvmovaps %1,%%ymm1\n\tvfmadd231ps %1,%2,%%ymm1\n\tvpmaddwd %0,%0,%%ymm2\n\tvmovaps %1,%%ymm3\n\tvfmadd231ps %1,%2,%%ymm3\n\tvpmaddwd %0,%0,%%ymm4\n\tvmovaps %1,%%ymm5\n\tvfmadd231ps %1,%2,%%ymm5\n\tvpmaddwd %0,%0,%%ymm6\n\tvmovaps %1,%%ymm7\n\tvfmadd231ps %1,%2,%%ymm7\n\t")
  T("8 cvtdq2ps", 0.0, 8.0, "vcvtdq2ps %0,%%ymm0\n\tvcvtdq2ps %0,%%ymm1\n\tvcvtdq2ps %0,%%ymm2\n\tvcvtdq2ps %0,%%ymm3\n\tvcvtdq2ps %0,%%ymm4\n\tvcvtdq2ps %0,%%ymm5\n\tvcvtdq2ps %0,%%ymm6\n\tvcvtdq2ps %0,%%ymm7\n\t")
  T("4 maddubs + 4 cvtdq2ps", 4.0, 4.0, "vpmaddubsw %0,%0,%%ymm0\n\tvcvtdq2ps %0,%%ymm1\n\tvpmaddubsw %0,%0,%%ymm2\n\tvcvtdq2ps %0,%%ymm3\n\tvpmaddubsw %0,%0,%%ymm4\n\tvcvtdq2ps %0,%%ymm5\n\tvpmaddubsw %0,%0,%%ymm6\n\tvcvtdq2ps %0,%%ymm7\n\t")
  T("8 vpmovsxbw xmm->ymm", 0.0, 8.0, "vpmovsxbw %%xmm8,%%ymm0\n\tvpmovsxbw %%xmm8,%%ymm1\n\tvpmovsxbw %%xmm8,%%ymm2\n\tvpmovsxbw %%xmm8,%%ymm3\n\tvpmovsxbw %%xmm8,%%ymm4\n\tvpmovsxbw %%xmm8,%%ymm5\n\tvpmovsxbw %%xmm8,%%ymm6\n\tvpmovsxbw %%xmm8,%%ymm7\n\t")
  T("8 vpmullw", 8.0, 0.0, "vpmullw %0,%0,%%ymm0\n\tvpmullw %0,%0,%%ymm1\n\tvpmullw %0,%0,%%ymm2\n\tvpmullw %0,%0,%%ymm3\n\tvpmullw %0,%0,%%ymm4\n\tvpmullw %0,%0,%%ymm5\n\tvpmullw %0,%0,%%ymm6\n\tvpmullw %0,%0,%%ymm7\n\t")
}
