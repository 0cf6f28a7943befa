/*
 * Threads of their own for the busy connections (issue 30, the light-load floor).
 *
 * The relay thread waits on one epoll for every connection, so at light load each message
 * wakes that one thread, wherever it last ran, and then a receiver. A reader thread per
 * connection (Java 5.x's model, and benchmarks/floor/threads.c) is woken straight by its
 * sender's write, and had the lower latency on a machine whose idle CPUs halt.
 *
 * So a connection that reads often, a little at a time (Relay.promote_reads reads within
 * BURST_NS, each below FULL_READ), gets a worker: a thread with an epoll of its own that holds
 * that connection only, and serves it exactly as the relay thread would (relay_round), under
 * the same mutex. Everything else stays on the relay thread: the idle thousands, the broker
 * link, a connection that floods. A worker gives its connection back to the relay thread, and
 * parks (it waits on its epoll, which then holds the stop fd only), when the connection has
 * not read for Relay.idle_ms, or found a backlog FULL_READS reads in a row; a closed
 * connection parks its worker at once. Workers start on first use and end with the relay;
 * there are Relay.nworkers at most (Relay(threads=N)), and with every one serving a
 * connection, the next busy ones stay on the relay thread, as before.
 *
 * Every read is still made under the mutex, whichever thread makes it, so a connection's
 * frames are handled in order even while it moves between threads (an event the thread that
 * gave it up still holds finds nothing to read, or reads in turn). Everything here runs with
 * the mutex held, but the workers' waits.
 */
#include "workers.h"

#include "loop.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <unistd.h>

#define BURST_NS (100 * 1000000LL)
/* A read of this many bytes or more found a backlog: the connection sends faster than it is
 * read, and one thread's rounds (several connections' reads under one hold of the mutex) serve
 * it better than a thread of its own contending for the mutex (4 flooding workers: 0.6x the
 * deliveries/s). Such a read does not count towards a promotion, and FULL_READS of them in a
 * row send a worker's connection back. */
#define FULL_READ (RECV_SIZE / 2)
#define FULL_READS 4
#define WORKER_EVENTS 4

int workers_init(Relay *r, int n) {
    worker_t *w = n > 0 ? calloc((size_t)n, sizeof(worker_t)) : NULL;
    if (n > 0 && w == NULL) return -1;
    for (int i = 0; i < n; i++) {
        w[i].r = r;
        w[i].ep = -1;
        w[i].cid = -1;
    }
    workers_free(r);
    r->workers = w;
    r->nworkers = n;
    return 0;
}

void workers_free(Relay *r) {
    for (int i = 0; i < r->nworkers; i++)
        if (r->workers[i].ep >= 0) close(r->workers[i].ep);
    free(r->workers);
    r->workers = NULL;
    r->nworkers = 0;
}

int workers_busy(const Relay *r) {
    int n = 0;
    for (int i = 0; i < r->nworkers; i++)
        n += r->workers[i].cid >= 0;
    return n;
}

/* Move ``c``'s reading from epoll ``from`` to ``to`` (if it is being read). 0, or -1: it stays. */
static int move_conn(conn_t *c, int64_t cid, int from, int to) {
    if (!c->reading) return 0;
    if (watch_in(to, c->fd, (uint64_t)cid) < 0) return -1;
    epoll_ctl(from, EPOLL_CTL_DEL, c->fd, NULL);
    return 0;
}

/* Mutex held: ``w``'s connection (``c``, NULL if closed) goes back to the relay thread, and
 * ``w`` parks. -1: it could not be added to the relay thread's epoll (no memory): it stays. */
static int demote(Relay *r, worker_t *w, conn_t *c, int64_t cid) {
    if (c != NULL) {
        if (move_conn(c, cid, w->ep, r->ep) < 0) return -1;
        c->worker = 0;
        c->burst = 0;
        r->demotions++;
    }
    w->cid = -1;
    return 0;
}

/* A worker's idle wait ended (mutex not held): its connection, if quiet for idle_ms, is given
 * back. 0, or -1: the relay stops. */
