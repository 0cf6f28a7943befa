/* The light-load floor: a minimal single-threaded epoll relay of gossiprouter's native framing.
 *
 *     floor-relay PORT        (listens on 127.0.0.1:PORT only; prints nothing, runs until killed)
 *
 * A benchmark reference, not product code (benchmarks/floor/build.py builds it into build/;
 * benchmarks/bench_vs_jgroups.py drives it as the "floor" router). It does what any relay of
 * length-prefixed frames must do per message, and nothing more: one epoll_wait per wake-up, one
 * read per readable connection, the frames of that read appended to their receivers' buffers,
 * one write per receiver at the end of the wake-up. Against docs/protocol.md it keeps only:
 *
 *   - the GRTR preamble, then frames: u32 big-endian length + one msgpack array;
 *   - HELLO -> WELCOME [2, 1, "floor", {}];
 *   - CONNECT [3, req, group, addr, ...] -> registers (group, addr) on this connection, OK [7, req, nil]
 *     (req copied byte for byte);
 *   - ROUTE [6, group, dest, sender, payload] -> forwarded byte for byte, length prefix included,
 *     to the connection carrying dest in group, or with dest nil to every other connection that
 *     registered in group.
 *
 * Every other frame is ignored; no validation, authentication, heartbeats, events or limits beyond
 * the memory bound below. A frame whose prefix or header cannot be read closes its connection.
 * Back-pressure: a receiver holding more than OUT_HIGH unwritten bytes stops the connection that
 * fed it from being read until it drains below OUT_LOW.
 *
 *     floor-relay PORT BROKER_PORT ID    (federated: ID 0 to 31, an MQTT broker on 127.0.0.1)
 *
 * The floor of a route across relays (benchmarks/federation_floor.py): the relays share one
 * broker, each with one connection to it (mqtt.c). A CONNECT is published, retained, to
 * floor/m/ID/HEX(group 0 addr); every relay subscribes to floor/m/# and notes which relay
 * carries which member, and which relays have members in a group. What one wake-up routes to
 * relay R (unicasts to its members, and one copy of each multicast to a group it has members in)
 * leaves as one QoS 0 PUBLISH to floor/r/R, the frames byte for byte; all of a wake-up's
 * PUBLISHes in one write. A relay delivers the frames of floor/r/ID to its own members. Nothing
 * else: no leaves, no signatures, no ordering or loss checks, no bounds on the broker's queue.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "mqtt.h"
#include "frames.h"
#include "listen.h"

#define READ_SIZE (256 * 1024)
#define OUT_HIGH (4u << 20)
#define OUT_LOW (1u << 20)
#define MAX_EVENTS 256
#define MAX_RELAYS 32

typedef struct {
    uint8_t *p;
    size_t off, len, cap; /* bytes [off, len) are pending */
} buf_t;

typedef struct conn {
    int fd;
    unsigned gen;      /* tells a reused fd from the connection a member entry names */
    int greeted;       /* preamble seen */
    int paused;        /* reading stopped by a full receiver */
    int dirty;         /* in the flush list of this wake-up */
    uint32_t events;   /* what epoll watches for it now */
    unsigned mark;     /* multicast de-duplication */
    buf_t in, out;
    int *feeders;      /* fds paused because of this receiver */
    size_t nfeeders, feeders_cap;
} conn_t;

typedef struct { int fd; unsigned gen; } ref_t;

typedef struct {
    uint8_t *key; /* group bytes, 0, addr bytes: so (group, addr) pairs never collide */
    size_t klen;
    ref_t ref;
} member_t;

typedef struct {
    uint8_t *name;
    size_t len;
    ref_t *refs;
    size_t n, cap;
    uint32_t remote; /* the relays (bit per ID) with members in it */
} group_t;

static conn_t **conns;
static size_t nconns;
static unsigned next_gen = 1, next_mark = 1;
static member_t *members;
static size_t members_cap, members_n;
static group_t *groups;
static size_t ngroups;
static int *flush_list;
static size_t nflush, flush_cap;
static int ep;
/* Federated mode: the broker connection (-1: none), this relay's ID, what each relay is sent
 * this wake-up, and the bytes read from and waiting for the broker. */
static int broker = -1, self_id;
static buf_t routed[MAX_RELAYS], bin, bout;
static uint32_t routed_dirty;

static void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n);
    if (!q) { perror("floor-relay: realloc"); exit(1); }
    return q;
}

