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
 *
 * The files (one extension, gossiprouter.server._relay, built from all of them by setup.py):
 *   relay.h     this: the types every file shares (a connection, a route, the Relay)
 *   framing.c   the three framings: where a frame ends, and the start of one cut by a read
 *   routes.c    the learned routes per connection: match, learn, forget (per group slot)
 *   loop.c      the thread: epoll, reads, staged sends, eviction, upcalls
 *   workers.c   threads of their own for the busy connections (light-load latency)
 *   conns.c     Python's methods on one connection: open, read, attach, send, take, close
 *   broker.c    the federation broker's connection: the remote share of learned routes
 *               published by the thread, and every write to the broker (Python's too)
 *   link.c      Python's methods on that connection: open, enable, write, close, counters
 *   inbound.c   routed messages read from the broker: checked and delivered by the thread
 *   sha256.c    SHA-256 and HMAC-SHA256, for the federation key's signatures
 *   module.c    the Python type Relay (its other methods) and the module
 */
#ifndef GOSSIPROUTER_RELAY_H
#define GOSSIPROUTER_RELAY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/uio.h>
#include <time.h>

/* A function one file of the extension gives the others: not exported from the module. */
#define RELAY_INTERNAL __attribute__((visibility("hidden")))

#define NATIVE 1
#define JG2 2
#define JG5 3
#define MQTT 4 /* the federation broker's connection, read for routed messages (inbound.c) */

/* upcall kinds */
#define UP_DATA 0  /* bytes Python must handle (the thread stopped reading the connection) */
#define UP_EOF 1   /* the peer closed its side (after any bytes in an earlier DATA) */
#define UP_ERROR 2 /* a read failed (reset) */
#define UP_EVICT 3 /* the connection has pending bytes: take() them */
#define UP_LOST 4  /* an upcall for it could not be queued (no memory): close it */
#define UP_REMOTE 5 /* frames of routes learned with a remote share: relayed to their local
                     * receivers already; Python sends them on to the other routers */
#define UP_REMOTE_J5 6 /* the same, from a JGroups 5.x connection (its frames as received) */
#define UP_REMOTE_J2 7 /* the same, from a JGroups 2.12 connection (as received, not re-wrapped) */
#define IS_REMOTE(kind) ((kind) == UP_REMOTE || (kind) == UP_REMOTE_J5 || (kind) == UP_REMOTE_J2)

#define MAX_HOLD (256 * 1024)
#define RECV_SIZE (64 * 1024)
#define STAGE_INLINE 2 /* a frame is at most two pointers: room for one after any flush */
#define IDX_BITS 20
#define IDX_MASK ((1u << IDX_BITS) - 1)
#define GEN_BITS 30
#define CID_LIMIT ((int64_t)1 << (IDX_BITS + GEN_BITS)) /* every cid is below */
#define GROUP_SLOTS 4096 /* invalidation slots (a power of two) */
#define MAX_WORKERS 256  /* Relay(threads=N): N at most */

/* One other router a learned route's remote share goes to (broker.c): the broker link's
 * destination ``dst`` and the start of the routed message's header for it (msgpack: an array of
 * 6, this router's origin, the group, the destination member or nil). */
typedef struct {
    uint32_t dst;
    uint32_t plen;
    uint8_t *prefix;
} ftarget_t;

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
    int remote;    /* the frames also go to other routers: up to Python (UP_REMOTE) */
    int nfed;      /* ... or published by the thread to these (broker.c), while it may */
    ftarget_t *fed;
    uint64_t fgen; /* the broker link's generation when learned (0: no fed targets) */
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
    int worker;              /* 1 + the busy-connection thread that reads it (workers.c), 0: none */
    uint32_t burst;          /* its sparse reads since burst_ns (promotion to a worker) */
    int64_t burst_ns;
    uint32_t full;           /* its full reads in a row on a worker (demotion) */
    size_t last_read;        /* the bytes its last read received */
} conn_t;

