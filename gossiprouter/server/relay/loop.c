/*
 * The relay thread (relay.h, "Reading" and "Writing"): one epoll over the connections Python
 * handed over; each read is cut into frames (framing.c), each frame of a learned route
 * (routes.c) staged for its receivers and sent with one send per receiver when the read is
 * done. What a socket does not take evicts its connection to Python; what the thread cannot
 * relay goes up to Python as an upcall. Everything here runs with the mutex held.
 */
#include "loop.h"

#include "broker.h"
#include "framing.h"
#include "inbound.h"
#include "routes.h"
#include "workers.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

/* Pointers one receiver's send may carry (Linux's IOV_MAX); more are sent at once. */
#define STAGE_MAX_IOV 1024
/* A stage array this long is freed after the read that grew it (a fan-out to thousands). */
#define STAGE_KEEP 1024
#define WRAP_CHUNK (64 * 1024)
#define MAX_EVENTS 256

/* ------------------------------------------------------------------ upcalls (mutex held) */

static void write_signal(Relay *r) {
    uint64_t one = 1;
    ssize_t w = write(r->efd, &one, sizeof one);
    (void)w;
}

void signal_python(Relay *r) {
    if (!r->signalled) {
        write_signal(r);
        r->signalled = 1;
    }
}

/* The thread's upcalls: Python is told once the thread lets the mutex go (thread_main), not
 * while the thread still holds it for the rest of the read (its local sends). Told at once,
 * Python woke on the other core and waited for the mutex in upcalls() while holding the GIL:
 * a futex sleep, a hand-over and two more context switches per message (issue 30). */
static void signal_later(Relay *r) {
    if (!r->signalled) {
        r->signalled = 1;
        r->signal_due = 1;
    }
}

/* Write the eventfd for the upcalls signal_later held back (mutex held or not: only the
 * thread touches signal_due). */
static void signal_now(Relay *r) {
    if (r->signal_due) {
        r->signal_due = 0;
        write_signal(r);
    }
}

/* No memory for an upcall about ``c``: whatever it said (bytes to handle, an end of stream, an
 * eviction) is lost, so the connection cannot go on. It is put on the lost list, which needs
 * no allocation; Python closes it (UP_LOST, after the queued upcalls) and counts it. */
static void lose(Relay *r, conn_t *c) {
    stop_reading(r, c);
    if (!c->lost) {
        c->lost = 1;
        c->lost_next = r->lost_head;
        r->lost_head = c;
        r->lost++;
    }
    signal_later(r);
}

void lose_conn(Relay *r, conn_t *c) {
    lose(r, c);
    signal_now(r);
}

/* Queue an upcall (mutex held); on allocation failure the connection is lost (above).
 * 0: queued. */
static int upcall(Relay *r, int64_t cid, int kind, const uint8_t *data, size_t len) {
    conn_t *c = get_conn(r, cid);
    if (c != NULL && c->lost) return -1; /* Python closes it: nothing more about it matters */
    up_t *u = NULL;
    if (r->fail_upcalls > 0) r->fail_upcalls--;
    else u = malloc(sizeof(up_t) + len);
    if (u == NULL) {
        if (c != NULL) lose(r, c);
        return -1;
    }
    u->next = NULL;
    u->cid = cid;
    u->kind = kind;
    u->len = len;
    if (len) memcpy(u->data, data, len);
    if (r->up_tail) r->up_tail->next = u;
    else r->up_head = u;
    r->up_tail = u;
    r->up_count++;
    r->upcalls++;
    signal_later(r);
    return 0;
}

/* The remote share of frames relayed to their local receivers, as received: up to Python
 * (UP_REMOTE, UP_REMOTE_J5 for a 5.x connection's, UP_REMOTE_J2 for a 2.12 connection's:
 * Python cuts them by the upcall's kind, which outlives the connection). */
