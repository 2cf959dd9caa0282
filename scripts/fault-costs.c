/* Cost of mapping shared memfd pages into a fresh mapping, per 4 KiB page,
 * by method (docs/shared-memory.md, "Page faults"). Each method maps the
 * same 512 MiB memfd afresh; "then writes" is a write to every page after
 * it (near zero when the method left the pages mapped writable).
 *
 *   cc -O2 scripts/fault-costs.c -o /tmp/fault-costs && /tmp/fault-costs
 */
#define _GNU_SOURCE
#include <sys/mman.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#define MADV_POPULATE_WRITE 23
#endif
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(){
  size_t len=512UL<<20; int fd=memfd_create("x",0); ftruncate(fd,len); posix_fallocate(fd,0,len);
  const char* names[]={"write-touch","read-touch","populate-write","populate-read","map-populate"};
  for(int m=0;m<5;m++){
    int flags=MAP_SHARED|(m==4?MAP_POPULATE:0);
    double t=now();
    volatile char* p=mmap(0,len,PROT_READ|PROT_WRITE,flags,fd,0);
    if(m==0) for(size_t i=0;i<len;i+=4096) p[i]=1;
    if(m==1) { long s=0; for(size_t i=0;i<len;i+=4096) s+=p[i]; }
    if(m==2) madvise((void*)p,len,MADV_POPULATE_WRITE);
    if(m==3) madvise((void*)p,len,MADV_POPULATE_READ);
    double d=now()-t;
    // then write-touch all to see remaining cost
    double t2=now(); for(size_t i=0;i<len;i+=4096) p[i]=2; double d2=now()-t2;
    printf("%-15s %.3f us/page, then writes %.3f us/page\n",names[m],d*1e6/(len/4096),d2*1e6/(len/4096));
    munmap((void*)p,len);
  }
}
