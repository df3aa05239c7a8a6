/* A sampling profiler to preload into a process on the device machine,
 * which has no perf: every PROF_US µs of wall time (SIGALRM, default 200)
 * the interrupted thread's backtrace is kept (up to 200000 samples), and at
 * exit written to $PROF_OUT, one sample a line, then "MAPS" and the
 * process's /proc/self/maps.  scripts/sampler_report.py turns the file
 * into self and inclusive shares by function (where the host spends a
 * small call's time: docs/perf/2026-11-28-checks-h200-run2.json).
 *   cc -O2 -shared -fPIC -o sampler.so scripts/sampler.c
 *   PROF_OUT=prof.txt LD_PRELOAD=$PWD/sampler.so bg/flashattn-lua script.lua
 * Process-directed signals go to the main thread first; the samples are
 * wall time, so a loop that waits on the GPU shows the wait. */
#define _GNU_SOURCE
#include <execinfo.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#define SAMPLES 200000
#define DEPTH 24
static void *frames[SAMPLES][DEPTH];
static int depth[SAMPLES];
static volatile sig_atomic_t taken;

static void on_alarm(int sig) {
  (void)sig;
  const int i = taken;
  if (i < SAMPLES) {
    taken = i + 1;
    depth[i] = backtrace(frames[i], DEPTH);
  }
}

static void set_timer(long us) {
  struct itimerval it = {{0, us}, {0, us}};
  setitimer(ITIMER_REAL, &it, NULL);
}

__attribute__((constructor)) static void sampler_start(void) {
  if (!getenv("PROF_OUT")) return;
  void *warm[2];
  backtrace(warm, 2); /* loads the unwinder now, not inside the handler */
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_alarm;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGALRM, &sa, NULL);
  const char *us = getenv("PROF_US");
  const long u = us ? atol(us) : 200;
  set_timer(u > 0 && u < 1000000 ? u : 200);
}

__attribute__((destructor)) static void sampler_stop(void) {
  const char *path = getenv("PROF_OUT");
  if (!path) return;
  set_timer(0);
  FILE *f = fopen(path, "w");
  if (!f) return;
  for (int i = 0; i < taken; i++) {
    /* hex always: glibc's %p writes a null frame as "(nil)", which the report could not read */
    for (int d = 0; d < depth[i]; d++) fprintf(f, "%#lx ", (unsigned long)(uintptr_t)frames[i][d]);
    fputc('\n', f);
  }
  fputs("MAPS\n", f);
  FILE *m = fopen("/proc/self/maps", "r");
  char line[1024];
  while (m && fgets(line, sizeof line, m)) fputs(line, f);
  if (m) fclose(m);
  fclose(f);
}
