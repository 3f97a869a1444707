/* How long a cache line takes to go from one CPU to another and back: two threads, pinned to two CPUs, pass a
 * counter to and fro through one cache line. On a bare 2-core machine or two vCPUs on one core complex the round
 * trip is ~50-100 ns; where a hypervisor has put the vCPUs on different core complexes (AMD CCDs: no shared
 * L3) it is several times that, and every step that hands activations from one thread to the other slows with
 * it (BENCHMARKS.md §13). The placement can change while a process runs, so benchmarks measure it beside their
 * timings (native/core_latency.py). */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

typedef struct {
    _Alignas(64) _Atomic int64_t turn; /* odd: the second thread's move; even: the first's */
    _Alignas(64) int64_t n;
    int cpu;
    int pinned;
} Rally;

static int pin(int cpu) {
    if (cpu < 0 || cpu >= CPU_SETSIZE) return 0;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

static void *second(void *arg) {
    Rally *r = arg;
    r->pinned = pin(r->cpu);
    for (int64_t i = 0; i < r->n; i++) {
        while (atomic_load_explicit(&r->turn, memory_order_acquire) != 2 * i + 1) {
        }
        atomic_store_explicit(&r->turn, 2 * i + 2, memory_order_release);
    }
    return NULL;
}

/* Mean nanoseconds of n round trips between CPUs a and b, after n / 4 untimed ones (the calling thread is pinned
 * to a for the call and its affinity restored after). Returns -1 where a thread cannot be started or pinned (a
 * second thread that cannot be pinned still plays, unpinned, so the call ends), -2 for n < 1. */
double tandem_core_round_trip_ns(int a, int b, int64_t n) {
    if (n < 1) return -2.0;
    cpu_set_t saved;
    if (pthread_getaffinity_np(pthread_self(), sizeof saved, &saved) != 0 || !pin(a)) return -1.0;
    Rally r; /* the caller's own: calls from several threads do not share it */
    atomic_store(&r.turn, 0);
    r.n = n + n / 4, r.cpu = b, r.pinned = 0;
    pthread_t t;
    if (pthread_create(&t, NULL, second, &r) != 0) {
        pthread_setaffinity_np(pthread_self(), sizeof saved, &saved);
        return -1.0;
    }
    struct timespec t0, t1;
    const int64_t warm = n / 4; /* untimed: the second thread's start and first moves */
    for (int64_t i = 0; i < n + warm; i++) {
        if (i == warm) clock_gettime(CLOCK_MONOTONIC, &t0);
        atomic_store_explicit(&r.turn, 2 * i + 1, memory_order_release);
        while (atomic_load_explicit(&r.turn, memory_order_acquire) != 2 * i + 2) {
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    pthread_join(t, NULL);
    pthread_setaffinity_np(pthread_self(), sizeof saved, &saved);
    if (!r.pinned) return -1.0;
    return ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) / (double)n;
}
