// Streaming read with software prefetch, as the decode kernels read weights: does
// `prefetchnta` read faster than `prefetcht0`, and does a part of the buffer read with
// `prefetcht0` stay in the last-level cache from one pass to the next while the rest streams
// past it with `prefetchnta`? (docs/benchmarks.md, issue 20, "night" section.)
//   gcc -O2 -mavx2 -pthread bench/stream_read.c -o /tmp/stream_read
//   /tmp/stream_read TOTAL_MB RESIDENT_MB MODE THREADS   (MODE: 0 = t0, 1 = nta, 2 = none)
// e.g. /tmp/stream_read 145 0 0 1 ; /tmp/stream_read 145 0 1 1 ; /tmp/stream_read 145 8 1 2
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <pthread.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
typedef struct {char*p;size_t n;int nta;__m256i acc;} job;
static __m256i readr(const char*p,size_t n,int nta){
  __m256i a=_mm256_setzero_si256(),b=a;
  for(size_t i=0;i<n;i+=64){
    if(nta==1)_mm_prefetch(p+i+1536,_MM_HINT_NTA); else if(nta==0) _mm_prefetch(p+i+1536,_MM_HINT_T0);
    a=_mm256_xor_si256(a,_mm256_load_si256((const __m256i*)(p+i)));
    b=_mm256_xor_si256(b,_mm256_load_si256((const __m256i*)(p+i+32)));
  }
  return _mm256_xor_si256(a,b);
}
typedef struct {char*base;size_t total,res;int mode;int tid,nt;__m256i acc;} targ;
// layout: the buffer is split into nt equal parts (one per thread); each thread's part starts with res/nt resident bytes
static void* run(void*v){targ*t=v;size_t part=t->total/t->nt;char*p=t->base+part*t->tid;size_t r=t->res/t->nt;
  __m256i x=readr(p,r,0); x=_mm256_xor_si256(x,readr(p+r,part-r,t->mode)); t->acc=x; return 0;}
int main(int c,char**v){
  if(c!=5){fprintf(stderr,"usage: %s TOTAL_MB RESIDENT_MB MODE(0 t0, 1 nta, 2 none) THREADS(1 or 2)\n",v[0]);return 2;}
  if(atol(v[1])<1||atol(v[2])<0||atol(v[2])>atol(v[1])||atoi(v[3])<0||atoi(v[3])>2||atoi(v[4])<1||atoi(v[4])>2){fprintf(stderr,"%s: bad arguments (RESIDENT_MB <= TOTAL_MB, MODE 0-2, THREADS 1-2)\n",v[0]);return 2;}
  size_t total=(size_t)atol(v[1])<<20; size_t res=(size_t)atol(v[2])<<20; int mode=atoi(v[3]); int nt=atoi(v[4]); int passes=20;
  char*b=aligned_alloc(2<<20,(total+4096+(2<<20)-1)/(2<<20)*(2<<20)); if(!b){fprintf(stderr,"out of memory\n");return 1;} madvise(b,total,MADV_HUGEPAGE); memset(b,1,total);
  double best=1e9,sum=0;
  for(int p=0;p<passes;p++){
    pthread_t th[2];targ a[2];double t0=now();
    for(int i=0;i<nt;i++){a[i]=(targ){b,total,res,mode,i,nt};pthread_create(&th[i],0,run,&a[i]);}
    for(int i=0;i<nt;i++)pthread_join(th[i],0);
    double d=now()-t0; if(p>=3){sum+=d; if(d<best)best=d;}
  }
  printf("total %zu MB res %zu MB mode %s nt %d: best %.2f ms (%.1f GB/s) mean %.2f ms\n",total>>20,res>>20,mode==1?"nta":mode==0?"t0":"none",nt,best*1e3,total/best/1e9,sum/(passes-3)*1e3);
}
