/* What an OpenMP parallel region and a barrier cost on this machine, with two threads (the kernels' regions in a
 * decode step: ~60), and what a region costs after the main thread ran serial work first (the worker then spins
 * out, GOMP_SPINCOUNT, and sleeps). A measurement, not a test:
 *
 *   gcc -O2 -fopenmp perf/probes/omp_region_cost.c -o /tmp/omp_region_cost
 *   GOMP_SPINCOUNT=20000 /tmp/omp_region_cost    (backend/__init__.py's default)
 */
#include <omp.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void busy(double us) {  /* serial work of the main thread, spinning (no sleep) */
  double end = now() + us * 1e-6;
  while (now() < end) {
  }
}

int main(void) {
  double work[2] = {0, 0};
  const int n = 20000;
  double t = now();
  #pragma omp parallel num_threads(2)
  {
    for (int i = 0; i < n; i++) {
      work[omp_get_thread_num()] += 1.0;
      #pragma omp barrier
    }
  }
  printf("barrier inside one region: %.2f us\n", (now() - t) / n * 1e6);
  const double gaps[] = {0, 5, 20, 50, 100};
  for (int g = 0; g < 5; g++) {
    t = now();
    for (int i = 0; i < n; i++) {
      busy(gaps[g]);
      #pragma omp parallel num_threads(2)
      { work[omp_get_thread_num()] += 1.0; }
    }
    printf("serial work of %3.0f us before each region: the region costs %.2f us\n", gaps[g],
           (now() - t) / n * 1e6 - gaps[g]);
  }
  return work[0] < 0;
}
