/* The light-load floor served the way Java 5.x's GossipRouter serves it: a blocked reader thread
 * per connection.
 *
 *     floor-threads PORT      (listens on 127.0.0.1:PORT only; prints nothing, runs until killed)
 *
 * A benchmark reference, not product code (benchmarks/floor/build.py builds it into build/;
 * benchmarks/bench_vs_jgroups.py drives it as the "floor-threads" router). The same native framing
 * and the same three frames as relay.c (GRTR preamble; HELLO -> WELCOME; CONNECT -> OK; ROUTE
 * forwarded byte for byte to dest in group, or with dest nil to every other connection in group),
 * but no epoll: each accepted connection gets its own thread, blocked in recv(); the thread
 * handles what one recv brought and sends each frame at once to each receiver's socket, under
 * that receiver's mutex (several readers may send to one receiver). A full receiver blocks its
 * senders' threads, as a blocking socket write blocks Java's; nothing else bounds memory.
 *
 * It answers one question of issue 30: the single-threaded floor (relay.c) and gossiprouter have
 * a higher p50 than Java 5.x at the paced light load on some machines; is that the price of one
 * thread serving every connection? This floor has Java's threading and relay.c's work per frame.
 *
 * A connection's memory and descriptor are kept until the process ends (a closed connection is
 * shut down, not closed): another thread may hold it between the member look-up and its send,
 * and a reused descriptor would send there to the wrong peer. A benchmark run is short.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "frames.h"
#include "listen.h"

#define MAX_MEMBERS 4096 /* registrations kept (a run registers a few dozen) */
#define MAX_FANOUT 1024  /* receivers of one frame */

typedef struct conn {
    int fd;
    pthread_mutex_t wlock;
    int greeted;
    uint8_t *in;
    size_t off, len, cap;
} conn_t;

typedef struct {
    uint8_t key[512];
    size_t klen, glen;
    conn_t *c;
} member_t;

static member_t members[MAX_MEMBERS];
static size_t nmembers;
static pthread_rwlock_t table = PTHREAD_RWLOCK_INITIALIZER;

/* All of p to `to` (a blocking socket: waits while it is full), whole: no other thread's frame
 * lands inside it. A failed send leaves the rest unsent; the receiver's own reader ends it. */
static void send_all(conn_t *to, const uint8_t *p, size_t n) {
    pthread_mutex_lock(&to->wlock);
    while (n) {
        ssize_t k = send(to->fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        p += k;
        n -= (size_t)k;
    }
    pthread_mutex_unlock(&to->wlock);
}

static void connect_member(conn_t *c, const frame_t *f) {
    if (f->glen + 1 + f->alen > sizeof members[0].key) return;
    pthread_rwlock_wrlock(&table);
    if (nmembers < MAX_MEMBERS) {
        member_t *m = &members[nmembers++];
        memcpy(m->key, f->group, f->glen);
        m->key[f->glen] = 0;
        memcpy(m->key + f->glen + 1, f->addr, f->alen);
        m->klen = f->glen + 1 + f->alen;
        m->glen = f->glen;
        m->c = c;
    }
    pthread_rwlock_unlock(&table);
}

/* The receivers of ROUTE f from c, into to (room for MAX_FANOUT): how many. */
static size_t receivers(conn_t *c, const frame_t *f, conn_t **to) {
    size_t nto = 0;
    pthread_rwlock_rdlock(&table);
    for (size_t i = 0; i < nmembers && nto < MAX_FANOUT; i++) {
        member_t *m = &members[i];
        if (!m->c || m->glen != f->glen || memcmp(m->key, f->group, f->glen)) continue;
        if (f->addr) {
            if (m->klen == f->glen + 1 + f->alen
                && !memcmp(m->key + f->glen + 1, f->addr, f->alen)) {
                to[nto++] = m->c;
                break;
            }
        } else if (m->c != c) { /* a multicast: every other connection in the group, once */
            int seen = 0;
            for (size_t j = 0; j < nto; j++) seen |= to[j] == m->c;
            if (!seen) to[nto++] = m->c;
        }
    }
    pthread_rwlock_unlock(&table);
    return nto;
}

/* One frame (body of len bytes, prefix just before it); -1 closes the connection. */
static int handle_frame(conn_t *c, const uint8_t *body, size_t len) {
    frame_t f;
    if (read_frame(body, len, &f)) return -1;
    if (f.type == FRAME_HELLO) {
        send_all(c, WELCOME, sizeof WELCOME);
    } else if (f.type == FRAME_CONNECT) {
        connect_member(c, &f);
        uint8_t ok[16];
        send_all(c, ok, make_ok(ok, &f));
    } else if (f.type == FRAME_ROUTE) {
        conn_t *to[MAX_FANOUT];
        size_t nto = receivers(c, &f, to);
        for (size_t i = 0; i < nto; i++) send_all(to[i], body - 4, len + 4);
    }
    return 0;
}

/* What the reads brought so far: every whole frame handled, the rest kept. -1: close. */
static int on_bytes(conn_t *c) {
    for (;;) {
        size_t len = 0;
        const uint8_t *body = NULL;
        long took = next_frame(c->in + c->off, c->len - c->off, &c->greeted, &body, &len);
        if (took < 0) return -1;
        if (took == 0) break;
        if (body && handle_frame(c, body, len)) return -1;
        c->off += (size_t)took;
    }
    if (c->off == c->len) c->off = c->len = 0;
    else if (c->off) {
        memmove(c->in, c->in + c->off, c->len - c->off);
        c->len -= c->off;
        c->off = 0;
    }
    if (c->cap - c->len < 65536) { /* room for a large frame's rest, and the next read */
        uint8_t *in = realloc(c->in, c->cap * 2);
        if (!in) return -1;
        c->in = in;
        c->cap *= 2;
    }
    return 0;
}

static void drop(conn_t *c) {
    pthread_rwlock_wrlock(&table);
    for (size_t i = 0; i < nmembers; i++)
        if (members[i].c == c) members[i].c = NULL;
    pthread_rwlock_unlock(&table);
    shutdown(c->fd, SHUT_RDWR);
    /* the conn stays allocated: another thread may hold it between lookup and send */
}

static void *reader(void *arg) {
    conn_t *c = arg;
    for (;;) {
        ssize_t got = recv(c->fd, c->in + c->len, c->cap - c->len, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0 || (c->len += (size_t)got, on_bytes(c))) break;
    }
    drop(c);
    return NULL;
}

static void *xmalloc(size_t n) {
    void *p = calloc(1, n);
    if (!p) { perror("floor-threads: calloc"); exit(1); }
    return p;
}

int main(int argc, char **argv) {
    if (argc != 2 || atoi(argv[1]) <= 0 || atoi(argv[1]) > 65535) {
        fprintf(stderr, "usage: floor-threads PORT   (listens on 127.0.0.1:PORT)\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    int lfd = listen_loopback(atoi(argv[1]), 0);
    if (lfd < 0) {
        perror("floor-threads: bind 127.0.0.1");
        return 1;
    }
    int one = 1;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024); /* as the Java router's -Xss256k */
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        conn_t *c = xmalloc(sizeof *c);
        c->fd = fd;
        pthread_mutex_init(&c->wlock, NULL);
        c->cap = 256 * 1024;
        c->in = xmalloc(c->cap);
        pthread_t t;
        if (pthread_create(&t, &attr, reader, c)) {
            perror("floor-threads: pthread_create");
            shutdown(fd, SHUT_RDWR);
        }
    }
}