/* A thread of its own for one busy connection (workers.c): it waits on its own epoll, which
 * holds that connection only, and serves it as the relay thread would, under the same mutex. */
typedef struct {
    struct Relay_s *r;
    int ep;          /* -1 until first used; the stop fd and the connection it serves */
    pthread_t thread;
    int started;
    int64_t cid;     /* the connection it serves, -1: none (the thread waits, parked) */
} worker_t;

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

/* A route of routed messages from another router (inbound.c): the payloads router ``writer``
 * sends for ``gd`` (the group and the member, msgpack, as in the message's header) whose frames
 * start with ``key`` (their header: group, member, sender; a native ROUTE's, or a 5.x
 * MESSAGE's for ``kind`` JG5) go to the local ``dests``. */
typedef struct inroute_s {
    struct inroute_s *next;
    uint32_t writer, gdlen, klen, max_frame, slot;
    int kind; /* NATIVE or JG5: the frames' framing */
    uint8_t *gd, *key;
    int ndest;
    int64_t *dests;
    uint64_t gen, fgen;
} inroute_t;

/* Another router, as the thread reads routed messages from it (inbound.c). */
typedef struct {
    uint8_t *topic; /* its route topic to this router */
    uint32_t tlen, olen;
    uint8_t *origin; /* its origin as a routed message's header has it (a msgpack str) */
    int64_t age_ms;  /* frames older than this on arrival are dropped (0: no limit) */
    uint32_t run_at; /* where its last run's sequence number was found (a hint) */
    /* since the last link_collect() */
    uint64_t messages, payloads, frames, delivered, expired;
} fwriter_t;

/* The last sequence number of a run of another router's signatures (route messages). */
typedef struct {
    char run[64];
    size_t len;
    uint64_t last;
} frun_t;

#define IN_BUCKETS 1024

/* One other router, as the broker link publishes to it (broker.c). */
typedef struct {
    uint8_t *topic; /* its route topic */
    uint32_t tlen;
    uint32_t bound; /* a PUBLISH's bytes beyond its payload on that topic, at most */
    uint8_t *buf;   /* this round's route payloads, each behind its length (4 bytes) */
    size_t len, cap;
    uint32_t npay, ccap;
    uint32_t *counts; /* the frames in each of them */
    int queued;     /* on the round's list */
    /* since the last link_collect() */
    uint64_t messages, payloads, frames, lost, lost_frames;
} fdst_t;

/* The federation broker's connection, while Python has handed it over (broker.c). */
typedef struct {
    int fd;         /* the thread's duplicate of the socket, -1: none */
    int routing;    /* the thread publishes learned remote shares (link_enable) */
    int broken;     /* a write failed (errno ``err``): nothing more is written */
    int err;
    int armed;      /* registered for EPOLLOUT: the socket did not take ``out`` */
    uint64_t gen;   /* bumped by every change: routes learned before are Python's again */
    uint8_t *out;   /* bytes for the broker the socket has not taken, from ``off`` */
    size_t off, len, cap;
    size_t queue_limit, max_packet, limit; /* bridge_queue_bytes; 0: none; an envelope's */
    size_t round_bytes;                    /* route payloads waiting for the round's end */
    int keyed;
    void *key;      /* hmac_key_t */
    char run[64];
    size_t runlen;
    uint64_t sign_seq;
    uint8_t *props; /* FROM property, SENT key, BATCH property, MAC key (link_enable) */
    size_t from_len, sent_len, batch_len, mac_len;
    fdst_t *dsts;
    uint32_t ndst, capdst;
    uint32_t *round; /* dsts with payloads this round */
    uint32_t nround, capround;
    /* The run of frames of one route not published yet (contiguous in the read buffer): its
     * route's fed targets (the route itself may move in its table, its targets do not). */
    ftarget_t *run_fed;
    int run_nfed;
    const uint8_t *run_p;
    size_t run_len;
    uint32_t run_count;
    atomic_ullong fanout; /* Moves' fan-out numbers: the thread's and Python's, one sequence */
    uint64_t oversized, queue_full, write_errors, dropped;
    /* Reading (inbound.c): the user properties' names (from, sent, batch, mac, beat). */
    int inbound;
    char names[5][40];
    size_t nlen[5];
    fwriter_t *writers;
    uint32_t nwriter, capwriter;
    inroute_t *ib[IN_BUCKETS];
    uint32_t ninroutes;
    frun_t *runs; /* a ring of MAX_RUNS, the oldest replaced */
    uint32_t nruns, runpos;
    uint64_t unauthenticated; /* replays the thread dropped */
} fed_t;

