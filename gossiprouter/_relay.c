/*
 * gossiprouter._relay: the optional compiled fast path (issue 16, docs/performance.md).
 *
 * A Relay is one OS thread that owns an epoll and relays, without the GIL, the routed frames
 * of connections whose routing decision Python has already made once. It is the pure-Python
 * dispatcher (gossiprouter/dispatch.py) with the wait, the read, the frame cutting and the
 * send moved out of the interpreter; every decision stays Python's:
 *
 *   - Reading. A connection Python hands over (``read``) is read by the thread. A chunk is cut
 *     into frames by the connection's framing (NATIVE: GRTR frames; JG2: JGroups 2.12
 *     GossipData). A frame is relayed here only if it starts with a header Python has
 *     ``learn``ed for that connection (the exact header bytes, as the Python scanners' header
 *     caches key them) and is a plain routed frame of that header (NATIVE: the payload is one
 *     msgpack bin ending with the frame; JG2: a non-empty buffer; JG5: a payload whose length
 *     ends the frame). Anything else (a control
 *     frame, a header not learned, an oversized frame, a frame cut by the chunk that is not a
 *     learned route) ends the thread's reading of that connection: the bytes from there on
 *     are queued for Python (an upcall) and the thread reads the connection again only when
 *     Python says so (``read`` again), so a connection's frames are handled in order, some
 *     here and the rest by Python.
 *   - Writing. A connection Python ``attach``es is written by the thread and by Python's
 *     ``send`` only, under one mutex, so the bytes of two frames never interleave. What the
 *     socket does not take at once is kept (the pending bytes) and the connection is
 *     *evicted*: the thread writes nothing more to it (what it routes there is appended to
 *     the pending bytes, within ``max_pending``), queues an EVICT upcall, and Python takes
 *     the pending bytes (``take``) into its own outbox, whose writer task and slow-consumer
 *     policy carry on as without the relay. Python's own ``send`` to a connection that the
 *     socket does not fully take detaches it at once (Python queues the rest).
 *   - Decisions. ``learn(cid, key, out, skip, max_frame, dests)``: frames from ``cid`` that
 *     start with ``key`` go, as ``out`` followed by the frame's bytes from ``skip`` on, to the
 *     ``dests`` (connection ids, every one attached). ``invalidate`` forgets every learned
 *     decision (the routing table changed: Python calls it on every change); detaching or
 *     closing a connection does too. A decision is never used after the change that made it
 *     stale, because both take the mutex.
 *
 * Nothing here calls into Python from the thread. Every resource is bounded: the learned
 * routes per connection (MAX_ROUTES), a held partial frame (MAX_HOLD), the pending bytes of a
 * receiver (max_pending, after which the receiver is dropped from (``drop``) or closed by
 * Python (SLOW upcall) as the slow-consumer policy says).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define NATIVE 1
#define JG2 2
#define JG5 3

/* upcall kinds */
#define UP_DATA 0  /* bytes Python must handle (the thread stopped reading the connection) */
#define UP_EOF 1   /* the peer closed its side (after any bytes in an earlier DATA) */
#define UP_ERROR 2 /* a read failed (reset) */
#define UP_EVICT 3 /* the connection has pending bytes: take() them */
#define UP_SLOW 4  /* the pending bytes would exceed max_pending: close it (policy disconnect) */

#define MAX_ROUTES 64
#define MAX_HOLD (256 * 1024)
#define RECV_SIZE (64 * 1024)
#define MAX_EVENTS 256
#define IDX_BITS 20
#define IDX_MASK ((1u << IDX_BITS) - 1)

typedef struct {
    uint8_t *key;
    uint32_t klen;
    uint8_t *out;
    uint32_t olen;
    uint32_t skip;
    uint32_t max_frame;
    int ndest;
    int64_t *dests;
} route_t;

typedef struct {
    int active;
    int fd;
    uint32_t gen;
    int kind;      /* NATIVE / JG2 / 0 (passthrough) */
    int reading;   /* registered in the epoll */
    int raw;       /* the next chunk goes up unparsed (Python holds a partial frame) */
    int attached;  /* the thread and send() may write to it */
    int evicting;  /* pending bytes await take(): no direct writes */
    int slow;      /* over max_pending with policy disconnect: SLOW sent, nothing more */
    int drop;      /* slow-consumer policy: 1 drop, 0 disconnect */
    int dirty;
    size_t max_pending;
    size_t max_hold; /* the largest frame held across reads (<= MAX_HOLD) */
    uint8_t *rbuf;
    size_t rlen, rcap;
    uint8_t *pend;
    size_t plen, pcap;
    route_t *routes; /* MAX_ROUTES, allocated at the first learn (idle connections have none) */
    int nroutes;
    int last_hit;
    uint64_t epoch;
    /* since the last collect() */
    uint64_t bytes_in, frames, delivered, bytes_out, writes, drops;
    int64_t last_ns;
    int touched;
} conn_t;

typedef struct up_s {
    struct up_s *next;
    int64_t cid;
    int kind;
    size_t len;
    uint8_t data[];
} up_t;

