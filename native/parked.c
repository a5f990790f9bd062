/* parked.c — waits that began before the session: threads blocked when it started.
 *
 * A wait the hooks did not see begin (the thread was blocked before the slots were patched)
 * still counts from the session's start: the thread's blocking syscall names the wait's
 * kind, its frames (still while it is blocked) its stack, and its CPU clock, unmoved while
 * it stays blocked, tells the tick it woke (charged half-way between the two last checks).
 *
 * The waits engine drives this (engine.h: ddp_parked_scan, ddp_parked_tick); it lives in
 * the core as it reads the thread slots.  Includes: core.h.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core.h"

static int blocked_kind(int32_t tid)
{
    char buf[256];
    if (task_file_read(tid, "syscall", buf, sizeof buf) <= 0)
        return 0;
    char *end;
    long nr = strtol(buf, &end, 10);
    if (end == buf)
        return 0; /* "running" */
    switch (nr) {
    case SYS_futex: {
        unsigned long long uaddr = strtoull(end, NULL, 16);
        return sess_gil_lo && uaddr >= sess_gil_lo && uaddr < sess_gil_hi ? DDP_WAIT_COND_TIMEDWAIT : DDP_WAIT_SEM_CLOCKWAIT;
    }
    case SYS_clock_nanosleep: return DDP_WAIT_CLOCK_NANOSLEEP;
    case SYS_nanosleep: return DDP_WAIT_NANOSLEEP;
    case SYS_pselect6: return DDP_WAIT_PSELECT;
    case SYS_ppoll: return DDP_WAIT_PPOLL;
    case SYS_epoll_pwait: return DDP_WAIT_EPOLL_PWAIT;
    case SYS_recvfrom: return DDP_WAIT_RECVFROM;
    case SYS_recvmsg: return DDP_WAIT_RECVMSG;
    case SYS_accept4: return DDP_WAIT_ACCEPT4;
#ifdef SYS_select
    case SYS_select: return DDP_WAIT_SELECT;
#endif
#ifdef SYS_poll
    case SYS_poll: return DDP_WAIT_POLL;
#endif
#ifdef SYS_epoll_wait
    case SYS_epoll_wait: return DDP_WAIT_EPOLL_WAIT;
#endif
#ifdef SYS_accept
    case SYS_accept: return DDP_WAIT_ACCEPT;
#endif
    default: return 0;
    }
}

void ddp_parked_scan(int64_t now, int (*in_wait)(int32_t tid), int (*event_for)(int kind))
{
    int n = atomic_load(&sess_nslots);
    for (int i = 0; i < n && i < MAX_SLOTS; i++) {
        slot_t *s = &sess_slots[i];
        int32_t tid = atomic_load(&s->tid);
        uintptr_t tstate = atomic_load(&s->tstate);
        if (!atomic_load(&s->active) || atomic_load(&s->excluded) || !tstate || in_wait(tid))
            continue;
        int64_t cpu = thread_cpu_ns(s); /* first: a wake after it shows at the next tick */
        int kind = blocked_kind(tid);
        int ev = kind ? event_for(kind) : -1;
        if (ev < 0 || cpu < 0)
            continue;
        if (!s->park && !(s->park = malloc(sess_rec_size)))
            continue;
        ddp_record *rec = s->park;
        memset(rec, 0, sizeof *rec);
        rec->event = (uint8_t)ev;
        rec->state = DDP_STATE_OFFCPU;
        rec->tid = tid;
        rec->label_id = label_of(s);
        rec->count = 1;
        rec->aux = (uint64_t)kind;
        if (walk_into(rec, tstate, atomic_load(&ddp_read_mode_now)) < 0)
            continue;
        s->park_on = 1;
        s->park_cpu = cpu;
        s->park_checked = now;
        sess_stats.parked_at_start++;
    }
}

static int park_emit(slot_t *s, int64_t end)
{
    s->park_on = 0;
    ddp_record *p = s->park;
    if (end <= sess_stats.start_mono_ns)
        return 0;
    p->value = end - sess_stats.start_mono_ns;
    p->ts_ns = end;
    size_t ticket;
    ddp_record *rec = ddp_ring_reserve(sess_ring, &ticket);
    if (!rec) {
        atomic_fetch_add_explicit(&sess_stats.dropped_full[p->event], 1, memory_order_relaxed);
        return 0;
    }
    memcpy(rec, p, sizeof(ddp_record) + (size_t)p->depth * sizeof(ddp_frame));
    ddp_ring_publish(sess_ring, ticket);
    atomic_fetch_add_explicit(&sess_stats.samples[p->event], 1, memory_order_relaxed);
    return 1;
}

/* Each tick (and at the end, `final`): which threads blocked since the start have woken. */
int ddp_parked_tick(int64_t now, int final)
{
    int written = 0, n = atomic_load(&sess_nslots);
    for (int i = 0; i < n && i < MAX_SLOTS; i++) {
        slot_t *s = &sess_slots[i];
        if (!s->park_on)
            continue;
        int64_t cpu = thread_cpu_ns(s);
        if (cpu != s->park_cpu) /* it ran (or exited) since the last check: it woke in between */
            written += park_emit(s, s->park_checked + (now - s->park_checked) / 2);
        else if (final)
            written += park_emit(s, now);
        else
            s->park_checked = now;
    }
    return written;
}