static int idle_check(Relay *r, worker_t *w) {
    pthread_mutex_lock(&r->mu);
    int stop = r->stopping;
    int64_t cid = w->cid;
    if (!stop && cid >= 0) {
        conn_t *c = get_conn(r, cid);
        if (c == NULL || now_ns() - c->last_ns >= (int64_t)r->idle_ms * 1000000)
            demote(r, w, c, cid);
    }
    pthread_mutex_unlock(&r->mu);
    return stop ? -1 : 0;
}

void relay_sched(Relay *r) {
    if (!r->batch) return;
    struct sched_param sp = {0};
    /* pid 0: this thread alone (Linux). Any thread may take SCHED_BATCH from SCHED_OTHER, but
     * a seccomp filter or an earlier SCHED_IDLE may refuse it. */
    if (sched_setscheduler(0, SCHED_BATCH, &sp) != 0) {
        int none = 0;
        atomic_compare_exchange_strong(&r->sched_refused, &none, errno ? errno : EPERM);
    }
}

static void *worker_main(void *arg) {
    worker_t *w = arg;
    Relay *r = w->r;
    struct epoll_event evs[WORKER_EVENTS];
    relay_sched(r);
    for (;;) {
        /* Parked or not, it looks every idle_ms: a connection promoted to it that never reads
         * again must not hold it (idle_ms is set before the thread starts). */
        int n = epoll_wait(w->ep, evs, WORKER_EVENTS, r->idle_ms);
        if (n < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (n == 0 ? idle_check(r, w) < 0 : relay_round(r, evs, n, w) < 0) break;
    }
    return NULL;
}

/* A parked worker, started if need be (mutex held), or NULL. */
static worker_t *free_worker(Relay *r) {
    for (int i = 0; i < r->nworkers; i++) {
        worker_t *w = &r->workers[i];
        if (w->cid >= 0) continue;
        if (w->started) return w;
        if (w->ep < 0) {
            int ep = epoll_create1(EPOLL_CLOEXEC);
            if (ep < 0) return NULL;
            if (watch_in(ep, r->stopfd, (uint64_t)-1) < 0) {
                close(ep);
                return NULL;
            }
            w->ep = ep;
        }
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) return NULL;
        w->started = 1;
        return w;
    }
    return NULL;
}

/* Mutex held, after a read of ``c`` (``cid``) by the relay thread (``w`` NULL) or by worker
 * ``w``. */
void after_read(Relay *r, conn_t *c, int64_t cid, worker_t *w) {
    if (r->nworkers == 0) return;
    if (w != NULL) {
        c->full = c->last_read >= FULL_READ ? c->full + 1 : 0;
        if (c->full >= FULL_READS && c->worker) {
            c->full = 0;
            demote(r, &r->workers[c->worker - 1], c, cid);
        }
        return;
    }
    if (c->worker || !c->reading) return;
    if (c->kind != NATIVE && c->kind != JG2 && c->kind != JG5) return;
    int64_t t = c->last_ns;
    if (t - c->burst_ns > BURST_NS || c->last_read >= FULL_READ) {
        c->burst_ns = t;
        c->burst = 0;
        if (c->last_read >= FULL_READ) return;
    }
    if (++c->burst < r->promote_reads) return;
    c->burst = 0;
    worker_t *free = free_worker(r);
    if (free == NULL || move_conn(c, cid, r->ep, free->ep) < 0) return;
    c->worker = (int)(free - r->workers) + 1;
    c->full = 0;
    free->cid = cid;
    r->promotions++;
}

void release_worker(Relay *r, conn_t *c) {
    if (!c->worker) return;
    r->workers[c->worker - 1].cid = -1;
    c->worker = 0;
}

void workers_stop(Relay *r) {
    for (int i = 0; i < r->nworkers; i++) {
        worker_t *w = &r->workers[i];
        if (w->started) pthread_join(w->thread, NULL);
        w->started = 0;
    }
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->nworkers; i++) {
        worker_t *w = &r->workers[i];
        int64_t cid = w->cid;
        conn_t *c = get_conn(r, cid);
        /* Its worker is gone: a connection that cannot go back is closed (UP_LOST), not left
         * unread. */
        if (cid >= 0 && demote(r, w, c, cid) < 0) {
            lose_conn(r, c);
            c->worker = 0;
            w->cid = -1;
        }
    }
    pthread_mutex_unlock(&r->mu);
}