typedef struct {
    PyObject_HEAD
    pthread_mutex_t mu;
    pthread_t thread;
    int thread_started;
    int stopping;
    int ep;
    int efd;      /* eventfd: upcalls are queued */
    int stopfd;   /* eventfd: the thread must end */
    conn_t **conns;
    size_t nconns, capconns;
    int64_t *free_idx;
    size_t nfree;
    uint32_t next_gen;
    uint64_t epoch;
    up_t *up_head, *up_tail;
    size_t up_count;
    int signalled;
    int64_t *dirty;
    size_t ndirty, capdirty;
    /* totals since the last collect() */
    uint64_t rounds, upcalls, invalidations;
} Relay;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int64_t make_cid(uint32_t idx, uint32_t gen) { return ((int64_t)gen << IDX_BITS) | idx; }

static conn_t *get_conn(Relay *r, int64_t cid) {
    if (cid < 0) return NULL;
    size_t idx = (size_t)(cid & IDX_MASK);
    if (idx >= r->nconns) return NULL;
    conn_t *c = r->conns[idx];
    if (c == NULL || !c->active || c->gen != (uint32_t)(cid >> IDX_BITS)) return NULL;
    return c;
}

static void free_routes(conn_t *c) {
    for (int i = 0; i < c->nroutes; i++) {
        free(c->routes[i].key);
        free(c->routes[i].out);
        free(c->routes[i].dests);
    }
    c->nroutes = 0;
    c->last_hit = 0;
}

static int reserve(uint8_t **buf, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t n = *cap ? *cap : 4096;
    while (n < need) n *= 2;
    uint8_t *b = realloc(*buf, n);
    if (b == NULL) return -1;
    *buf = b;
    *cap = n;
    return 0;
}

static void signal_python(Relay *r) {
    if (!r->signalled) {
        uint64_t one = 1;
        ssize_t w = write(r->efd, &one, sizeof one);
        (void)w;
        r->signalled = 1;
    }
}

/* Queue an upcall (mutex held). On allocation failure the bytes are lost: the connection is
 * then reported as failed, which closes it (nothing is lost silently). */
