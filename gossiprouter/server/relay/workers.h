/*
 * Threads of their own for the busy connections (workers.c): promotion, demotion, and the
 * workers' life beside the relay thread's.
 */
#ifndef GOSSIPROUTER_RELAY_WORKERS_H
#define GOSSIPROUTER_RELAY_WORKERS_H

#include "relay.h"

/* ``n`` workers at most (0: every connection on the relay thread); 0, or -1 (no memory). */
RELAY_INTERNAL int workers_init(Relay *r, int n);
/* Mutex held, after a read of the connection by the relay thread (``w`` NULL: counted, and
 * moved to a worker of its own once it is busy) or by worker ``w`` (given back if it floods). */
RELAY_INTERNAL void after_read(Relay *r, conn_t *c, int64_t cid, worker_t *w);
/* Mutex held: ``c`` is closed; its worker (if any) is parked. */
RELAY_INTERNAL void release_worker(Relay *r, conn_t *c);
/* The relay is stopping (``stopping`` set, the stop fd written, the mutex not held): the
 * workers end, and their connections go back to the relay thread's epoll. */
RELAY_INTERNAL void workers_stop(Relay *r);
RELAY_INTERNAL void workers_free(Relay *r);
/* The calling thread (the relay's or a worker) takes the relay's scheduling policy:
 * SCHED_BATCH if Relay.batch (a refusal is kept in Relay.sched_refused), else as it is. */
RELAY_INTERNAL void relay_sched(Relay *r);
/* How many workers serve a connection now (mutex held). */
RELAY_INTERNAL int workers_busy(const Relay *r);

#endif