static void reserve(buf_t *b, size_t more) {
    if (b->off && b->len + more > b->cap) { /* compact first */
        memmove(b->p, b->p + b->off, b->len - b->off);
        b->len -= b->off;
        b->off = 0;
    }
    if (b->len + more > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + more) cap *= 2;
        b->p = xrealloc(b->p, cap);
        b->cap = cap;
    }
}

static conn_t *live(ref_t r) {
    if (r.fd < 0 || (size_t)r.fd >= nconns || !conns[r.fd] || conns[r.fd]->gen != r.gen) return NULL;
    return conns[r.fd];
}

/* ---------------------------------------------------------------- membership */

static uint64_t hash(const uint8_t *k, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ k[i]) * 1099511628211ull;
    return h;
}

static member_t *slot(const uint8_t *k, size_t n) {
    size_t i = hash(k, n) & (members_cap - 1);
    while (members[i].key && !(members[i].klen == n && !memcmp(members[i].key, k, n)))
        i = (i + 1) & (members_cap - 1);
    return &members[i];
}

static size_t make_key(uint8_t *k, const uint8_t *g, size_t glen, const uint8_t *a, size_t alen) {
    memcpy(k, g, glen);
    k[glen] = 0;
    memcpy(k + glen + 1, a, alen);
    return glen + 1 + alen;
}

static group_t *group(const uint8_t *name, size_t len, int create) {
    for (size_t i = 0; i < ngroups; i++)
        if (groups[i].len == len && !memcmp(groups[i].name, name, len)) return &groups[i];
    if (!create) return NULL;
    groups = xrealloc(groups, (ngroups + 1) * sizeof *groups);
    group_t *g = &groups[ngroups++];
    memset(g, 0, sizeof *g);
    g->name = xrealloc(NULL, len ? len : 1);
    memcpy(g->name, name, len);
    g->len = len;
    return g;
}

/* The entry of key k (n bytes), made if new; ref is set by the caller. */
static member_t *entry(const uint8_t *k, size_t n) {
    if ((members_n + 1) * 2 > members_cap) { /* grow and rehash */
        member_t *old = members;
        size_t old_cap = members_cap;
        members_cap = members_cap ? members_cap * 2 : 1024;
        members = xrealloc(NULL, members_cap * sizeof *members);
        memset(members, 0, members_cap * sizeof *members);
        for (size_t i = 0; i < old_cap; i++)
            if (old[i].key) *slot(old[i].key, old[i].klen) = old[i];
        free(old);
    }
    member_t *m = slot(k, n);
    if (!m->key) {
        m->key = xrealloc(NULL, n);
        memcpy(m->key, k, n);
        m->klen = n;
        members_n++;
    }
    return m;
}

static void connect_member(conn_t *c, const uint8_t *gname, size_t glen, const uint8_t *a,
                           size_t alen) {
    uint8_t k[1024 + 1 + 256];
    if (glen > 1024 || alen > 255) return;
    member_t *m = entry(k, make_key(k, gname, glen, a, alen));
    m->ref = (ref_t){c->fd, c->gen};
    group_t *g = group(gname, glen, 1);
    if (g->n == g->cap) {
        g->cap = g->cap ? g->cap * 2 : 16;
        g->refs = xrealloc(g->refs, g->cap * sizeof *g->refs);
    }
    g->refs[g->n++] = m->ref;
}

/* A member on relay `relay` (federated mode): its entry names no connection (fd -2 - relay). */
static void remote_member(const uint8_t *gname, size_t glen, const uint8_t *a, size_t alen,
                          int relay) {
    uint8_t k[1024 + 1 + 256];
    if (glen > 1024 || alen > 255) return;
    member_t *m = entry(k, make_key(k, gname, glen, a, alen));
    if (live(m->ref)) return; /* a local member keeps its entry */
    m->ref = (ref_t){-2 - relay, 0};
    group(gname, glen, 1)->remote |= 1u << relay;
}

/* ---------------------------------------------------------------- output */

static void queue_bytes(conn_t *to, const uint8_t *p, size_t n) {
    reserve(&to->out, n);
    memcpy(to->out.p + to->out.len, p, n);
    to->out.len += n;
    if (!to->dirty) {
        to->dirty = 1;
        if (nflush == flush_cap) {
            flush_cap = flush_cap ? flush_cap * 2 : 64;
            flush_list = xrealloc(flush_list, flush_cap * sizeof *flush_list);
        }
        flush_list[nflush++] = to->fd;
    }
}

