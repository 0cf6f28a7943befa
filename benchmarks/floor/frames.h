/* The native frames the floor relays read (relay.c, threads.c): the preamble, the length prefix,
 * and the heads of HELLO, CONNECT and ROUTE. A benchmark reference, not product code. */
#ifndef FLOOR_FRAMES_H
#define FLOOR_FRAMES_H

#include <string.h>

#include "msgpack.h"

#define MAX_FRAME (8u << 20)

enum { FRAME_OTHER, FRAME_HELLO, FRAME_CONNECT, FRAME_ROUTE };

typedef struct {
    int type;
    const uint8_t *req; /* CONNECT: the request id, its bytes as sent */
    size_t rlen;
    const uint8_t *group;
    size_t glen;
    const uint8_t *addr; /* CONNECT: the member; ROUTE: the destination (NULL: the group) */
    size_t alen;
} frame_t;

/* The next of the `have` bytes at p, on a connection whose preamble was (*greeted) or was not
 * seen yet: -1, not native frames (close it); 0, not whole yet; else the bytes it takes, with
 * *body and *len the frame's body (*body NULL: that was the preamble, now *greeted). */
static inline long next_frame(const uint8_t *p, size_t have, int *greeted, const uint8_t **body,
                              size_t *len) {
    if (have < 4) return 0;
    if (!*greeted) {
        if (memcmp(p, "GRTR", 4)) return -1;
        *greeted = 1;
        *body = NULL;
        return 4;
    }
    *len = (size_t)be(p, 4);
    if (*len > MAX_FRAME) return -1;
    if (have < 4 + *len) return 0;
    *body = p + 4;
    return (long)(4 + *len);
}

/* The head of a frame's body (len bytes): -1 when it cannot be read. */
static inline int read_frame(const uint8_t *body, size_t len, frame_t *f) {
    cur_t cur = {body, body + len};
    size_t n;
    uint64_t type, r;
    memset(f, 0, sizeof *f);
    if (read_array(&cur, &n) || n < 1 || read_uint(&cur, &type)) return -1;
    if (type == 1) {
        f->type = FRAME_HELLO;
    } else if (type == 3 && n >= 4) { /* CONNECT req group addr ... */
        f->req = cur.p;
        if (read_uint(&cur, &r)) return -1;
        f->rlen = (size_t)(cur.p - f->req);
        if (read_bytes(&cur, &f->group, &f->glen) || read_bytes(&cur, &f->addr, &f->alen)
            || !f->addr)
            return -1;
        f->type = FRAME_CONNECT;
    } else if (type == 6 && n >= 5) { /* ROUTE group dest sender payload */
        if (read_bytes(&cur, &f->group, &f->glen) || read_bytes(&cur, &f->addr, &f->alen))
            return -1;
        f->type = FRAME_ROUTE;
    }
    return 0;
}

/* The answer to a HELLO. */
static const uint8_t WELCOME[] = {0, 0, 0, 10, 0x94, 2, 1, 0xa5, 'f', 'l', 'o', 'o', 'r', 0x80};

/* The OK [7, req, nil] answering CONNECT f, into ok (room for 16 bytes): its length. */
static inline size_t make_ok(uint8_t *ok, const frame_t *f) {
    memcpy(ok, (const uint8_t[]){0, 0, 0, (uint8_t)(3 + f->rlen), 0x93, 7}, 6);
    memcpy(ok + 6, f->req, f->rlen);
    ok[6 + f->rlen] = 0xc0;
    return 7 + f->rlen;
}

#endif