static void remote_up(Relay *r, const conn_t *c, int64_t cid, const uint8_t *p, size_t n) {
    int kind = c->kind == JG5 ? UP_REMOTE_J5 : c->kind == JG2 ? UP_REMOTE_J2 : UP_REMOTE;
    if (n && upcall(r, cid, kind, p, n) == 0) r->held_remote += n;
}

void stop_reading(Relay *r, conn_t *c) {
    if (c->reading) {
        epoll_ctl(conn_ep(r, c), EPOLL_CTL_DEL, c->fd, NULL);
        c->reading = 0;
    }
}

/* ------------------------------------------------------------------ writing (mutex held) */

/* ``n`` bytes in the read's wrap area (chunks never moved while the read's sends point into
 * them; all but the first freed when the read is done), or NULL (no memory). */
static uint8_t *wrap_alloc(Relay *r, size_t n) {
    wrap_t *w = r->wrap;
    if (w != NULL && w->cap - w->len >= n) {
        uint8_t *p = w->data + w->len;
        w->len += n;
        return p;
    }
    size_t cap = n > WRAP_CHUNK ? n : WRAP_CHUNK;
    wrap_t *x = malloc(sizeof(wrap_t) + cap);
    if (x == NULL) return NULL;
    x->next = w;
    x->cap = cap;
    x->len = n;
    r->wrap = x;
    return x->data;
}

static void wrap_reset(Relay *r) {
    wrap_t *w = r->wrap;
    while (w != NULL && w->next != NULL) { /* the oldest (first) chunk is kept */
        wrap_t *next = w->next;
        free(w);
        w = next;
    }
    if (w != NULL && w->cap > WRAP_CHUNK) {
        free(w);
        w = NULL;
    }
    if (w != NULL) w->len = 0;
    r->wrap = w;
}

static struct iovec *stage_iov(stage_t *s) { return s->heap ? s->heap : s->inl; }

/* ``d``'s stage for the read being relayed (NULL: no memory for one; the caller sends now). */
static stage_t *stage_of(Relay *r, conn_t *d, int64_t cid) {
    if (d->stage) return &r->dirty[d->stage - 1];
    if (r->ndirty == r->capdirty) {
        size_t n = r->capdirty ? r->capdirty * 2 : 64;
        stage_t *p = realloc(r->dirty, n * sizeof(stage_t));
        if (p == NULL) return NULL;
        r->dirty = p;
        r->capdirty = n;
    }
    stage_t *s = &r->dirty[r->ndirty++];
    s->cid = cid;
    s->niov = 0;
    s->cap = STAGE_INLINE;
    s->heap = NULL;
    s->bytes = 0;
    d->stage = r->ndirty;
    return s;
}

/* Room for ``n`` more pointers in ``s``: 0, or -1 (full, or no memory: send what it has). */
static int stage_room(stage_t *s, int n) {
    if (s->niov + n <= s->cap) return 0;
    if (s->niov + n > STAGE_MAX_IOV) return -1;
    int cap = s->cap * 4 > STAGE_MAX_IOV ? STAGE_MAX_IOV : s->cap * 4;
    struct iovec *p = realloc(s->heap, (size_t)cap * sizeof(struct iovec));
    if (p == NULL) return -1;
    if (s->heap == NULL) memcpy(p, s->inl, (size_t)s->niov * sizeof(struct iovec));
    s->heap = p;
    s->cap = cap;
    return 0;
}

static void stage_add(Relay *r, stage_t *s, const uint8_t *p, size_t n) {
    if (n == 0) return;
    struct iovec *iov = stage_iov(s);
    /* Frames of one route follow each other in the read buffer: one pointer for them all. */
    if (s->niov && (const uint8_t *)iov[s->niov - 1].iov_base + iov[s->niov - 1].iov_len == p) {
        iov[s->niov - 1].iov_len += n;
    } else {
        iov[s->niov].iov_base = (void *)p;
        iov[s->niov].iov_len = n;
        s->niov++;
    }
    s->bytes += n;
    r->staged += n;
}