/* Watch for input unless paused, for output only while a write is blocked; no system call
 * when nothing changes (the common case: every write completes at once). */
static void set_events(conn_t *c) {
    uint32_t want = (c->paused ? 0 : EPOLLIN) | (c->out.len > c->out.off ? EPOLLOUT : 0);
    if (want == c->events) return;
    struct epoll_event ev = {.events = want, .data.fd = c->fd};
    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
    c->events = want;
}

/* A receiver past OUT_HIGH stops its feeder from being read. */
static void throttle(conn_t *from, conn_t *to) {
    if (from == to || from->paused || to->out.len - to->out.off <= OUT_HIGH) return;
    from->paused = 1;
    if (to->nfeeders == to->feeders_cap) {
        to->feeders_cap = to->feeders_cap ? to->feeders_cap * 2 : 8;
        to->feeders = xrealloc(to->feeders, to->feeders_cap * sizeof *to->feeders);
    }
    to->feeders[to->nfeeders++] = from->fd;
    set_events(from);
}

static void close_conn(conn_t *c);

/* Write what is pending; 0 when the connection is still open. */
static int flush(conn_t *c) {
    while (c->out.len > c->out.off) {
        ssize_t n = send(c->fd, c->out.p + c->out.off, c->out.len - c->out.off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) break;
        if (n <= 0) { close_conn(c); return -1; }
        c->out.off += (size_t)n;
    }
    size_t left = c->out.len - c->out.off;
    if (!left) c->out.off = c->out.len = 0;
    if (left <= OUT_LOW && c->nfeeders) {
        for (size_t i = 0; i < c->nfeeders; i++) {
            int fd = c->feeders[i];
            if ((size_t)fd < nconns && conns[fd] && conns[fd]->paused) {
                conns[fd]->paused = 0;
                set_events(conns[fd]);
            }
        }
        c->nfeeders = 0;
    }
    set_events(c);
    return 0;
}

/* ---------------------------------------------------------------- routing */

static void to_relay(int relay, const uint8_t *frame, size_t flen) {
    reserve(&routed[relay], flen);
    memcpy(routed[relay].p + routed[relay].len, frame, flen);
    routed[relay].len += flen;
    routed_dirty |= 1u << relay;
}

/* The frame (flen bytes, its prefix included) of group g to member d (NULL: the group): to this
 * relay's members, and, when it came from a member here (from), to the relays of the others. */
static void deliver(conn_t *from, const uint8_t *g, size_t glen, const uint8_t *d, size_t dlen,
                    const uint8_t *frame, size_t flen) {
    if (d) {
        uint8_t k[1024 + 1 + 256];
        if (glen > 1024 || dlen > 255 || !members_cap) return;
        member_t *m = slot(k, make_key(k, g, glen, d, dlen));
        conn_t *to = m->key ? live(m->ref) : NULL;
        if (to) {
            queue_bytes(to, frame, flen);
            if (from) throttle(from, to);
        } else if (from && m->key && m->ref.fd <= -2) {
            to_relay(-2 - m->ref.fd, frame, flen);
        }
        return;
    }
    group_t *gr = group(g, glen, 0);
    if (!gr) return;
    unsigned mark = next_mark++;
    if (from) from->mark = mark; /* not back to the sender's own connection */
    for (size_t i = 0; i < gr->n; i++) {
        conn_t *to = live(gr->refs[i]);
        if (!to || to->mark == mark) continue;
        to->mark = mark;
        queue_bytes(to, frame, flen);
        if (from) throttle(from, to);
    }
    for (uint32_t r = from ? gr->remote : 0; r; r &= r - 1) to_relay(__builtin_ctz(r), frame, flen);
}

/* ---------------------------------------------------------------- the broker (federated mode) */

static uint32_t broker_events;

static void to_broker(const char *topic, const uint8_t *payload, size_t n, int retain) {
    size_t tlen = strlen(topic), size = mqtt_publish_size(tlen, n);
    reserve(&bout, size);
    bout.len += mqtt_publish(bout.p + bout.len, topic, tlen, payload, n, retain);
}

/* Write what waits for the broker; watch for output only while a write is blocked. */
static void flush_broker(void) {
    while (bout.len > bout.off) {
        ssize_t n = send(broker, bout.p + bout.off, bout.len - bout.off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) break;
        if (n <= 0) { perror("floor-relay: the broker connection"); exit(1); }
        bout.off += (size_t)n;
    }
    if (bout.off == bout.len) bout.off = bout.len = 0;
    uint32_t want = EPOLLIN | (bout.len > bout.off ? EPOLLOUT : 0);
    if (want != broker_events) {
        struct epoll_event ev = {.events = want, .data.fd = broker};
        epoll_ctl(ep, EPOLL_CTL_MOD, broker, &ev);
        broker_events = want;
    }
}

