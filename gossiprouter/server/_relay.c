/*
 * gossiprouter.server._relay: the optional compiled fast path (issue 16, docs/performance.md).
 *
 * A Relay is one OS thread that owns an epoll and relays, without the GIL, the routed frames
 * of connections whose routing decision Python has already made once. It is the pure-Python
 * dispatcher (gossiprouter/server/dispatch.py) with the wait, the read, the frame cutting and the
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
 *     ``send`` only, under one mutex, so the bytes of two frames never interleave. The thread
 *     copies nothing per receiver: what one read routes to a receiver is staged as pointers
 *     into the read buffer (a frame sent re-wrapped, JG2, is written once per read into a wrap
 *     area shared by its receivers) and written with one send per receiver when the read is
 *     done, so one frame routed to many receivers is in memory once, as Python's one shared
 *     bytes object is. Only what a socket does not take is copied (the
 *     pending bytes) and the connection is *evicted*: the thread writes nothing more to it,
 *     queues an EVICT upcall, and Python takes the pending bytes (``take``) into its own
 *     outbox, whose writer task, bounds and slow-consumer policy carry on as without the
 *     relay; a frame for an evicted receiver is not relayed here but goes to Python with the
 *     rest of its read. Python's own ``send`` to a connection that the socket does not fully
 *     take detaches it at once (Python queues the rest).
 *   - Decisions. ``learn(cid, key, out, skip, max_frame, dests)``: frames from ``cid`` that
 *     start with ``key`` go, as ``out`` followed by the frame's bytes from ``skip`` on, to the
 *     ``dests`` (connection ids, every one attached). Every decision depends on one group of
 *     the routing table, whose slot (a hash of its name, GROUP_SLOTS of them) is learned with
 *     it: ``invalidate(slot)`` forgets the decisions of that slot (Python calls it before
 *     every change of the group), ``invalidate()`` every decision. A decision is never used
 *     after the change that made it stale, because both take the mutex. Detaching or closing
 *     a receiver forgets nothing: a frame for a receiver not attached goes to Python.
 *
 * Nothing here calls into Python from the thread. Every resource is bounded: the learned
 * routes per connection (MAX_ROUTES); a partial frame held across reads (``max_hold`` per
 * connection); and router-wide, what the thread holds between reads, partial frames and pending
 * bytes together (``max_bytes``): a frame whose copies could take it over that goes to Python,
 * which holds it under its own bounds. Reads go to one buffer of the thread's (a connection
 * that holds no partial frame has no buffer at all), and a partial frame is kept in a buffer
 * of its exact size, freed when the frame is complete: an idle connection costs the thread its
 * conn_t only.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
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
#define UP_LOST 4  /* an upcall for it could not be queued (no memory): close it */

#define MAX_ROUTES 64
#define MAX_HOLD (256 * 1024)
#define RECV_SIZE (64 * 1024)
#define MAX_BYTES_DEFAULT (64 * 1024 * 1024)
/* Pointers one receiver's send may carry (Linux's IOV_MAX); more are sent at once. */
#define STAGE_MAX_IOV 1024
#define STAGE_INLINE 2 /* a frame is at most two pointers: room for one after any flush */
/* A stage array this long is freed after the read that grew it (a fan-out to thousands). */
#define STAGE_KEEP 1024
#define WRAP_CHUNK (64 * 1024)
#define MAX_EVENTS 256
#define IDX_BITS 20
#define IDX_MASK ((1u << IDX_BITS) - 1)
#define GEN_BITS 30
#define CID_LIMIT ((int64_t)1 << (IDX_BITS + GEN_BITS)) /* every cid is below */
#define GROUP_SLOTS 4096 /* invalidation slots (a power of two) */

typedef struct {
    uint8_t *key;
    uint32_t klen;
    uint8_t *out;
    uint32_t olen;
    uint32_t skip;
    uint32_t max_frame;
    int ndest;
    int64_t *dests;
    uint32_t slot; /* the group's invalidation slot */
    uint64_t gen;  /* its generation when learned */
} route_t;

typedef struct conn_s {
    int active;
    int fd;
    uint32_t gen;
    int kind;      /* NATIVE / JG2 / 0 (passthrough) */
    int reading;   /* registered in the epoll */
    int raw;       /* the next chunk goes up unparsed (Python holds a partial frame) */
    int attached;  /* the thread and send() may write to it */
    int evicting;  /* pending bytes await take(): no direct writes */
    size_t stage;  /* 1 + its index in Relay.dirty while it has frames staged, else 0 */
    size_t max_hold; /* the largest frame held across reads (<= MAX_HOLD) */
    uint8_t *hold;   /* the start of a frame cut by a read (exactly hlen bytes between reads) */
    size_t hlen, hcap;
    uint8_t *pend;   /* what its socket did not take (evicting), for take() */
    size_t plen;
    uint64_t ginv;   /* Relay.ginv when its routes were last pruned */
    route_t *routes; /* up to MAX_ROUTES, grown by learn (none until the first) */
    int nroutes, caproutes;
    int last_hit;
    uint64_t epoch;
    /* since the last collect() */
    uint64_t bytes_in, frames, delivered, bytes_out, writes;
    int64_t last_ns;
    int touched;
    int lost;                /* 1: on the relay's lost list; 2: reported (Python closes it) */
    int64_t cid;
    struct conn_s *lost_next;
    int mark;                /* learn(): seen among the dests */
} conn_t;