/* The pending bytes of ``d`` could not be allocated: its stream cannot be kept whole, so the
 * connection is ended (its reader meets the shutdown; the server's close path runs). */
static void evict(Relay *r, conn_t *d, int64_t cid);

static void break_conn(Relay *r, conn_t *d, int64_t cid) {
    shutdown(d->fd, SHUT_RDWR);
    r->broken++;
    evict(r, d, cid);
}

/* Keep the ``n`` bytes of ``iov`` after the first ``skip`` for Python: the one copy the thread
 * makes, of what a socket did not take. */
static void keep_pending(Relay *r, conn_t *d, int64_t cid, const struct iovec *iov, int niov,
                         size_t skip) {
    size_t n = 0;
    for (int i = 0; i < niov; i++) n += iov[i].iov_len;
    if (n <= skip) return;
    n -= skip;
    uint8_t *p = realloc(d->pend, d->plen + n);
    if (p == NULL) {
        break_conn(r, d, cid);
        return;
    }
    d->pend = p;
    for (int i = 0; i < niov; i++) {
        size_t len = iov[i].iov_len;
        const uint8_t *base = iov[i].iov_base;
        if (skip >= len) {
            skip -= len;
            continue;
        }
        memcpy(d->pend + d->plen, base + skip, len - skip);
        d->plen += len - skip;
        skip = 0;
    }
    r->held_pending += n;
}

static void evict(Relay *r, conn_t *d, int64_t cid) {
    if (!d->evicting) {
        d->evicting = 1;
        upcall(r, cid, UP_EVICT, NULL, 0);
    }
}

/* Send what is staged for ``d``; what its socket does not take is kept (pending) and ``d`` is
 * evicted (EAGAIN, a partial write or an error: Python's writer takes over, and meets the
 * error if it was one). */