static void upcall(Relay *r, int64_t cid, int kind, const uint8_t *data, size_t len) {
    up_t *u = malloc(sizeof(up_t) + len);
    if (u == NULL) {
        if (kind == UP_DATA) {
            u = malloc(sizeof(up_t));
            if (u == NULL) return;
            kind = UP_ERROR;
            len = 0;
        } else {
            return;
        }
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
    signal_python(r);
}

static void stop_reading(Relay *r, conn_t *c) {
    if (c->reading) {
        epoll_ctl(r->ep, EPOLL_CTL_DEL, c->fd, NULL);
        c->reading = 0;
    }
}

/* ------------------------------------------------------------------ writing (mutex held) */

static void mark_dirty(Relay *r, conn_t *d, int64_t cid) {
    if (d->dirty) return;
    if (r->ndirty == r->capdirty) {
        size_t n = r->capdirty ? r->capdirty * 2 : 64;
        int64_t *p = realloc(r->dirty, n * sizeof(int64_t));
        if (p == NULL) return; /* flushed at the next round's end instead */
        r->dirty = p;
        r->capdirty = n;
    }
    r->dirty[r->ndirty++] = cid;
    d->dirty = 1;
}

/* Append one frame for ``d`` (written when the chunk is done: flush_dirty). */
static void deliver(Relay *r, conn_t *d, int64_t cid, const uint8_t *a, size_t alen,
                    const uint8_t *b, size_t blen) {
    size_t n = alen + blen;
    if (d->slow) return;
    /* What one chunk routes here is staged and sent when the chunk is done (a bounded
     * amount: a chunk is at most RECV_SIZE plus one held frame); the queue bound applies to
     * bytes that wait for the socket, as Python's does. */
    if (d->evicting && d->plen + n > d->max_pending) {
        if (d->drop) {
            d->drops++;
            d->touched = 1;
            return;
        }
        d->slow = 1;
        upcall(r, cid, UP_SLOW, NULL, 0);
        return;
    }
    if (reserve(&d->pend, &d->pcap, d->plen + n) < 0) {
        d->drops++;
        d->touched = 1;
        return;
    }
    if (alen) memcpy(d->pend + d->plen, a, alen);
    if (blen) memcpy(d->pend + d->plen + alen, b, blen);
    d->plen += n;
    d->delivered++;
    d->touched = 1;
    if (!d->evicting) mark_dirty(r, d, cid);
}

static void evict(Relay *r, conn_t *d, int64_t cid) {
    if (!d->evicting) {
        d->evicting = 1;
        upcall(r, cid, UP_EVICT, NULL, 0);
    }
}

static void flush_dirty(Relay *r) {
    for (size_t i = 0; i < r->ndirty; i++) {
        int64_t cid = r->dirty[i];
        conn_t *d = get_conn(r, cid);
        if (d == NULL) continue;
        d->dirty = 0;
        if (d->evicting || !d->plen) continue;
        ssize_t n = send(d->fd, d->pend, d->plen, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
            d->writes++;
            d->bytes_out += (uint64_t)n;
            d->touched = 1;
        }
        if (n == (ssize_t)d->plen) {
            d->plen = 0;
            if (d->pcap > 4 * RECV_SIZE) { /* a burst's buffer is not kept */
                free(d->pend);
                d->pend = NULL;
                d->pcap = 0;
            }
            continue;
        }
        if (n > 0) {
            memmove(d->pend, d->pend + n, d->plen - (size_t)n);
            d->plen -= (size_t)n;
        }
        /* EAGAIN, a partial write or an error: Python's writer takes over (and meets the
         * error, if it was one). */
        evict(r, d, cid);
    }
    r->ndirty = 0;
}

/* ------------------------------------------------------------------ reading (mutex held) */

static route_t *match(conn_t *c, const uint8_t *p, size_t avail) {
    int n = c->nroutes;
    if (n == 0) return NULL;
    int start = c->last_hit < n ? c->last_hit : 0;
    for (int k = 0; k < n; k++) {
        int i = (start + k) % n;
        route_t *rt = &c->routes[i];
        if (rt->klen <= avail && memcmp(p, rt->key, rt->klen) == 0) {
            c->last_hit = i;
            return rt;
        }
    }
    return NULL;
}

/* ``p`` (``avail`` bytes) is the start of a learned header, cut by the end of the chunk. */
static int starts_route(conn_t *c, const uint8_t *p, size_t avail) {
    for (int i = 0; i < c->nroutes; i++)
        if (avail < c->routes[i].klen && memcmp(p, c->routes[i].key, avail) == 0) return 1;
    return 0;
}

static uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* The payload of a whole length-prefixed frame (``p[q:end]``, after a learned header) makes it
 * a plain routed frame: NATIVE, one msgpack bin ending the frame; JG5, a u32 length ending it. */
static int payload_ends_frame(int kind, const uint8_t *p, size_t q, size_t end) {
    if (kind == JG5) return q + 4 + (size_t)be32(p + q) == end;
    uint8_t m = p[q];
    if (m == 0xc4) return q + 2 <= end && q + 2 + p[q + 1] == end;
    if (m == 0xc5) return q + 3 <= end && q + 3 + (((size_t)p[q + 1] << 8) | p[q + 2]) == end;
    if (m == 0xc6) return q + 5 <= end && q + 5 + (size_t)be32(p + q + 1) == end;
    return 0;
}

/* Where the frame at ``p`` (``avail`` bytes received) ends, for a learned route:
 * > 0: its length; 0: incomplete (wait for more); -1: not a frame relayed here. */
static ssize_t frame_len(conn_t *c, route_t **rtp, const uint8_t *p, size_t avail) {
    if (c->kind == NATIVE || c->kind == JG5) { /* a u32 length, then the learned header */
        if (avail < 4) return 0;
        uint32_t n = be32(p);
        if (n >= 0x80000000u) return -1; /* 5.x: the close marker, or an error: Python's */
        route_t *rt = match(c, p + 4, avail - 4);
        if (rt == NULL) {
            /* Cut before the end of its header: wait if a learned header may follow. A frame
             * already whole (shorter than the header) is not one: Python's, now. */
            if (avail < 4 + (size_t)n && 4 + (size_t)n <= c->max_hold &&
                starts_route(c, p + 4, avail - 4))
                return 0;
            return -1;
        }
        if (n > rt->max_frame || 4 + (size_t)n > c->max_hold) return -1;
        size_t end = 4 + (size_t)n;
        size_t q = 4 + rt->klen; /* where the payload's own header starts */
        if (q + (c->kind == JG5 ? 4 : 1) > end) return -1;
        if (avail < end) return 0;
        if (!payload_ends_frame(c->kind, p, q, end)) return -1;
        *rtp = rt;
        return (ssize_t)end;
    }
    if (c->kind == JG2) {
        route_t *rt = match(c, p, avail);
        if (rt == NULL) return starts_route(c, p, avail) ? 0 : -1;
        if (avail < rt->klen + 4) return 0;
        uint32_t n = be32(p + rt->klen);
        if (n == 0 || n > 0x7fffffffu) return -1;
        size_t end = rt->klen + 4 + (size_t)n;
        if (end > rt->max_frame || end > c->max_hold) return -1;
        if (avail < end) return 0;
        *rtp = rt;
        return (ssize_t)end;
    }
    return -1;
}

static void relay_frames(Relay *r, conn_t *c, int64_t cid) {
    size_t pos = 0;
    const uint8_t *buf = c->rbuf;
    size_t len = c->rlen;
    int up = 0;
    if (c->epoch != r->epoch) {
        free_routes(c);
        c->epoch = r->epoch;
    }
    if (c->raw || c->kind == 0) {
        up = 1;
    } else {
        while (pos < len) {
            route_t *rt = NULL;
            ssize_t flen = frame_len(c, &rt, buf + pos, len - pos);
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
                busy = d == NULL || !d->attached || d->evicting || d->slow;
            }
            if (busy) {
                up = 1;
                break;
            }
            const uint8_t *tail = buf + pos + rt->skip;
            size_t tlen = (size_t)flen - rt->skip;
            for (int i = 0; i < rt->ndest; i++)
                deliver(r, get_conn(r, rt->dests[i]), rt->dests[i], rt->out, rt->olen, tail,
                        tlen);
            c->frames++;
            c->bytes_in += (uint64_t)flen; /* what goes up is counted by Python */
            c->touched = 1;
            pos += (size_t)flen;
        }
    }
    if (up) {
        c->raw = 0;
        stop_reading(r, c);
        upcall(r, cid, UP_DATA, buf + pos, len - pos);
        c->rlen = 0;
        return;
    }
    if (pos) {
        memmove(c->rbuf, c->rbuf + pos, len - pos);
        c->rlen = len - pos;
    }
}