/* What one read routes to one receiver: pointers into the read buffer and the learned output
 * headers, sent with one sendmsg when the read is done. */
typedef struct {
    int64_t cid;
    int niov, cap;
    struct iovec *heap; /* NULL: the inline array */
    size_t bytes;
    struct iovec inl[STAGE_INLINE];
} stage_t;

/* Frames sent re-wrapped, written once per read for all their receivers (wrap_alloc). */
typedef struct wrap_s {
    struct wrap_s *next;
    size_t cap, len;
    uint8_t data[];
} wrap_t;

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
    pthread_mutex_t turn; /* the turnstile of Python's callers (py_lock) */
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
    stage_t *dirty; /* the receivers with frames staged by the read being relayed */
    size_t ndirty, capdirty;
    uint8_t *scratch; /* RECV_SIZE: every read of a connection that holds no partial frame */
    wrap_t *wrap;     /* the read's re-wrapped frames, newest chunk first */
    /* What the thread holds between reads (partial frames, pending bytes), what the read being
     * relayed has staged (each byte may become pending), and the bound on their sum. */
    size_t held_partial, held_pending, staged, max_bytes;
    /* totals since the last collect() */
    uint64_t rounds, upcalls, invalidations;
    /* for info(): frames sent to Python because of max_bytes; receivers closed because their
     * pending bytes could not be allocated */
    uint64_t over_cap, broken;
    uint64_t ggen[GROUP_SLOTS]; /* per group slot: bumped by invalidate(slot) */
    uint64_t ginv; /* bumped by every invalidate(): a connection's reads prune its table once */
    /* Python callers waiting for the mutex: the thread hands it over between connections
     * (its hold is one connection's read and sends, not a whole round). */
    atomic_int py_waiting;
    conn_t *lost_head; /* connections whose upcall could not be queued */
    uint64_t lost;     /* how many, in all */
    uint64_t handoffs; /* times the thread gave the mutex to a waiting Python call */
    int fail_upcalls;  /* tests: this many upcalls fail as if out of memory */
} Relay;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int64_t make_cid(uint32_t idx, uint32_t gen) { return ((int64_t)gen << IDX_BITS) | idx; }

static conn_t *get_conn(Relay *r, int64_t cid) {
    if (cid < 0 || cid >= CID_LIMIT) return NULL;
    size_t idx = (size_t)(cid & IDX_MASK);
    if (idx >= r->nconns) return NULL;
    conn_t *c = r->conns[idx];
    if (c == NULL || !c->active || c->gen != (uint32_t)(cid >> IDX_BITS)) return NULL;
    return c;
}

/* A route is used only while no change of its group (or of everything) came after it. */
static int route_valid(Relay *r, const route_t *rt) { return rt->gen == r->ggen[rt->slot]; }

/* Every Python caller takes the mutex through here: it says it waits (py_waiting) and holds
 * the turnstile until it has the mutex, so that the thread, which hands the mutex over between
 * connections, sleeps on the turnstile until then instead of taking the mutex straight back
 * (lock order: turn, then mu, on both sides). */
static void py_lock(Relay *r) {
    atomic_fetch_add_explicit(&r->py_waiting, 1, memory_order_relaxed);
    pthread_mutex_lock(&r->turn);
    pthread_mutex_lock(&r->mu);
    pthread_mutex_unlock(&r->turn);
    atomic_fetch_sub_explicit(&r->py_waiting, 1, memory_order_relaxed);
}

/* A cid from Python: ValueError when it cannot be one (negative, or beyond the id space,
 * which would alias a live connection's index and generation). */
static int check_cid(long long cid) {
    if (cid < 0 || cid >= CID_LIMIT) {
        PyErr_Format(PyExc_ValueError, "relay connection id %lld out of range", cid);
        return -1;
    }
    return 0;
}

static void free_route(route_t *rt) {
    free(rt->key);
    free(rt->out);
    free(rt->dests);
}

static void free_routes(conn_t *c) {
    for (int i = 0; i < c->nroutes; i++) free_route(&c->routes[i]);
    c->nroutes = 0;
    c->last_hit = 0;
    free(c->routes); /* an idle connection keeps no table (learn allocates one again) */
    c->routes = NULL;
    c->caproutes = 0;
}

