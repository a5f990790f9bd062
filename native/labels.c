/* labels.c — label words: each thread's published label-set id.
 *
 * Python writes a thread's word directly through a memoryview (ddp_label_word: a store per
 * label change instead of a cffi call); the CPU handler and the wall thread read it.  Views
 * may be held by Python code for any time (across sessions, a fork, the thread's end), so
 * the words are static storage, never freed: a stale view can at worst write a wrong label,
 * never into freed memory.  A word belongs to a tid from its claim until that tid is gone
 * from the process (reclaimed only when the table is full: nobody writes a dead thread's
 * view, only the thread itself writes its own).  Readers find a tid's word by a scan below
 * lw_hi, cached per session slot and redone when lw_epoch moves (every claim/reclaim).
 *
 * Includes: core.h (a slot caches its thread's word index).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include "core.h"

#define LW_MAX 4096
typedef struct {
    _Atomic int32_t tid; /* 0: free */
    int32_t pad;
    _Atomic uint64_t id;
} lword_t;
static lword_t lwords[LW_MAX];
static _Atomic int32_t lw_hi;       /* words in use are below this */
static _Atomic uint32_t lw_epoch = 1;
static pthread_mutex_t lw_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t lw_once = PTHREAD_ONCE_INIT;

static int lw_find(int32_t tid)
{
    int n = atomic_load(&lw_hi);
    for (int i = 0; i < n && i < LW_MAX; i++)
        if (atomic_load_explicit(&lwords[i].tid, memory_order_acquire) == tid)
            return i;
    return -1;
}

static void lw_after_fork_child(void)
{
    /* Only the forking thread lives on, under a new tid: every word is stale.  (Python's
     * labeling bumps its view generation at fork, so views are asked for again.) */
    pthread_mutex_init(&lw_lock, NULL);
    int n = atomic_load(&lw_hi);
    for (int i = 0; i < n && i < LW_MAX; i++) {
        atomic_store(&lwords[i].tid, 0);
        atomic_store(&lwords[i].id, 0);
    }
    atomic_store(&lw_hi, 0);
    atomic_fetch_add(&lw_epoch, 1);
}

static void lw_init_once(void) { pthread_atfork(NULL, NULL, lw_after_fork_child); }

/* The word of `tid` (claimed if it has none), or NULL when the table is full of live tids. */
static lword_t *lw_claim(int32_t tid)
{
    if (tid <= 0)
        return NULL;
    pthread_once(&lw_once, lw_init_once);
    pthread_mutex_lock(&lw_lock);
    int i = lw_find(tid);
    if (i < 0) {
        int n = atomic_load(&lw_hi);
        for (int pass = 0; pass < 2 && i < 0; pass++) {
            for (int k = 0; k < n && i < 0; k++)
                if (atomic_load(&lwords[k].tid) == 0)
                    i = k;
            if (i < 0 && n < LW_MAX)
                i = n;
            if (i < 0 && pass == 0) { /* full: free the words of threads gone from the process */
                pid_t pid = getpid();
                for (int k = 0; k < n; k++) {
                    int32_t t = atomic_load(&lwords[k].tid);
                    if (t > 0 && syscall(SYS_tgkill, pid, t, 0) != 0 && errno == ESRCH) {
                        atomic_store(&lwords[k].tid, 0);
                        atomic_store(&lwords[k].id, 0);
                    }
                }
                atomic_fetch_add(&lw_epoch, 1);
            }
        }
        if (i >= 0) {
            atomic_store(&lwords[i].id, 0);
            atomic_store_explicit(&lwords[i].tid, tid, memory_order_release);
            if (i >= n)
                atomic_store(&lw_hi, i + 1);
            atomic_fetch_add(&lw_epoch, 1); /* after the tid is visible: cached misses retry */
        }
    }
    pthread_mutex_unlock(&lw_lock);
    return i >= 0 ? &lwords[i] : NULL;
}

uint64_t label_of(slot_t *s)
{
    int32_t tid = atomic_load_explicit(&s->tid, memory_order_relaxed);
    uint32_t ep = atomic_load(&lw_epoch);
    uint64_t c = atomic_load_explicit(&s->lw_cache, memory_order_relaxed);
    int32_t i;
    if ((uint32_t)(c >> 32) == ep) {
        i = (int32_t)(uint32_t)c - 1;
    } else { /* the table changed since this slot looked: look again (epoch read first) */
        i = lw_find(tid);
        atomic_store_explicit(&s->lw_cache, ((uint64_t)ep << 32) | (uint32_t)(i + 1), memory_order_relaxed);
    }
    if (i < 0 || i >= LW_MAX || atomic_load_explicit(&lwords[i].tid, memory_order_acquire) != tid)
        return 0;
    return atomic_load_explicit(&lwords[i].id, memory_order_relaxed);
}

int ddp_set_thread_labels_for(int32_t tid, uint64_t id)
{
    if (tid <= 0)
        return DDP_EINVAL;
    lword_t *w = lw_claim(tid); /* in or out of a session: the words outlive sessions */
    if (!w)
        return DDP_ENOMEM;
    atomic_store(&w->id, id);
    return DDP_OK;
}

int ddp_set_thread_labels(uint64_t id) { return ddp_set_thread_labels_for(my_tid(), id); }

uint64_t *ddp_label_word(void)
{
    lword_t *w = lw_claim(my_tid());
    return w ? (uint64_t *)&w->id : NULL;
}