static void on_readable(Relay *r, conn_t *c, int64_t cid) {
    if (reserve(&c->rbuf, &c->rcap, c->rlen + RECV_SIZE) < 0) {
        stop_reading(r, c);
        upcall(r, cid, UP_ERROR, NULL, 0);
        return;
    }
    ssize_t n = recv(c->fd, c->rbuf + c->rlen, RECV_SIZE, MSG_DONTWAIT);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
        stop_reading(r, c);
        if (c->rlen) upcall(r, cid, UP_DATA, c->rbuf, c->rlen);
        c->rlen = 0;
        upcall(r, cid, UP_ERROR, NULL, 0);
        return;
    }
    if (n == 0) {
        stop_reading(r, c);
        if (c->rlen) upcall(r, cid, UP_DATA, c->rbuf, c->rlen);
        c->rlen = 0;
        upcall(r, cid, UP_EOF, NULL, 0);
        return;
    }
    c->rlen += (size_t)n;
#ifdef RELAY_EXACT_READ_BUFFER
    /* The proof's ASAN build (setup.py): no slack after the bytes received, so that ASAN
     * reports a frame check that reads past them. */
    uint8_t *exact = realloc(c->rbuf, c->rlen);
    if (exact != NULL) {
        c->rbuf = exact;
        c->rcap = c->rlen;
    }
#endif
    c->last_ns = now_ns();
    c->touched = 1;
    relay_frames(r, c, cid);
    if (c->rlen == 0 && c->rcap > 4 * RECV_SIZE) {
        free(c->rbuf);
        c->rbuf = NULL;
        c->rcap = 0;
    }
}

static void *thread_main(void *arg) {
    Relay *r = arg;
    struct epoll_event evs[MAX_EVENTS];
    for (;;) {
        int n = epoll_wait(r->ep, evs, MAX_EVENTS, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            break;
        }
        pthread_mutex_lock(&r->mu);
        if (r->stopping) {
            pthread_mutex_unlock(&r->mu);
            break;
        }
        r->rounds++;
        for (int i = 0; i < n; i++) {
            int64_t cid = (int64_t)evs[i].data.u64;
            if (cid < 0) continue; /* the stop fd */
            conn_t *c = get_conn(r, cid);
            if (c == NULL || !c->reading) continue;
            on_readable(r, c, cid);
            /* One connection's chunk is done: what it routed goes out now (latency). */
            if (r->ndirty) flush_dirty(r);
        }
        pthread_mutex_unlock(&r->mu);
    }
    return NULL;
}

/* ------------------------------------------------------------------ the Python type */

static int Relay_init(Relay *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "", kwlist)) return -1;
    if (pthread_mutex_init(&self->mu, NULL) != 0) {
        PyErr_SetString(PyExc_OSError, "pthread_mutex_init failed");
        return -1;
    }
    self->ep = epoll_create1(EPOLL_CLOEXEC);
    self->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    self->stopfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (self->ep < 0 || self->efd < 0 || self->stopfd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = (uint64_t)-1};
    if (epoll_ctl(self->ep, EPOLL_CTL_ADD, self->stopfd, &ev) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    self->next_gen = 1;
    return 0;
}

static PyObject *Relay_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    Relay *self = (Relay *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->ep = self->efd = self->stopfd = -1;
    return (PyObject *)self;
}

static void stop_thread(Relay *self) {
    if (!self->thread_started) return;
    pthread_mutex_lock(&self->mu);
    self->stopping = 1;
    pthread_mutex_unlock(&self->mu);
    uint64_t one = 1;
    ssize_t w = write(self->stopfd, &one, sizeof one);
    (void)w;
    Py_BEGIN_ALLOW_THREADS
    pthread_join(self->thread, NULL);
    Py_END_ALLOW_THREADS
    self->thread_started = 0;
}

static void free_conn(conn_t *c) {
    free_routes(c);
    free(c->routes);
    free(c->rbuf);
    free(c->pend);
    free(c);
}

