/*
 * The three framings of a connection (relay.h, "Reading"), mutex held:
 *   NATIVE  a u32 length, then the frame: a learned header, then one msgpack bin ending it;
 *   JG5     (JGroups 5.x) a u32 length, then a learned header, then a u32 length ending it;
 *   JG2     (JGroups 2.12) a learned header, then a u32 length and that many bytes.
 * frame_len says where a frame ends (or that it is not one for the thread); a frame cut by the
 * end of a read is held here, in a buffer of its size, until the next read completes it.
 */
#include "framing.h"

#include "routes.h"

#include <stdlib.h>
#include <string.h>

/* The payload of a whole length-prefixed frame (``p[q:end]``, after a learned header) makes it
 * a plain routed frame: NATIVE, one msgpack bin ending the frame; JG5, a u32 length ending it. */
int payload_ends_frame(int kind, const uint8_t *p, size_t q, size_t end) {
    if (kind == JG5) return q + 4 + (size_t)be32(p + q) == end;
    uint8_t m = p[q];
    if (m == 0xc4) return q + 2 <= end && q + 2 + p[q + 1] == end;
    if (m == 0xc5) return q + 3 <= end && q + 3 + (((size_t)p[q + 1] << 8) | p[q + 2]) == end;
    if (m == 0xc6) return q + 5 <= end && q + 5 + (size_t)be32(p + q + 1) == end;
    return 0;
}

/* Where the frame at ``p`` (``avail`` bytes received) ends, for a learned route:
 * > 0: its length; 0: incomplete (wait for more); -1: not a frame relayed here. */
ssize_t frame_len(Relay *r, conn_t *c, route_t **rtp, const uint8_t *p, size_t avail) {
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
void set_hold(Relay *r, conn_t *c, uint8_t *buf, size_t len, size_t cap) {
    r->held_partial = r->held_partial - c->hlen + len;
    c->hold = buf;
    c->hlen = len;
    c->hcap = cap;
}

void drop_hold(Relay *r, conn_t *c) {
    free(c->hold);
    set_hold(r, c, NULL, 0, 0);
}

/* Keep ``buf[pos:len]``, the start of a frame, for the next read, in a buffer of its size:
 * 0, or -1 (no memory, or over max_bytes: Python takes it). */
int keep_rest(Relay *r, conn_t *c, const uint8_t *buf, size_t pos, size_t len) {
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