/* Room for one more route (most connections learn one or two): c->routes NULL if none. */
static void routes_room(conn_t *c) {
    if (c->nroutes < c->caproutes) return;
    int cap = c->caproutes ? c->caproutes * 4 : 2;
    if (cap > MAX_ROUTES) cap = MAX_ROUTES;
    route_t *p = realloc(c->routes, sizeof(route_t) * (size_t)cap);
    if (p == NULL) {
        free_routes(c);
        return;
    }
    c->routes = p;
    c->caproutes = cap;
}

static void signal_python(Relay *r) {
    if (!r->signalled) {
        uint64_t one = 1;
        ssize_t w = write(r->efd, &one, sizeof one);
        (void)w;
        r->signalled = 1;
    }
}

static void stop_reading(Relay *r, conn_t *c);

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
    signal_python(r);
}

/* Queue an upcall (mutex held); on allocation failure the connection is lost (above). */
static void upcall(Relay *r, int64_t cid, int kind, const uint8_t *data, size_t len) {
    conn_t *c = get_conn(r, cid);
    if (c != NULL && c->lost) return; /* Python closes it: nothing more about it matters */
    up_t *u = NULL;
    if (r->fail_upcalls > 0) r->fail_upcalls--;
    else u = malloc(sizeof(up_t) + len);
    if (u == NULL) {
        if (c != NULL) lose(r, c);
        return;
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
 * in the read buffer), staged until the read is done (flush_dirty). Nothing is copied unless
 * ``d`` is evicted while this read is relayed (then its socket did not take an earlier send:
 * the frame waits behind it, pending). */
static void deliver(Relay *r, conn_t *d, int64_t cid, const uint8_t *a, size_t alen,
                    const uint8_t *b, size_t blen) {
    struct iovec frame[2] = {{(void *)a, alen}, {(void *)b, blen}};
    d->delivered++;
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

/* Drop the routes a change of their group made stale (the last one moves into their place). */
static void prune(Relay *r, conn_t *c) {
    for (int i = 0; i < c->nroutes;) {
        if (route_valid(r, &c->routes[i])) {
            i++;
            continue;
        }
        free_route(&c->routes[i]);
        c->routes[i] = c->routes[--c->nroutes];
    }
    c->last_hit = 0;
    if (c->nroutes == 0) free_routes(c); /* and its table: an idle connection keeps none */
}

static route_t *match(Relay *r, conn_t *c, const uint8_t *p, size_t avail) {
    int n = c->nroutes;
    if (n == 0) return NULL;
    int start = c->last_hit < n ? c->last_hit : 0;
    for (int k = 0; k < n; k++) {
        int i = (start + k) % n;
        route_t *rt = &c->routes[i];
        if (rt->klen <= avail && memcmp(p, rt->key, rt->klen) == 0) {
            if (!route_valid(r, rt)) { /* its group changed: Python decides again */
                prune(r, c);
                return NULL;
            }
            c->last_hit = i;
            return rt;
        }
    }
    return NULL;
}

/* ``p`` (``avail`` bytes) is the start of a learned header, cut by the end of the chunk. */
static int starts_route(Relay *r, conn_t *c, const uint8_t *p, size_t avail) {
    for (int i = 0; i < c->nroutes; i++)
        if (avail < c->routes[i].klen && route_valid(r, &c->routes[i]) &&
            memcmp(p, c->routes[i].key, avail) == 0)
            return 1;
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
static ssize_t frame_len(Relay *r, conn_t *c, route_t **rtp, const uint8_t *p, size_t avail) {
    if (c->kind == NATIVE || c->kind == JG5) { /* a u32 length, then the learned header */
        if (avail < 4) return 0;
        uint32_t n = be32(p);
        if (n >= 0x80000000u) return -1; /* 5.x: the close marker, or an error: Python's */
        route_t *rt = match(r, c, p + 4, avail - 4);
        if (rt == NULL) {
            /* Cut before the end of its header: wait if a learned header may follow. A frame
             * already whole (shorter than the header) is not one: Python's, now. */
            if (avail < 4 + (size_t)n && 4 + (size_t)n <= c->max_hold &&
                starts_route(r, c, p + 4, avail - 4))
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
        route_t *rt = match(r, c, p, avail);
        if (rt == NULL) return starts_route(r, c, p, avail) ? 0 : -1;
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

/* What the thread holds between reads: counted router-wide (collect(), the gauges). */
static void set_hold(Relay *r, conn_t *c, uint8_t *buf, size_t len, size_t cap) {
    r->held_partial = r->held_partial - c->hlen + len;
    c->hold = buf;
    c->hlen = len;
    c->hcap = cap;
}

static void drop_hold(Relay *r, conn_t *c) {
    free(c->hold);
    set_hold(r, c, NULL, 0, 0);
}

/* Keep ``buf[pos:len]``, the start of a frame, for the next read, in a buffer of its size:
 * 0, or -1 (no memory, or over max_bytes: Python takes it). */
static int keep_rest(Relay *r, conn_t *c, const uint8_t *buf, size_t pos, size_t len) {
    size_t rest = len - pos;
    if (r->held_partial + r->held_pending - c->hlen + rest > r->max_bytes) {
        r->over_cap++;
        return -1;
    }
    if (buf == c->hold) {
        if (pos) memmove(c->hold, c->hold + pos, rest);
        uint8_t *p = realloc(c->hold, rest);
        if (p != NULL) c->hold = p;
        set_hold(r, c, c->hold, rest, p != NULL ? rest : c->hcap);
        return 0;
    }
    uint8_t *p = malloc(rest);
    if (p == NULL) return -1;
    memcpy(p, buf + pos, rest);
    free(c->hold);
    set_hold(r, c, p, rest, rest);
    return 0;
}

/* Relay the frames of ``buf`` (``len`` bytes read from ``c``: its held partial frame, if any,
 * and what was just received). */
static void relay_frames(Relay *r, conn_t *c, int64_t cid, const uint8_t *buf, size_t len) {
    size_t pos = 0;
    int up = 0;
    if (c->epoch != r->epoch) {
        free_routes(c);
        c->epoch = r->epoch;
    } else if (c->ginv != r->ginv && c->nroutes) {
        prune(r, c); /* a group changed: its routes (and an emptied table) go now */
    }
    c->ginv = r->ginv;
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
            if (held + fan > r->max_bytes) {
                r->over_cap++;
                up = 1;
                break;
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
            for (int i = 0; i < rt->ndest; i++)
                deliver(r, get_conn(r, rt->dests[i]), rt->dests[i], head, hlen, tail, tlen);
            c->frames++;
            c->bytes_in += (uint64_t)flen; /* what goes up is counted by Python */
            pos += (size_t)flen;
        }
    }
    /* What this read routed goes out before anything it points into changes. */
    flush_dirty(r);
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
            /* A Python call waits for the mutex, holding the GIL: it goes first, so the hold is
             * one connection's read and sends at most, not a round's (up to MAX_EVENTS
             * connections). The thread sleeps on the turnstile, which the caller holds until
             * it has the mutex: a plain unlock and lock would mostly take the mutex back
             * before the caller wakes up. */
            if (atomic_load_explicit(&r->py_waiting, memory_order_relaxed)) {
                r->handoffs++;
                pthread_mutex_unlock(&r->mu);
                pthread_mutex_lock(&r->turn);
                pthread_mutex_lock(&r->mu);
                pthread_mutex_unlock(&r->turn);
                if (r->stopping) break;
            }
        }
        pthread_mutex_unlock(&r->mu);
    }
    return NULL;
}

/* ------------------------------------------------------------------ the Python type */

/* Relay(max_bytes=MAX_BYTES_DEFAULT): ``max_bytes`` bounds what the thread holds between reads,
 * router-wide (see the top of this file). */
static int Relay_init(Relay *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"max_bytes", NULL};
    Py_ssize_t max_bytes = MAX_BYTES_DEFAULT;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|n", kwlist, &max_bytes)) return -1;
    if (max_bytes < 0) {
        PyErr_SetString(PyExc_ValueError, "max_bytes must not be negative");
        return -1;
    }
    if (self->scratch == NULL) self->scratch = malloc(RECV_SIZE);
    if (self->scratch == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->max_bytes = (size_t)max_bytes;
    if (pthread_mutex_init(&self->mu, NULL) != 0 || pthread_mutex_init(&self->turn, NULL) != 0) {
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
    py_lock(self);
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
    free_routes(c); /* and its table */
    free(c->hold);
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
    free(self->scratch);
    while (self->wrap != NULL) {
        wrap_t *next = self->wrap->next;
        free(self->wrap);
        self->wrap = next;
    }
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
    pthread_mutex_destroy(&self->turn);
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

/* open(fd, kind, max_hold=MAX_HOLD) -> cid: a connection the relay may later read / write.
 * ``max_hold``: the largest frame the thread holds across reads (a larger one cut by a read
 * goes to Python, which charges it to its router-wide budget for partial frames: the thread's
 * holds must stay within what Python admits without it). */
static PyObject *Relay_open(Relay *self, PyObject *args) {
    int fd, kind;
    Py_ssize_t max_hold = MAX_HOLD;
    if (!PyArg_ParseTuple(args, "ii|n", &fd, &kind, &max_hold)) return NULL;
    if (fd < 0 || max_hold < 0 || max_hold > MAX_HOLD) {
        PyErr_Format(PyExc_ValueError,
                     "open(fd=%d, max_hold=%zd): fd must not be negative, max_hold is 0..%d",
                     fd, max_hold, MAX_HOLD);
        return NULL;
    }
    if (kind != 0 && kind != NATIVE && kind != JG2 && kind != JG5) {
        PyErr_SetString(PyExc_ValueError, "unknown framing");
        return NULL;
    }
    conn_t *c = calloc(1, sizeof(conn_t));
    if (c == NULL) return PyErr_NoMemory();
    py_lock(self);
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
    c->gen = self->next_gen++ & ((1u << GEN_BITS) - 1);
    if (c->gen == 0) c->gen = self->next_gen++;
    c->kind = kind;
    c->max_hold = (size_t)max_hold;
    c->epoch = self->epoch;
    self->conns[idx] = c;
    int64_t cid = make_cid((uint32_t)idx, c->gen);
    c->cid = cid;
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
    if (check_cid(cid) < 0) {
        PyBuffer_Release(&held);
        return NULL;
    }
    py_lock(self);
    conn_t *c = get_conn(self, cid);
    int ok = 0;
    const char *bad = NULL;
    if (c != NULL && c->lost) {
        /* Python closes it (UP_LOST is queued): it is not read again. */
        pthread_mutex_unlock(&self->mu);
        PyBuffer_Release(&held);
        Py_RETURN_NONE;
    }
    if (c != NULL && held.len > 0) {
        /* The start of a frame Python cut and hands back: the next bytes continue it. Only
         * while nothing is held here (after an upcall), and within what is held. The bytes
         * move from Python's count to the thread's (Python asks room() first). */
        uint8_t *p = NULL;
        if (c->hlen) {
            bad = "read(held): the thread still holds bytes of this connection";
        } else if ((size_t)held.len > c->max_hold) {
            bad = "read(held): more than the connection's max_hold";
        } else if ((p = malloc((size_t)held.len)) == NULL) {
            ok = ENOMEM;
        } else {
            memcpy(p, held.buf, (size_t)held.len);
            set_hold(self, c, p, (size_t)held.len, (size_t)held.len);
            raw = 0;
        }
    }
    if (c != NULL && !ok && bad == NULL) {
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
    if (bad != NULL) {
        PyErr_SetString(PyExc_ValueError, bad);
        return NULL;
    }
    if (ok == ENOMEM) return PyErr_NoMemory();
    if (ok) {
        errno = ok;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

/* The methods taking one connection id: parse it and take the mutex (-1: a parse error,
 * raised, and no mutex taken); *c is the connection or NULL (unknown or closed). */
static int lock_conn(Relay *self, PyObject *args, conn_t **c, long long *cid) {
    if (!PyArg_ParseTuple(args, "L", cid) || check_cid(*cid) < 0) return -1;
    py_lock(self);
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
        out = PyBytes_FromStringAndSize((const char *)c->hold, (Py_ssize_t)c->hlen);
        drop_hold(self, c);
    }
    pthread_mutex_unlock(&self->mu);
    return out;
}

/* attach(cid) -> bool: the thread may write to the connection (its queue is empty). */
static PyObject *Relay_attach(Relay *self, PyObject *args) {
    long long cid;
    conn_t *c;
    if (lock_conn(self, args, &c, &cid) < 0) return NULL;
    int ok = c != NULL && !c->lost;
    if (ok) {
        c->attached = 1;
        c->evicting = 0;
    }
    pthread_mutex_unlock(&self->mu);
    return PyBool_FromLong(ok);
}

static PyObject *take_pending_locked(Relay *self, conn_t *c) {
    PyObject *out = PyBytes_FromStringAndSize((const char *)c->pend, (Py_ssize_t)c->plen);
    self->held_pending -= c->plen;
    free(c->pend);
    c->pend = NULL;
    c->plen = 0;
    c->attached = 0; /* routes to it stay: their frames go to Python while it is detached */
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
        drop_hold(self, c);
        size_t idx = (size_t)(cid & IDX_MASK);
        if (c->lost == 1) { /* not reported yet: off the lost list */
            conn_t **pp = &self->lost_head;
            while (*pp != c) pp = &(*pp)->lost_next;
            *pp = c->lost_next;
        }
        self->conns[idx] = NULL;
        self->free_idx[self->nfree++] = (int64_t)idx;
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
    if ((cid == -1 && PyErr_Occurred()) || check_cid(cid) < 0) return NULL;
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
    py_lock(self);
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
        if (err || n < len) c->attached = 0; /* Python queues the rest: it writes now */
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

/* learn(cid, key, out, skip, max_frame, dests, slot=0) -> bool: False when it cannot be
 * repeated now (a connection unknown, or a receiver not attached); ValueError for arguments
 * no caller may pass (they would make the thread read or write out of bounds). */
static PyObject *Relay_learn(Relay *self, PyObject *args) {
    long long cid, slot = 0;
    Py_buffer key, out;
    Py_ssize_t skip, max_frame;
    PyObject *dests;
    if (!PyArg_ParseTuple(args, "Ly*y*nnO|L", &cid, &key, &out, &skip, &max_frame, &dests,
                          &slot))
        return NULL;
    int64_t *ids = NULL;
    PyObject *seq = NULL;
    const char *bad = NULL;
    if (check_cid(cid) < 0) goto fail;
    if (key.len < 1 || key.len > MAX_HOLD) bad = "learn: key must be 1 to MAX_HOLD bytes";
    else if (out.len > MAX_HOLD) bad = "learn: out must be at most MAX_HOLD bytes";
    else if (skip < 0 || skip > key.len) bad = "learn: skip must be 0 to len(key)";
    else if (max_frame < 1) bad = "learn: max_frame must be positive";
    else if (slot < 0 || slot >= GROUP_SLOTS) bad = "learn: slot must be 0 to GROUP_SLOTS - 1";
    if (bad != NULL) {
        PyErr_SetString(PyExc_ValueError, bad);
        goto fail;
    }
    seq = PySequence_Fast(dests, "dests must be a sequence");
    if (seq == NULL) goto fail;
    Py_ssize_t nd = PySequence_Fast_GET_SIZE(seq);
    if (nd > (Py_ssize_t)IDX_MASK + 1) {
        PyErr_SetString(PyExc_ValueError, "learn: more dests than connections");
        goto fail;
    }
    ids = malloc(sizeof(int64_t) * (size_t)(nd ? nd : 1));
    if (ids == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < nd; i++) {
        long long d = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if ((d == -1 && PyErr_Occurred()) || check_cid(d) < 0) goto fail;
        ids[i] = d;
    }
    Py_CLEAR(seq);
    py_lock(self);
    conn_t *c = get_conn(self, cid);
    int ok = c != NULL && !c->lost;
    int dup = 0;
    Py_ssize_t marked = 0;
    for (; ok && marked < nd; marked++) {
        conn_t *d = get_conn(self, ids[marked]);
        ok = d != NULL && d->attached && !d->evicting;
        if (ok && d->mark) { /* one frame would go twice to one socket */
            dup = 1;
            ok = 0;
        }
        if (ok) d->mark = 1;
    }
    for (Py_ssize_t i = 0; i < marked; i++) {
        conn_t *d = get_conn(self, ids[i]);
        if (d != NULL) d->mark = 0;
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
                free_route(&c->routes[i]);
                c->routes[i] = c->routes[--c->nroutes];
                break;
            }
        }
        if (c->nroutes == MAX_ROUTES) prune(self, c);
        if (c->nroutes == MAX_ROUTES) free_routes(c);
        routes_room(c);
        route_t *rt = c->routes ? &c->routes[c->nroutes] : NULL;
        if (rt != NULL) {
            rt->key = malloc((size_t)key.len);
            rt->out = malloc(out.len ? (size_t)out.len : 1);
        }
        if (rt == NULL || rt->key == NULL || rt->out == NULL) {
            if (rt != NULL) {
                free(rt->key);
                free(rt->out);
            }
            ok = 0; /* not learned: Python routes these frames */
        } else {
            memcpy(rt->key, key.buf, (size_t)key.len);
            if (out.len) memcpy(rt->out, out.buf, (size_t)out.len);
            rt->klen = (uint32_t)key.len;
            rt->olen = (uint32_t)out.len;
            rt->skip = (uint32_t)skip;
            rt->max_frame = max_frame > 0x7fffffff ? 0x7fffffff : (uint32_t)max_frame;
            rt->ndest = (int)nd;
            rt->dests = ids;
            rt->slot = (uint32_t)slot;
            rt->gen = self->ggen[slot];
            ids = NULL;
            c->last_hit = c->nroutes;
            c->nroutes++;
        }
    }
    pthread_mutex_unlock(&self->mu);
    free(ids);
    PyBuffer_Release(&key);
    PyBuffer_Release(&out);
    if (dup) {
        PyErr_SetString(PyExc_ValueError, "learn: a connection is twice among the dests");
        return NULL;
    }
    return PyBool_FromLong(ok);
fail:
    Py_XDECREF(seq);
    free(ids);
    PyBuffer_Release(&key);
    PyBuffer_Release(&out);
    return NULL;
}

/* invalidate(slot=-1): forget the decisions learned for a group slot (-1: every decision). */
static PyObject *Relay_invalidate(Relay *self, PyObject *const *args, Py_ssize_t nargs) {
    long long slot = -1;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "invalidate(slot=-1) takes at most 1 argument");
        return NULL;
    }
    if (nargs == 1) {
        slot = PyLong_AsLongLong(args[0]);
        if (slot == -1 && PyErr_Occurred()) return NULL;
        if (slot < -1 || slot >= GROUP_SLOTS) {
            PyErr_Format(PyExc_ValueError, "invalidate: slot %lld is not -1 or 0 to %d", slot,
                         GROUP_SLOTS - 1);
            return NULL;
        }
    }
    py_lock(self);
    if (slot < 0) self->epoch++;
    else self->ggen[slot]++;
    self->ginv++;
    self->invalidations++;
    pthread_mutex_unlock(&self->mu);
    Py_RETURN_NONE;
}

/* Put the upcalls ``u`` (a chain, not yet handed to Python) back in front of the queue. */
static void requeue(Relay *self, up_t *u) {
    if (u == NULL) return;
    size_t n = 1;
    up_t *last = u;
    while (last->next) {
        last = last->next;
        n++;
    }
    py_lock(self);
    last->next = self->up_head;
    self->up_head = u;
    if (self->up_tail == NULL) self->up_tail = last;
    self->up_count += n;
    signal_python(self);
    pthread_mutex_unlock(&self->mu);
}

/* upcalls() -> list[(cid, kind, bytes)], in the order queued, then (cid, LOST, b"") for each
 * connection an upcall could not be queued for. What cannot be handed over for lack of memory
 * stays queued (and signalled) for the next call; MemoryError only when nothing could be. */
static PyObject *Relay_upcalls(Relay *self, PyObject *unused) {
    uint64_t v;
    ssize_t rd = read(self->efd, &v, sizeof v);
    (void)rd;
    PyObject *list = PyList_New(0);
    if (list == NULL) return NULL; /* nothing taken: all of it stays queued */
    py_lock(self);
    up_t *u = self->up_head;
    self->up_head = self->up_tail = NULL;
    self->up_count = 0;
    self->signalled = 0;
    pthread_mutex_unlock(&self->mu);
    while (u) {
        PyObject *t = Py_BuildValue("(Liy#)", (long long)u->cid, u->kind, (const char *)u->data,
                                    (Py_ssize_t)u->len);
        if (t == NULL || PyList_Append(list, t) < 0) {
            Py_XDECREF(t);
            break;
        }
        Py_DECREF(t);
        up_t *next = u->next;
        free(u);
        u = next;
    }
    if (u != NULL) { /* out of memory: the rest (and any lost connection) next time */
        requeue(self, u);
        if (PyList_GET_SIZE(list) == 0) {
            Py_DECREF(list);
            return PyErr_NoMemory();
        }
        PyErr_Clear();
        return list;
    }
    py_lock(self);
    while (self->lost_head != NULL) {
        conn_t *c = self->lost_head;
        PyObject *t = Py_BuildValue("(Liy#)", (long long)c->cid, UP_LOST, "", (Py_ssize_t)0);
        if (t == NULL || PyList_Append(list, t) < 0) {
            Py_XDECREF(t);
            PyErr_Clear();
            signal_python(self); /* reported at the next call */
            break;
        }
        Py_DECREF(t);
        self->lost_head = c->lost_next;
        c->lost_next = NULL;
        c->lost = 2; /* reported: Python closes it */
    }
    pthread_mutex_unlock(&self->mu);
    return list;
}

/* collect() -> (list[(cid, bytes_in, frames, delivered, bytes_out, writes, last_ns)], now_ns,
 * held_partial, held_pending): what the thread did since the last call, per connection
 * touched, and the bytes it holds now (partial frames, what sockets did not take). */
static PyObject *Relay_collect(Relay *self, PyObject *unused) {
    PyObject *list = PyList_New(0);
    if (list == NULL) return NULL;
    py_lock(self);
    for (size_t i = 0; i < self->nconns; i++) {
        conn_t *c = self->conns[i];
        if (c == NULL || !c->touched) continue;
        PyObject *t = Py_BuildValue("(LKKKKKL)", (long long)make_cid((uint32_t)i, c->gen),
                                    (unsigned long long)c->bytes_in, (unsigned long long)c->frames,
                                    (unsigned long long)c->delivered,
                                    (unsigned long long)c->bytes_out,
                                    (unsigned long long)c->writes, (long long)c->last_ns);
        if (t == NULL || PyList_Append(list, t) < 0) {
            Py_XDECREF(t);
            Py_DECREF(list);
            pthread_mutex_unlock(&self->mu);
            return NULL;
        }
        Py_DECREF(t);
        c->bytes_in = c->frames = c->delivered = c->bytes_out = c->writes = 0;
        c->touched = 0;
    }
    size_t partial = self->held_partial, pending = self->held_pending;
    pthread_mutex_unlock(&self->mu);
    PyObject *out = Py_BuildValue("(NLnn)", list, (long long)now_ns(), (Py_ssize_t)partial,
                                  (Py_ssize_t)pending);
    return out;
}

/* room() -> int: the bytes the thread may still hold (max_bytes less what it holds). */
static PyObject *Relay_room(Relay *self, PyObject *unused) {
    py_lock(self);
    size_t held = self->held_partial + self->held_pending;
    size_t room = held < self->max_bytes ? self->max_bytes - held : 0;
    pthread_mutex_unlock(&self->mu);
    return PyLong_FromSize_t(room);
}

/* info() -> dict: counters for tests and profiles. */
static PyObject *Relay_info(Relay *self, PyObject *unused) {
    py_lock(self);
    size_t live = 0, reading = 0, attached = 0, routes = 0, holding = 0, buffers = 0,
           tables = 0;
    for (size_t i = 0; i < self->nconns; i++) {
        conn_t *c = self->conns[i];
        if (c == NULL) continue;
        live++;
        reading += c->reading;
        attached += c->attached;
        if (c->epoch == self->epoch)
            for (int k = 0; k < c->nroutes; k++) routes += (size_t)route_valid(self, &c->routes[k]);
        holding += c->hlen > 0 || c->plen > 0;
        buffers += (c->hold != NULL) + (c->pend != NULL);
        tables += c->routes != NULL;
    }
    PyObject *d = Py_BuildValue(
        "{s:K,s:K,s:K,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:K,s:K,s:K,s:K}", "rounds",
        (unsigned long long)self->rounds, "upcalls", (unsigned long long)self->upcalls,
        "invalidations", (unsigned long long)self->invalidations, "connections",
        (Py_ssize_t)live, "reading", (Py_ssize_t)reading, "attached", (Py_ssize_t)attached,
        "routes", (Py_ssize_t)routes, "queued", (Py_ssize_t)self->up_count, "held_partial",
        (Py_ssize_t)self->held_partial, "held_pending", (Py_ssize_t)self->held_pending,
        "holding", (Py_ssize_t)holding, "buffers", (Py_ssize_t)buffers, "route_tables",
        (Py_ssize_t)tables, "max_bytes",
        (Py_ssize_t)self->max_bytes, "over_cap", (unsigned long long)self->over_cap, "broken",
        (unsigned long long)self->broken, "lost", (unsigned long long)self->lost, "handoffs",
        (unsigned long long)self->handoffs);
    pthread_mutex_unlock(&self->mu);
    return d;
}

/* _fail_upcalls(n): the next n upcalls fail as if memory were exhausted (tests only). */
static PyObject *Relay_fail_upcalls(Relay *self, PyObject *args) {
    int n;
    if (!PyArg_ParseTuple(args, "i", &n)) return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "_fail_upcalls: n must not be negative");
        return NULL;
    }
    py_lock(self);
    self->fail_upcalls = n;
    pthread_mutex_unlock(&self->mu);
    Py_RETURN_NONE;
}

static PyMethodDef Relay_methods[] = {
    {"start", (PyCFunction)Relay_start, METH_NOARGS, "Start the relay thread."},
    {"stop", (PyCFunction)Relay_stop, METH_NOARGS, "Stop the relay thread and wait for it."},
    {"fileno", (PyCFunction)Relay_fileno, METH_NOARGS, "The fd readable when upcalls wait."},
    {"open", (PyCFunction)Relay_open, METH_VARARGS, "open(fd, kind, max_hold) -> cid"},
    {"read", (PyCFunction)Relay_read, METH_VARARGS, "read(cid, raw, held=b''): read it."},
    {"unread", (PyCFunction)Relay_unread, METH_VARARGS, "unread(cid) -> held bytes."},
    {"attach", (PyCFunction)Relay_attach, METH_VARARGS, "attach(cid) -> bool"},
    {"take", (PyCFunction)Relay_take, METH_VARARGS, "take(cid) -> pending bytes (detaches)."},
    {"close", (PyCFunction)Relay_close, METH_VARARGS, "close(cid) -> pending bytes."},
    {"send", (PyCFunction)(void (*)(void))Relay_send, METH_FASTCALL, "send(cid, data) -> int"},
    {"learn", (PyCFunction)Relay_learn, METH_VARARGS,
     "learn(cid, key, out, skip, max_frame, dests, slot=0) -> bool"},
    {"invalidate", (PyCFunction)(void (*)(void))Relay_invalidate, METH_FASTCALL,
     "invalidate(slot=-1): forget the routes of a group slot (-1: every route)."},
    {"upcalls", (PyCFunction)Relay_upcalls, METH_NOARGS, "upcalls() -> [(cid, kind, data)]"},
    {"collect", (PyCFunction)Relay_collect, METH_NOARGS, "collect() -> (per-connection, now)"},
    {"room", (PyCFunction)Relay_room, METH_NOARGS, "room() -> bytes it may still hold"},
    {"info", (PyCFunction)Relay_info, METH_NOARGS, "info() -> dict"},
    {"_fail_upcalls", (PyCFunction)Relay_fail_upcalls, METH_VARARGS,
     "_fail_upcalls(n): the next n upcalls fail as if out of memory (tests only)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RelayType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gossiprouter.server._relay.Relay",
    .tp_basicsize = sizeof(Relay),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The compiled fast path: a relay thread (see the module's source).",
    .tp_new = Relay_new,
    .tp_init = (initproc)Relay_init,
    .tp_dealloc = (destructor)Relay_dealloc,
    .tp_methods = Relay_methods,
};

static struct PyModuleDef relaymodule = {
    PyModuleDef_HEAD_INIT, "gossiprouter.server._relay",
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
    PyModule_AddIntConstant(m, "LOST", UP_LOST);
    PyModule_AddIntConstant(m, "GROUP_SLOTS", GROUP_SLOTS);
    PyModule_AddIntConstant(m, "MAX_HOLD", MAX_HOLD);
    return m;
}