static void Relay_dealloc(Relay *self) {
    stop_thread(self);
    for (size_t i = 0; i < self->nconns; i++)
        if (self->conns[i]) free_conn(self->conns[i]);
    free(self->conns);
    free(self->free_idx);
    free(self->dirty);
    up_t *u = self->up_head;
    while (u) {
        up_t *next = u->next;
        free(u);
        u = next;
    }
    if (self->ep >= 0) close(self->ep);
    if (self->efd >= 0) close(self->efd);
    if (self->stopfd >= 0) close(self->stopfd);
    pthread_mutex_destroy(&self->mu);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Relay_start(Relay *self, PyObject *unused) {
    if (self->thread_started) Py_RETURN_NONE;
    self->stopping = 0;
    uint64_t v; /* a stop() before: its wake-up must not end (or spin) the new thread */
    ssize_t rd = read(self->stopfd, &v, sizeof v);
    (void)rd;
    if (pthread_create(&self->thread, NULL, thread_main, self) != 0) {
        PyErr_SetString(PyExc_OSError, "could not start the relay thread");
        return NULL;
    }
    self->thread_started = 1;
    Py_RETURN_NONE;
}

static PyObject *Relay_stop(Relay *self, PyObject *unused) {
    stop_thread(self);
    Py_RETURN_NONE;
}

static PyObject *Relay_fileno(Relay *self, PyObject *unused) { return PyLong_FromLong(self->efd); }

/* open(fd, kind, max_pending, drop, max_hold=MAX_HOLD) -> cid: a connection the relay may
 * later read / write. ``max_hold``: the largest frame the thread holds across reads (a larger
 * one cut by a read goes to Python, which charges it to its router-wide budget for partial
 * frames: the thread's holds must stay within what Python admits without it). */
static PyObject *Relay_open(Relay *self, PyObject *args) {
    int fd, kind, drop;
    Py_ssize_t max_pending, max_hold = MAX_HOLD;
    if (!PyArg_ParseTuple(args, "iinp|n", &fd, &kind, &max_pending, &drop, &max_hold))
        return NULL;
    if (max_hold < 0 || max_hold > MAX_HOLD) max_hold = MAX_HOLD;
    if (kind != 0 && kind != NATIVE && kind != JG2 && kind != JG5) {
        PyErr_SetString(PyExc_ValueError, "unknown framing");
        return NULL;
    }
    conn_t *c = calloc(1, sizeof(conn_t));
    if (c == NULL) return PyErr_NoMemory();
    pthread_mutex_lock(&self->mu);
    size_t idx;
    if (self->nfree) {
        idx = (size_t)self->free_idx[--self->nfree];
    } else {
        if (self->nconns == self->capconns) {
            size_t n = self->capconns ? self->capconns * 2 : 256;
            if (n > IDX_MASK + 1) {
                pthread_mutex_unlock(&self->mu);
                free(c);
                PyErr_SetString(PyExc_OverflowError, "too many relay connections");
                return NULL;
            }
            conn_t **p = realloc(self->conns, n * sizeof(conn_t *));
            int64_t *f = realloc(self->free_idx, n * sizeof(int64_t));
            if (p) self->conns = p;
            if (f) self->free_idx = f;
            if (p == NULL || f == NULL) {
                pthread_mutex_unlock(&self->mu);
                free(c);
                return PyErr_NoMemory();
            }
            self->capconns = n;
        }
        idx = self->nconns++;
    }
    c->active = 1;
    c->fd = fd;
    c->gen = self->next_gen++ & ((1u << 30) - 1);
    if (c->gen == 0) c->gen = self->next_gen++;
    c->kind = kind;
    c->max_pending = (size_t)max_pending;
    c->max_hold = (size_t)max_hold;
    c->drop = drop;
    c->epoch = self->epoch;
    self->conns[idx] = c;
    int64_t cid = make_cid((uint32_t)idx, c->gen);
    pthread_mutex_unlock(&self->mu);
    return PyLong_FromLongLong(cid);
}

/* read(cid, raw, held=b""): the thread reads the connection (again). With ``held``, the start
 * of a frame Python's session kept (at most max_hold bytes), the next bytes continue it here;
 * with ``raw`` the next chunk goes to Python unparsed (Python keeps something it cannot hand
 * back: a larger frame, a 2.12 object in its decoder, the rest of a skipped frame). */
static PyObject *Relay_read(Relay *self, PyObject *args) {
    long long cid;
    int raw;
    Py_buffer held = {0};
    if (!PyArg_ParseTuple(args, "Lp|y*", &cid, &raw, &held)) return NULL;
    pthread_mutex_lock(&self->mu);
    conn_t *c = get_conn(self, cid);
    int ok = 0;
    if (c != NULL && held.len > 0) {
        /* The start of a frame Python cut and hands back: the next bytes continue it. Only
         * while nothing is buffered here (after an upcall), and within what is held. */
        if (c->rlen || (size_t)held.len > c->max_hold ||
            reserve(&c->rbuf, &c->rcap, (size_t)held.len + RECV_SIZE) < 0) {
            ok = EINVAL;
        } else {
            memcpy(c->rbuf, held.buf, (size_t)held.len);
            c->rlen = (size_t)held.len;
            raw = 0;
        }
    }
    if (c != NULL && !ok) {
        c->raw = raw;
        if (!c->reading) {
            struct epoll_event ev = {.events = EPOLLIN, .data.u64 = (uint64_t)cid};
            if (epoll_ctl(self->ep, EPOLL_CTL_ADD, c->fd, &ev) == 0) c->reading = 1;
            else ok = errno;
        }
    }
    pthread_mutex_unlock(&self->mu);
    if (held.obj != NULL) PyBuffer_Release(&held);
    if (c == NULL) {
        PyErr_SetString(PyExc_KeyError, "no such relay connection");
        return NULL;
    }
    if (ok) {
        errno = ok;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

/* The methods taking one connection id: parse it and take the mutex (-1: a parse error,
 * raised, and no mutex taken); *c is the connection or NULL (unknown or closed). */
static int lock_conn(Relay *self, PyObject *args, conn_t **c, long long *cid) {
    if (!PyArg_ParseTuple(args, "L", cid)) return -1;
    pthread_mutex_lock(&self->mu);
    *c = get_conn(self, *cid);
    return 0;
}

/* unread(cid) -> bytes: stop reading; the bytes of a partial frame held, for Python. */
static PyObject *Relay_unread(Relay *self, PyObject *args) {
    long long cid;
    conn_t *c;
    if (lock_conn(self, args, &c, &cid) < 0) return NULL;
    PyObject *out;
    if (c == NULL) {
        out = PyBytes_FromStringAndSize(NULL, 0);
    } else {
        stop_reading(self, c);
        out = PyBytes_FromStringAndSize((const char *)c->rbuf, (Py_ssize_t)c->rlen);
        c->rlen = 0;
    }
    pthread_mutex_unlock(&self->mu);
    return out;
}

/* attach(cid) -> bool: the thread may write to the connection (its queue is empty). */
static PyObject *Relay_attach(Relay *self, PyObject *args) {
    long long cid;
    conn_t *c;
    if (lock_conn(self, args, &c, &cid) < 0) return NULL;
    int ok = c != NULL && !c->slow;
    if (ok) {
        c->attached = 1;
        c->evicting = 0;
    }
    pthread_mutex_unlock(&self->mu);
    return PyBool_FromLong(ok);
}

static PyObject *take_pending_locked(Relay *self, conn_t *c) {
    PyObject *out = PyBytes_FromStringAndSize((const char *)c->pend, (Py_ssize_t)c->plen);
    c->plen = 0;
    if (c->attached) {
        c->attached = 0;
        self->epoch++; /* routes through it are void */
        self->invalidations++;
    }
    c->evicting = 0;
    return out;
}

/* take(cid) -> bytes: detach the connection from the thread's writes; its pending bytes. */
static PyObject *Relay_take(Relay *self, PyObject *args) {
    long long cid;
    conn_t *c;
    if (lock_conn(self, args, &c, &cid) < 0) return NULL;
    PyObject *out = c == NULL ? PyBytes_FromStringAndSize(NULL, 0) : take_pending_locked(self, c);
    pthread_mutex_unlock(&self->mu);
    return out;
}

/* close(cid) -> bytes: forget the connection (before its socket is closed); its pending
 * bytes. */
static PyObject *Relay_close(Relay *self, PyObject *args) {
    long long cid;
    conn_t *c;
    if (lock_conn(self, args, &c, &cid) < 0) return NULL;
    PyObject *out;
    if (c == NULL) {
        out = PyBytes_FromStringAndSize(NULL, 0);
    } else {
        stop_reading(self, c);
        out = take_pending_locked(self, c);
        size_t idx = (size_t)(cid & IDX_MASK);
        self->conns[idx] = NULL;
        self->free_idx[self->nfree++] = (int64_t)idx;
        self->epoch++;
        free_conn(c);
    }
    pthread_mutex_unlock(&self->mu);
    return out;
}

/* send(cid, data) -> int: write for Python, in order with the thread's writes: the bytes the
 * socket took; -1: the connection has pending bytes (take() them first); -2: not attached.
 * When the socket does not take everything the connection is detached (Python queues the
 * rest); an error detaches it too and is raised. */
static PyObject *Relay_send(Relay *self, PyObject *const *args, Py_ssize_t nargs) {
    /* METH_FASTCALL, bytes without the buffer protocol: it is every direct send's cost. */
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "send(cid, data) takes 2 arguments");
        return NULL;
    }
    long long cid = PyLong_AsLongLong(args[0]);
    if (cid == -1 && PyErr_Occurred()) return NULL;
    Py_buffer buf = {0};
    const char *data;
    Py_ssize_t len;
    if (PyBytes_CheckExact(args[1])) {
        data = PyBytes_AS_STRING(args[1]);
        len = PyBytes_GET_SIZE(args[1]);
    } else {
        if (PyObject_GetBuffer(args[1], &buf, PyBUF_SIMPLE) < 0) return NULL;
        data = buf.buf;
        len = buf.len;
    }
    pthread_mutex_lock(&self->mu);
    conn_t *c = get_conn(self, cid);
    long long result;
    int err = 0;
    if (c == NULL || !c->attached) {
        result = -2;
    } else if (c->plen || c->evicting) {
        result = -1;
    } else {
        ssize_t n = send(c->fd, data, (size_t)len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) n = 0;
            else err = errno;
        }
        if (err || n < len) {
            c->attached = 0;
            self->epoch++;
            self->invalidations++;
        }
        result = err ? 0 : n; /* counted by Python */
    }
    pthread_mutex_unlock(&self->mu);
    if (buf.obj != NULL) PyBuffer_Release(&buf);
    if (err) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromLongLong(result);
}