static void flush_stage(Relay *r, conn_t *d, stage_t *s) {
    int niov = s->niov;
    if (niov == 0) return;
    struct iovec *iov = stage_iov(s);
    size_t total = s->bytes;
    r->staged -= total;
    s->niov = 0;
    s->bytes = 0;
    if (d->evicting) { /* evicted by an earlier send of this read: all of it waits */
        keep_pending(r, d, s->cid, iov, niov, 0);
        return;
    }
    ssize_t n;
    if (niov == 1) { /* the usual case (a run of one route): send is a little cheaper */
        n = send(d->fd, iov[0].iov_base, iov[0].iov_len, MSG_DONTWAIT | MSG_NOSIGNAL);
    } else {
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
        n = sendmsg(d->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    }
    if (n > 0) {
        d->writes++;
        d->bytes_out += (uint64_t)n;
        d->touched = 1;
    }
    if (n == (ssize_t)total) return;
    keep_pending(r, d, s->cid, iov, niov, n > 0 ? (size_t)n : 0);
    evict(r, d, s->cid);
}

/* Route one frame to ``d``: ``a`` (the learned output header) then ``b`` (the frame's bytes,
 * in the read buffer), staged until the read is done (flush_dirty); the caller counts it.
 * Nothing is copied unless ``d`` is evicted while this read is relayed (then its socket did
 * not take an earlier send: the frame waits behind it, pending). */
void deliver(Relay *r, conn_t *d, int64_t cid, const uint8_t *a, size_t alen,
             const uint8_t *b, size_t blen) {
    struct iovec frame[2] = {{(void *)a, alen}, {(void *)b, blen}};
    d->touched = 1;
    if (d->evicting) {
        keep_pending(r, d, cid, frame, 2, 0);
        return;
    }
    stage_t one = {.cid = cid, .cap = STAGE_INLINE};
    stage_t *s = stage_of(r, d, cid);
    if (s == NULL) s = &one; /* no memory to stage it: sent now */
    if (stage_room(s, (alen > 0) + (blen > 0)) < 0) {
        flush_stage(r, d, s); /* what it has goes first; then there is inline room */
        if (d->evicting) {
            keep_pending(r, d, cid, frame, 2, 0);
            return;
        }
    }
    stage_add(r, s, a, alen);
    stage_add(r, s, b, blen);
    if (s == &one) {
        flush_stage(r, d, s);
        free(one.heap);
    }
}

/* The read is done: every receiver it routed to gets its frames, in one send each. */
static void flush_dirty(Relay *r) {
    for (size_t i = 0; i < r->ndirty; i++) {
        stage_t *s = &r->dirty[i];
        conn_t *d = get_conn(r, s->cid);
        if (d != NULL) {
            d->stage = 0;
            flush_stage(r, d, s);
        }
        free(s->heap);
    }
    r->ndirty = 0;
    r->staged = 0;
    wrap_reset(r);
    if (r->capdirty > STAGE_KEEP) {
        free(r->dirty);
        r->dirty = NULL;
        r->capdirty = 0;
    }
}

/* ------------------------------------------------------------------ reading (mutex held) */

/* A read is relayed up to ``pos``: the rest is kept (the start of a frame), or goes to Python
 * with everything after it (``up``), and the thread reads no more until Python says so. */
static void end_read(Relay *r, conn_t *c, int64_t cid, const uint8_t *buf, size_t pos,
                     size_t len, int up) {
    if (!up && pos < len && keep_rest(r, c, buf, pos, len) < 0) up = 1;
    if (up) {
        c->raw = 0;
        stop_reading(r, c);
        upcall(r, cid, UP_DATA, buf + pos, len - pos);
        drop_hold(r, c);
        return;
    }
    if (pos == len) drop_hold(r, c);
}

/* The broker connection's read (MQTT, inbound.c): the whole QoS 0 PUBLISH packets the thread
 * delivers itself; from the first other packet on, the read goes to Python (a PUBLISH cut by
 * the read's end is held for the next, within max_hold). */
static void mqtt_frames(Relay *r, conn_t *c, int64_t cid, const uint8_t *buf, size_t len) {
    size_t pos = 0;
    int up = c->raw;
    while (!up && pos < len) {
        size_t i = 1, rem = 0;
        int done = 0;
        while (i <= 4 && pos + i < len) {
            uint8_t b = buf[pos + i];
            rem |= (size_t)(b & 127) << (7 * (i - 1));
            i++;
            if (!(b & 128)) {
                done = 1;
                break;
            }
        }
        if (!done) { /* cut in its length, or not MQTT: Python's */
            up = i > 4 || buf[pos] != 0x30;
            break;
        }
        size_t need = i + rem;
        if (len - pos < need) { /* cut: held if it may be the thread's */
            up = buf[pos] != 0x30 || need > c->max_hold;
            break;
        }
        if (buf[pos] != 0x30 || !inbound(r, buf + pos + i, rem)) {
            up = 1;
            break;
        }
        pos += need;
    }
    flush_dirty(r);
    end_read(r, c, cid, buf, pos, len, up);
}

/* Relay the frames of ``buf`` (``len`` bytes read from ``c``: its held partial frame, if any,
 * and what was just received). */
static void relay_frames(Relay *r, conn_t *c, int64_t cid, const uint8_t *buf, size_t len) {
    size_t pos = 0, rstart = 0, rlen = 0; /* rstart, rlen: the remote share not yet up */
    int up = 0;
    if (c->kind == MQTT) {
        mqtt_frames(r, c, cid, buf, len);
        return;
    }
    forget_stale(r, c);
    if (c->raw || c->kind == 0) {
        up = 1;
    } else {
        while (pos < len) {
            route_t *rt = NULL;
            ssize_t flen = frame_len(r, c, &rt, buf + pos, len - pos);
            if (flen == 0) break;
            if (flen < 0) {
                up = 1;
                break;
            }
            /* A receiver the socket did not take everything from (its bytes wait for
             * Python's writer) or no longer written here: Python routes this frame, under its
             * queue bounds and back-pressure (Congestion pauses this sender). */
            int busy = 0;
            for (int i = 0; i < rt->ndest && !busy; i++) {
                conn_t *d = get_conn(r, rt->dests[i]);
                busy = d == NULL || !d->attached || d->evicting;
            }
            if (busy) {
                up = 1;
                break;
            }
            const uint8_t *tail = buf + pos + rt->skip;
            size_t tlen = (size_t)flen - rt->skip;
            /* Every staged byte may become pending (a socket that takes none of it): the
             * frame's copies must fit max_bytes with what is held, or Python routes it (one
             * shared bytes object, its own bounds). */
            size_t fan = (size_t)rt->ndest * (rt->olen + tlen);
            size_t held = r->held_partial + r->held_pending;
            if (held + r->staged + fan > r->max_bytes && r->staged) flush_dirty(r);
            held = r->held_partial + r->held_pending;
            /* The remote share: published here (broker.c, within the link's own bounds) or
             * handed to Python (within max_bytes). */
            int fed = rt->remote && rt->nfed && fed_usable(r);
            if (held + fan > r->max_bytes ||
                (rt->remote && !fed && r->held_remote + rlen + (size_t)flen > r->max_bytes)) {
                r->over_cap++;
                up = 1;
                break;
            }
            if (fed) {
                fed_frame(r, rt, buf + pos, (size_t)flen);
            } else if (rt->remote) { /* contiguous frames go up as one upcall */
                if (rlen && rstart + rlen != pos) {
                    remote_up(r, c, cid, buf + rstart, rlen);
                    rlen = 0;
                }
                if (!rlen) rstart = pos;
                rlen += (size_t)flen;
            }
            const uint8_t *head = rt->out;
            size_t hlen = rt->olen;
            /* A frame sent re-wrapped (2.12): written once, after the read's earlier ones, and
             * shared by its receivers, so that a run of them is one pointer per receiver as
             * for the frames sent as received (a send from two pointers a frame costs more than
             * this copy: 2.12 unicast flood 0.65x the deliveries/s). Without memory for it,
             * the header and the rest are pointed at. */
            uint8_t *w = hlen ? wrap_alloc(r, hlen + tlen) : NULL;
            if (w != NULL) {
                memcpy(w, head, hlen);
                memcpy(w + hlen, tail, tlen);
                tail = w;
                tlen += hlen;
                head = NULL;
                hlen = 0;
            }
            for (int i = 0; i < rt->ndest; i++) {
                conn_t *d = get_conn(r, rt->dests[i]);
                d->delivered++;
                deliver(r, d, rt->dests[i], head, hlen, tail, tlen);
            }
            c->frames++;
            c->bytes_in += (uint64_t)flen; /* what goes up is counted by Python */
            pos += (size_t)flen;
        }
    }
    /* What this read routed goes out before anything it points into changes; its remote
     * share goes up before any DATA of the same read (Python sends them in that order). */
    flush_dirty(r);
    remote_up(r, c, cid, buf + rstart, rlen);
    fed_end_read(r); /* (copied out of the read buffer before it changes) */
    end_read(r, c, cid, buf, pos, len, up);
}

/* Read ``c``: into the thread's buffer, or behind the partial frame it holds. */
static void on_readable(Relay *r, conn_t *c, int64_t cid) {
    uint8_t *buf = r->scratch;
    size_t have = c->hlen;
    if (have) {
        if (c->hcap < have + RECV_SIZE) {
            uint8_t *p = realloc(c->hold, have + RECV_SIZE);
            if (p == NULL) {
                stop_reading(r, c);
                upcall(r, cid, UP_DATA, c->hold, have);
                drop_hold(r, c);
                upcall(r, cid, UP_ERROR, NULL, 0);
                return;
            }
            c->hold = p;
            c->hcap = have + RECV_SIZE;
        }
        buf = c->hold;
    }
    ssize_t n = recv(c->fd, buf + have, RECV_SIZE, MSG_DONTWAIT);
    if (n <= 0) {
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            uint8_t *p = have ? realloc(c->hold, have) : NULL; /* back to its exact size */
            if (p != NULL) set_hold(r, c, p, have, have);
            return;
        }
        stop_reading(r, c);
        if (have) upcall(r, cid, UP_DATA, buf, have);
        drop_hold(r, c);
        upcall(r, cid, n == 0 ? UP_EOF : UP_ERROR, NULL, 0);
        return;
    }
    c->last_ns = now_ns();
    c->last_read = (size_t)n;
    c->touched = 1;
#ifdef RELAY_EXACT_READ_BUFFER
    /* The proof's ASAN build (setup.py): no slack after the bytes received, so that ASAN
     * reports a frame check that reads past them. */
    uint8_t *exact = NULL;
    if (buf == r->scratch) {
        exact = malloc((size_t)n);
        if (exact != NULL) {
            memcpy(exact, buf, (size_t)n);
            buf = exact;
        }
    } else {
        uint8_t *p = realloc(c->hold, have + (size_t)n);
        if (p != NULL) {
            c->hold = buf = p;
            c->hcap = have + (size_t)n;
        }
    }
#endif
    relay_frames(r, c, cid, buf, have + (size_t)n);
#ifdef RELAY_EXACT_READ_BUFFER
    free(exact);
#endif
}

