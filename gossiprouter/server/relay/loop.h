/*
 * The relay thread (loop.c): its epoll loop, its reads and staged sends, eviction and the
 * upcalls it queues for Python; and the mutex protocol between it and Python's callers.
 */
#ifndef GOSSIPROUTER_RELAY_LOOP_H
#define GOSSIPROUTER_RELAY_LOOP_H

#include "relay.h"

/* Every Python caller takes the mutex through here: it says it waits (py_waiting) and holds
 * the turnstile until it has the mutex, so that the thread, which hands the mutex over between
 * connections, sleeps on the turnstile until then instead of taking the mutex straight back
 * (lock order: turn, then mu, on both sides). */
static inline void py_lock(Relay *r) {
    atomic_fetch_add_explicit(&r->py_waiting, 1, memory_order_relaxed);
    pthread_mutex_lock(&r->turn);
    pthread_mutex_lock(&r->mu);
    pthread_mutex_unlock(&r->turn);
    atomic_fetch_sub_explicit(&r->py_waiting, 1, memory_order_relaxed);
}

RELAY_INTERNAL void *thread_main(void *arg);
/* One round of a thread (the relay's, ``w`` NULL, or worker ``w``'s): the mutex taken, the
 * ``n`` events of one epoll_wait served, the mutex let go. 0, or -1: the relay stops. */
struct epoll_event;
RELAY_INTERNAL int relay_round(Relay *r, const struct epoll_event *evs, int n, worker_t *w);
RELAY_INTERNAL void signal_python(Relay *r);
RELAY_INTERNAL void stop_reading(Relay *r, conn_t *c);
/* Mutex held: ``c`` cannot go on (Python closes it: UP_LOST), and Python is told now. */
RELAY_INTERNAL void lose_conn(Relay *r, conn_t *c);
/* Route one frame to ``d`` (``a`` then ``b``), staged until the read is done (loop.c). */
RELAY_INTERNAL void deliver(Relay *r, conn_t *d, int64_t cid, const uint8_t *a, size_t alen,
                            const uint8_t *b, size_t blen);

#endif