/* learn(cid, key, out, skip, max_frame, dests) -> bool */
static PyObject *Relay_learn(Relay *self, PyObject *args) {
    long long cid;
    Py_buffer key, out;
    Py_ssize_t skip, max_frame;
    PyObject *dests;
    if (!PyArg_ParseTuple(args, "Ly*y*nnO", &cid, &key, &out, &skip, &max_frame, &dests))
        return NULL;
    PyObject *seq = PySequence_Fast(dests, "dests must be a sequence");
    if (seq == NULL) {
        PyBuffer_Release(&key);
        PyBuffer_Release(&out);
        return NULL;
    }
    Py_ssize_t nd = PySequence_Fast_GET_SIZE(seq);
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)(nd ? nd : 1));
    int ok = ids != NULL && key.len > 0 && skip >= 0 && max_frame > 0;
    for (Py_ssize_t i = 0; ok && i < nd; i++) {
        ids[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (ids[i] == -1 && PyErr_Occurred()) ok = 0;
    }
    Py_DECREF(seq);
    if (PyErr_Occurred()) {
        free(ids);
        PyBuffer_Release(&key);
        PyBuffer_Release(&out);
        return NULL;
    }
    pthread_mutex_lock(&self->mu);
    conn_t *c = ok ? get_conn(self, cid) : NULL;
    ok = c != NULL;
    for (Py_ssize_t i = 0; ok && i < nd; i++) {
        conn_t *d = get_conn(self, ids[i]);
        ok = d != NULL && d->attached && !d->evicting && !d->slow;
    }
    if (ok) {
        if (c->epoch != self->epoch) {
            free_routes(c);
            c->epoch = self->epoch;
        }
        /* A header already learned (e.g. learned again after a miss on its frame's shape). */
        for (int i = 0; i < c->nroutes; i++) {
            if (c->routes[i].klen == (uint32_t)key.len &&
                memcmp(c->routes[i].key, key.buf, (size_t)key.len) == 0) {
                route_t *rt = &c->routes[i];
                free(rt->key);
                free(rt->out);
                free(rt->dests);
                c->routes[i] = c->routes[--c->nroutes];
                break;
            }
        }
        if (c->nroutes == MAX_ROUTES) free_routes(c);
        if (c->routes == NULL) c->routes = malloc(sizeof(route_t) * MAX_ROUTES);
        route_t *rt = c->routes ? &c->routes[c->nroutes] : NULL;
        if (rt == NULL) {
            ok = 0;
            goto done;
        }
        rt->key = malloc((size_t)key.len);
        rt->out = malloc(out.len ? (size_t)out.len : 1);
        if (rt->key == NULL || rt->out == NULL) {
            free(rt->key);
            free(rt->out);
            ok = 0;
        } else {
            memcpy(rt->key, key.buf, (size_t)key.len);
            if (out.len) memcpy(rt->out, out.buf, (size_t)out.len);
            rt->klen = (uint32_t)key.len;
            rt->olen = (uint32_t)out.len;
            rt->skip = (uint32_t)skip;
            rt->max_frame = max_frame > 0x7fffffff ? 0x7fffffff : (uint32_t)max_frame;
            rt->ndest = (int)nd;
            rt->dests = ids;
            ids = NULL;
            c->last_hit = c->nroutes;
            c->nroutes++;
        }
    }
done:
    pthread_mutex_unlock(&self->mu);
    free(ids);
    PyBuffer_Release(&key);
    PyBuffer_Release(&out);
    return PyBool_FromLong(ok);
}

