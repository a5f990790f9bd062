/* allocsample.c — the one allocation sampling scheme that the PyMem hooks (alloc.c) and the
 * C allocation hooks (nalloc.c) share: the mean gap between samples (bytes), the
 * Horvitz-Thompson weights of a sample, one sequence of sample ids, and the queue of sample
 * leaves named outright (an object's type, "malloc", "numpy", ...) that the drain pops.
 * Apart from both hook files so that neither calls into the other for it. */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include "alloc.h"

#define NOTES_CAP 4096 /* leaves waiting for the drain */

static double rate = 512 * 1024.0;
static _Atomic uint64_t seq;
static _Atomic uint64_t notes_dropped;

/* Pushed by sampling threads, popped by the drain without the GIL (taking it there would
 * force a GIL hand-off from the profiled thread at every drain). */
static ddp_alloc_info notes[NOTES_CAP];
static uint32_t notes_head, notes_len;
static pthread_mutex_t notes_lock = PTHREAD_MUTEX_INITIALIZER;

void ddp_alloc_scheme_start(double mean_gap)
{
    pthread_mutex_lock(&notes_lock);
    notes_head = notes_len = 0;
    pthread_mutex_unlock(&notes_lock);
    atomic_store(&seq, 0);
    atomic_store(&notes_dropped, 0);
    rate = mean_gap;
}

void ddp_alloc_scheme_after_fork(void)
{
    pthread_mutex_init(&notes_lock, NULL); /* another thread may have held it at fork */
    notes_head = notes_len = 0;
}

double ddp_alloc_mean_gap(void) { return rate; }

/* The Horvitz-Thompson weights of a sampled allocation of n bytes (p = 1 - exp(-n/R)):
 * count = 1/p rounded stochastically with u in (0, 1], bytes = n/p.  -1 when n == 0. */
int ddp_alloc_weigh(size_t n, double u, int64_t *count, int64_t *bytes)
{
    double s = (double)n;
    double prob = -expm1(-s / rate);
    if (!(prob > 0))
        return -1;
    double c = 1.0 / prob;
    *count = (int64_t)c;
    if (u <= c - (double)*count)
        ++*count;
    *bytes = (int64_t)llround(s * c);
    return 0;
}

uint64_t ddp_alloc_new_id(void) { return atomic_fetch_add_explicit(&seq, 1, memory_order_relaxed) + 1; }

void ddp_alloc_note_info(const ddp_alloc_info *note)
{
    pthread_mutex_lock(&notes_lock);
    if (notes_len < NOTES_CAP) {
        notes[(notes_head + notes_len) % NOTES_CAP] = *note;
        notes_len++;
    } else {
        atomic_fetch_add_explicit(&notes_dropped, 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&notes_lock);
}

void ddp_alloc_note(uint64_t id, uint64_t size, const char *name)
{
    ddp_alloc_info note = { .id = id, .size = size };
    size_t len = strnlen(name, sizeof note.type_name - 1);
    memcpy(note.type_name, name, len);
    note.type_name[len] = 0;
    ddp_alloc_note_info(&note);
}

uint64_t ddp_alloc_notes_dropped(void) { return atomic_load(&notes_dropped); }

int ddp_alloc_types_pop(ddp_alloc_info *out, int max)
{
    if (!out || max < 0)
        return DDP_EINVAL;
    int n = 0;
    pthread_mutex_lock(&notes_lock);
    while (n < max && notes_len) {
        out[n++] = notes[notes_head];
        notes_head = (notes_head + 1) % NOTES_CAP;
        notes_len--;
    }
    pthread_mutex_unlock(&notes_lock);
    return n;
}