typedef struct Relay_s {
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
    /* The thread queued upcalls whose eventfd write waits for the mutex to be let go (the
     * thread's own: see signal_later in loop.c). */
    int signal_due;
    stage_t *dirty; /* the receivers with frames staged by the read being relayed */
    size_t ndirty, capdirty;
    uint8_t *scratch; /* RECV_SIZE: every read of a connection that holds no partial frame */
    wrap_t *wrap;     /* the read's re-wrapped frames, newest chunk first */
    /* What the thread holds between reads (partial frames, pending bytes), what the read being
     * relayed has staged (each byte may become pending), and the bound on their sum. */
    size_t held_partial, held_pending, staged, max_bytes;
    /* Bytes in UP_REMOTE upcalls Python has not taken yet (bounded by max_bytes: beyond, the
     * frames go up as DATA, and the connection waits for Python). */
    size_t held_remote;
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
    fed_t fed;         /* the federation broker's connection (broker.c) */
    worker_t *workers; /* threads for busy connections (workers.c), nworkers of them at most */
    int nworkers;
    uint32_t promote_reads; /* a connection with this many reads within BURST_NS gets one */
    int idle_ms;            /* ... and gives it back after this long without a read */
    uint64_t promotions, demotions;
    /* The relay's threads ask for SCHED_BATCH (Relay(batch=True), workers.c: relay_sched).
     * sched_refused: the errno of the first thread the kernel refused it, 0: none. */
    int batch;
    atomic_int sched_refused;
    sem_t ready; /* posted by a new relay thread once its scheduling is set (start() waits) */
} Relay;

/* The array ``arr`` (``*cap`` elements of ``elem`` bytes, ``n`` of them in use) with room for
 * one more: itself, or a larger one (doubled, from 8; *cap updated); NULL without memory (arr
 * unchanged, still the caller's). */
static inline void *grow(void *arr, uint32_t *cap, uint32_t n, size_t elem) {
    if (n < *cap) return arr;
    uint32_t c = *cap ? *cap * 2 : 8;
    void *p = realloc(arr, elem * c);
    if (p != NULL) *cap = c;
    return p;
}

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The epoll ``c`` is read from: its worker's (workers.c), or the relay thread's. */
static inline int conn_ep(const Relay *r, const conn_t *c) {
    return c->worker ? r->workers[c->worker - 1].ep : r->ep;
}

/* Watch ``fd`` for reading in epoll ``ep``, its events tagged ``tag`` (a cid, or -1 for the
 * stop fd). 0, or -1 with errno. */
static inline int watch_in(int ep, int fd, uint64_t tag) {
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = tag};
    return epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
}

/* The wall clock in ms (routed messages' send times and signatures: the routers' clocks). */
static inline int64_t wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Big-endian integers of the wire formats. */
static inline uint32_t be16(const uint8_t *p) { return (uint32_t)p[0] << 8 | p[1]; }

static inline uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline int64_t make_cid(uint32_t idx, uint32_t gen) {
    return ((int64_t)gen << IDX_BITS) | idx;
}

static inline conn_t *get_conn(Relay *r, int64_t cid) {
    if (cid < 0 || cid >= CID_LIMIT) return NULL;
    size_t idx = (size_t)(cid & IDX_MASK);
    if (idx >= r->nconns) return NULL;
    conn_t *c = r->conns[idx];
    if (c == NULL || !c->active || c->gen != (uint32_t)(cid >> IDX_BITS)) return NULL;
    return c;
}

#endif