int relay_round(Relay *r, const struct epoll_event *evs, int n, worker_t *w) {
    pthread_mutex_lock(&r->mu);
    if (r->stopping) {
        pthread_mutex_unlock(&r->mu);
        return -1;
    }
    r->rounds++;
    for (int i = 0; i < n; i++) {
        if (evs[i].data.u64 == FED_EVENT) { /* the broker socket takes bytes again */
            fed_writable(r);
            continue;
        }
        int64_t cid = (int64_t)evs[i].data.u64;
        if (cid < 0) continue; /* the stop fd */
        conn_t *c = get_conn(r, cid);
        if (c == NULL || !c->reading) continue;
        on_readable(r, c, cid);
        /* One connection's chunk is done: what it routed goes out now (latency). */
        if (r->ndirty) flush_dirty(r);
        after_read(r, c, cid, w); /* a thread of its own for it, or no longer (a read never
                                    * frees its connection: only Python's close does) */
        /* More connections to read in this round, or a Python call waiting for the mutex
         * (it may be upcalls()): Python is told now, as before; else when the round ends. */
        if (i + 1 < n || atomic_load_explicit(&r->py_waiting, memory_order_relaxed))
            signal_now(r);
        /* A Python call waits for the mutex, holding the GIL: it goes first, so the hold is
         * one connection's read and sends at most, not a round's (up to MAX_EVENTS
         * connections). The thread sleeps on the turnstile, which the caller holds until
         * it has the mutex: a plain unlock and lock would mostly take the mutex back
         * before the caller wakes up. */
        if (atomic_load_explicit(&r->py_waiting, memory_order_relaxed)) {
            fed_flush(r); /* the thread's messages to the broker go before Python's */
            r->handoffs++;
            pthread_mutex_unlock(&r->mu);
            pthread_mutex_lock(&r->turn);
            pthread_mutex_lock(&r->mu);
            pthread_mutex_unlock(&r->turn);
            if (r->stopping) break;
        }
    }
    fed_flush(r); /* what the round routed to other routers, one message per router */
    int due = r->signal_due;
    r->signal_due = 0;
    pthread_mutex_unlock(&r->mu);
    if (due) write_signal(r);
    return 0;
}

void *thread_main(void *arg) {
    Relay *r = arg;
    struct epoll_event evs[MAX_EVENTS];
    relay_sched(r);
    sem_post(&r->ready);
    for (;;) {
        int n = epoll_wait(r->ep, evs, MAX_EVENTS, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (relay_round(r, evs, n, NULL) < 0) break;
    }
    return NULL;
}