/* A member of this relay, retained on floor/m/ID/HEX(group 0 addr) for the others. */
static void publish_member(const uint8_t *g, size_t glen, const uint8_t *a, size_t alen) {
    uint8_t k[1024 + 1 + 256];
    char topic[32 + 2 * sizeof k];
    if (glen > 1024 || alen > 255) return;
    size_t n = make_key(k, g, glen, a, alen);
    int at = snprintf(topic, 32, "floor/m/%d/", self_id);
    for (size_t i = 0; i < n; i++) at += sprintf(topic + at, "%02x", k[i]);
    to_broker(topic, k, n, 1);
}

/* What this wake-up routed to each relay: one PUBLISH each, all of them in one write. */
static void publish_routed(void) {
    char topic[32];
    for (uint32_t r = routed_dirty; r; r &= r - 1) {
        int relay = __builtin_ctz(r);
        snprintf(topic, sizeof topic, "floor/r/%d", relay);
        to_broker(topic, routed[relay].p, routed[relay].len, 0);
        routed[relay].len = 0;
    }
    routed_dirty = 0;
    if (bout.len > bout.off) flush_broker();
}

static void on_publish(const uint8_t *topic, size_t tlen, const uint8_t *p, size_t n) {
    if (tlen > 8 && !memcmp(topic, "floor/m/", 8)) { /* a member of another relay */
        int relay = atoi((const char *)topic + 8); /* digits, then '/' */
        const uint8_t *zero = memchr(p, 0, n);
        if (relay != self_id && relay >= 0 && relay < MAX_RELAYS && zero)
            remote_member(p, (size_t)(zero - p), zero + 1, n - (size_t)(zero - p) - 1, relay);
        return;
    }
    while (n >= 4) { /* floor/r/ID: frames for members here */
        size_t len = (size_t)be(p, 4);
        if (len > n - 4) return;
        cur_t cur = {p + 4, p + 4 + len};
        size_t items, glen, dlen;
        uint64_t type;
        const uint8_t *g, *d;
        if (!read_array(&cur, &items) && items >= 5 && !read_uint(&cur, &type) && type == 6
            && !read_bytes(&cur, &g, &glen) && !read_bytes(&cur, &d, &dlen))
            deliver(NULL, g, glen, d, dlen, p, 4 + len);
        p += 4 + len;
        n -= 4 + len;
    }
}