static PyObject *Relay_invalidate(Relay *self, PyObject *unused) {
    pthread_mutex_lock(&self->mu);
    self->epoch++;
    self->invalidations++;
    pthread_mutex_unlock(&self->mu);
    Py_RETURN_NONE;
}

/* upcalls() -> list[(cid, kind, bytes)], in the order queued. */
static PyObject *Relay_upcalls(Relay *self, PyObject *unused) {
    uint64_t v;
    ssize_t rd = read(self->efd, &v, sizeof v);
    (void)rd;
    pthread_mutex_lock(&self->mu);
    up_t *u = self->up_head;
    self->up_head = self->up_tail = NULL;
    size_t n = self->up_count;
    self->up_count = 0;
    self->signalled = 0;
    pthread_mutex_unlock(&self->mu);
    PyObject *list = PyList_New((Py_ssize_t)n);
    size_t i = 0;
    while (u) {
        up_t *next = u->next;
        if (list != NULL) {
            PyObject *t = Py_BuildValue("(Liy#)", (long long)u->cid, u->kind, (const char *)u->data,
                                        (Py_ssize_t)u->len);
            if (t == NULL) {
                Py_CLEAR(list);
            } else {
                PyList_SET_ITEM(list, (Py_ssize_t)i, t);
            }
        }
        i++;
        free(u);
        u = next;
    }
    return list;
}

/* collect() -> (list[(cid, bytes_in, frames, delivered, bytes_out, writes, drops,
 * last_ns)], now_ns): what the thread did since the last call, per connection touched. */
static PyObject *Relay_collect(Relay *self, PyObject *unused) {
    PyObject *list = PyList_New(0);
    if (list == NULL) return NULL;
    pthread_mutex_lock(&self->mu);
    for (size_t i = 0; i < self->nconns; i++) {
        conn_t *c = self->conns[i];
        if (c == NULL || !c->touched) continue;
        PyObject *t = Py_BuildValue("(LKKKKKKL)", (long long)make_cid((uint32_t)i, c->gen),
                                    (unsigned long long)c->bytes_in, (unsigned long long)c->frames,
                                    (unsigned long long)c->delivered,
                                    (unsigned long long)c->bytes_out,
                                    (unsigned long long)c->writes, (unsigned long long)c->drops,
                                    (long long)c->last_ns);
        if (t == NULL || PyList_Append(list, t) < 0) {
            Py_XDECREF(t);
            Py_DECREF(list);
            pthread_mutex_unlock(&self->mu);
            return NULL;
        }
        Py_DECREF(t);
        c->bytes_in = c->frames = c->delivered = c->bytes_out = c->writes = c->drops = 0;
        c->touched = 0;
    }
    pthread_mutex_unlock(&self->mu);
    PyObject *out = Py_BuildValue("(NL)", list, (long long)now_ns());
    return out;
}

/* info() -> dict: counters for tests and profiles. */
static PyObject *Relay_info(Relay *self, PyObject *unused) {
    pthread_mutex_lock(&self->mu);
    size_t live = 0, reading = 0, attached = 0, routes = 0;
    for (size_t i = 0; i < self->nconns; i++) {
        conn_t *c = self->conns[i];
        if (c == NULL) continue;
        live++;
        reading += c->reading;
        attached += c->attached;
        if (c->epoch == self->epoch) routes += (size_t)c->nroutes;
    }
    PyObject *d = Py_BuildValue("{s:K,s:K,s:K,s:n,s:n,s:n,s:n,s:n}", "rounds",
                                (unsigned long long)self->rounds, "upcalls",
                                (unsigned long long)self->upcalls, "invalidations",
                                (unsigned long long)self->invalidations, "connections",
                                (Py_ssize_t)live, "reading", (Py_ssize_t)reading, "attached",
                                (Py_ssize_t)attached, "routes", (Py_ssize_t)routes, "queued",
                                (Py_ssize_t)self->up_count);
    pthread_mutex_unlock(&self->mu);
    return d;
}

static PyMethodDef Relay_methods[] = {
    {"start", (PyCFunction)Relay_start, METH_NOARGS, "Start the relay thread."},
    {"stop", (PyCFunction)Relay_stop, METH_NOARGS, "Stop the relay thread and wait for it."},
    {"fileno", (PyCFunction)Relay_fileno, METH_NOARGS, "The fd readable when upcalls wait."},
    {"open", (PyCFunction)Relay_open, METH_VARARGS, "open(fd, kind, max_pending, drop, max_hold) -> cid"},
    {"read", (PyCFunction)Relay_read, METH_VARARGS, "read(cid, raw, held=b''): read it."},
    {"unread", (PyCFunction)Relay_unread, METH_VARARGS, "unread(cid) -> held bytes."},
    {"attach", (PyCFunction)Relay_attach, METH_VARARGS, "attach(cid) -> bool"},
    {"take", (PyCFunction)Relay_take, METH_VARARGS, "take(cid) -> pending bytes (detaches)."},
    {"close", (PyCFunction)Relay_close, METH_VARARGS, "close(cid) -> pending bytes."},
    {"send", (PyCFunction)(void (*)(void))Relay_send, METH_FASTCALL, "send(cid, data) -> int"},
    {"learn", (PyCFunction)Relay_learn, METH_VARARGS,
     "learn(cid, key, out, skip, max_frame, dests) -> bool"},
    {"invalidate", (PyCFunction)Relay_invalidate, METH_NOARGS, "Forget every learned route."},
    {"upcalls", (PyCFunction)Relay_upcalls, METH_NOARGS, "upcalls() -> [(cid, kind, data)]"},
    {"collect", (PyCFunction)Relay_collect, METH_NOARGS, "collect() -> (per-connection, now)"},
    {"info", (PyCFunction)Relay_info, METH_NOARGS, "info() -> dict"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RelayType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gossiprouter._relay.Relay",
    .tp_basicsize = sizeof(Relay),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The compiled fast path: a relay thread (see the module's source).",
    .tp_new = Relay_new,
    .tp_init = (initproc)Relay_init,
    .tp_dealloc = (destructor)Relay_dealloc,
    .tp_methods = Relay_methods,
};

static struct PyModuleDef relaymodule = {
    PyModuleDef_HEAD_INIT, "gossiprouter._relay",
    "The optional compiled fast path of gossiprouter (docs/performance.md, Light load).", -1,
    NULL,
};

PyMODINIT_FUNC PyInit__relay(void) {
    if (PyType_Ready(&RelayType) < 0) return NULL;
    PyObject *m = PyModule_Create(&relaymodule);
    if (m == NULL) return NULL;
    Py_INCREF(&RelayType);
    if (PyModule_AddObject(m, "Relay", (PyObject *)&RelayType) < 0) {
        Py_DECREF(&RelayType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "NATIVE", NATIVE);
    PyModule_AddIntConstant(m, "JG2", JG2);
    PyModule_AddIntConstant(m, "JG5", JG5);
    PyModule_AddIntConstant(m, "DATA", UP_DATA);
    PyModule_AddIntConstant(m, "EOF", UP_EOF);
    PyModule_AddIntConstant(m, "ERROR", UP_ERROR);
    PyModule_AddIntConstant(m, "EVICT", UP_EVICT);
    PyModule_AddIntConstant(m, "SLOW", UP_SLOW);
    PyModule_AddIntConstant(m, "MAX_HOLD", MAX_HOLD);
    return m;
}