static void on_broker(void) {
    reserve(&bin, READ_SIZE);
    ssize_t got = recv(broker, bin.p + bin.len, bin.cap - bin.len, 0);
    if (got < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (got <= 0) { fprintf(stderr, "floor-relay: the broker closed the connection\n"); exit(1); }
    bin.len += (size_t)got;
    for (;;) {
        const uint8_t *topic, *payload;
        size_t tlen, plen;
        long n = mqtt_next(bin.p + bin.off, bin.len - bin.off, &topic, &tlen, &payload, &plen);
        if (n < 0) { fprintf(stderr, "floor-relay: a broker packet it cannot read\n"); exit(1); }
        if (n == 0) break;
        if (topic) on_publish(topic, tlen, payload, plen);
        bin.off += (size_t)n;
    }
    if (bin.off == bin.len) bin.off = bin.len = 0;
}

/* ---------------------------------------------------------------- input */

/* One frame (body of len bytes, prefix just before it); -1 closes the connection. */
static int handle_frame(conn_t *c, const uint8_t *body, size_t len) {
    frame_t f;
    if (read_frame(body, len, &f)) return -1;
    if (f.type == FRAME_HELLO) {
        queue_bytes(c, WELCOME, sizeof WELCOME);
    } else if (f.type == FRAME_CONNECT) {
        connect_member(c, f.group, f.glen, f.addr, f.alen);
        if (broker >= 0) publish_member(f.group, f.glen, f.addr, f.alen);
        uint8_t ok[16];
        queue_bytes(c, ok, make_ok(ok, &f));
    } else if (f.type == FRAME_ROUTE) {
        deliver(c, f.group, f.glen, f.addr, f.alen, body - 4, len + 4);
    }
    return 0;
}

/* Read once; route every whole frame; -1 when the connection was closed. */
static int on_readable(conn_t *c) {
    reserve(&c->in, READ_SIZE);
    ssize_t got = recv(c->fd, c->in.p + c->in.len, c->in.cap - c->in.len, 0);
    if (got < 0 && (errno == EAGAIN || errno == EINTR)) return 0;
    if (got <= 0) { close_conn(c); return -1; }
    c->in.len += (size_t)got;
    for (;;) {
        size_t have = c->in.len - c->in.off, len = 0;
        const uint8_t *body = NULL;
        long took = next_frame(c->in.p + c->in.off, have, &c->greeted, &body, &len);
        if (took < 0) { close_conn(c); return -1; }
        if (took == 0) {
            if (len) reserve(&c->in, 4 + len - have); /* a frame's rest: room for all of it */
            break;
        }
        if (body && handle_frame(c, body, len)) { close_conn(c); return -1; }
        c->in.off += (size_t)took;
        if (c->paused) break; /* the rest waits until the receiver drains */
    }
    if (c->in.off == c->in.len) c->in.off = c->in.len = 0;
    return 0;
}

static void close_conn(conn_t *c) {
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    conns[c->fd] = NULL;
    /* members and group entries naming it go stale by gen; a dirty entry is skipped */
    free(c->in.p);
    free(c->out.p);
    free(c->feeders);
    free(c);
}

static void on_accept(int lfd) {
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if ((size_t)fd >= nconns) {
            size_t n = nconns ? nconns : 1024;
            while (n <= (size_t)fd) n *= 2;
            conns = xrealloc(conns, n * sizeof *conns);
            memset(conns + nconns, 0, (n - nconns) * sizeof *conns);
            nconns = n;
        }
        conn_t *c = xrealloc(NULL, sizeof *c);
        memset(c, 0, sizeof *c);
        c->fd = fd;
        c->gen = next_gen++;
        c->events = EPOLLIN;
        conns[fd] = c;
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    }
}

int main(int argc, char **argv) {
    if ((argc != 2 && argc != 4) || atoi(argv[1]) <= 0 || atoi(argv[1]) > 65535
        || (argc == 4 && (atoi(argv[2]) <= 0 || atoi(argv[3]) < 0
                          || atoi(argv[3]) >= MAX_RELAYS))) {
        fprintf(stderr, "usage: floor-relay PORT [BROKER_PORT ID]   (listens on 127.0.0.1:PORT;"
                        " federated through an MQTT broker on 127.0.0.1:BROKER_PORT, ID 0-31)\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    int lfd = listen_loopback(atoi(argv[1]), SOCK_NONBLOCK);
    if (lfd < 0) {
        perror("floor-relay: bind 127.0.0.1");
        return 1;
    }
    ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = lfd};
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
    if (argc == 4) {
        char id[32];
        self_id = atoi(argv[3]);
        snprintf(id, sizeof id, "floor-%d", self_id);
        char mine[32];
        snprintf(mine, sizeof mine, "floor/r/%d", self_id);
        const char *filters[] = {mine, "floor/m/#"};
        if ((broker = mqtt_connect(atoi(argv[2]), id, filters, 2)) < 0) return 1;
        broker_events = EPOLLIN;
        struct epoll_event bev = {.events = EPOLLIN, .data.fd = broker};
        epoll_ctl(ep, EPOLL_CTL_ADD, broker, &bev);
    }
    struct epoll_event evs[MAX_EVENTS];
    for (;;) {
        int n = epoll_wait(ep, evs, MAX_EVENTS, -1);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) { perror("floor-relay: epoll_wait"); return 1; }
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == lfd) { on_accept(lfd); continue; }
            if (fd == broker) {
                if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) on_broker();
                if (evs[i].events & EPOLLOUT) flush_broker();
                continue;
            }
            conn_t *c = (size_t)fd < nconns ? conns[fd] : NULL;
            if (!c) continue;
            if (c->paused && (evs[i].events & (EPOLLHUP | EPOLLERR))) { close_conn(c); continue; }
            if ((evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && !c->paused
                && on_readable(c))
                continue;
            if ((evs[i].events & EPOLLOUT) && !c->dirty) flush(c);
        }
        /* one write per receiver per wake-up */
        for (size_t i = 0; i < nflush; i++) {
            conn_t *c = conns[flush_list[i]];
            if (!c) continue;
            c->dirty = 0;
            flush(c);
        }
        nflush = 0;
        if (broker >= 0) publish_routed(); /* one PUBLISH per relay, one write */
    }
}
