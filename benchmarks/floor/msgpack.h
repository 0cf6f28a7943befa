/* Just enough msgpack for the floor relay (relay.c): reading the head of a frame. A benchmark
 * reference, not product code. */
#ifndef FLOOR_MSGPACK_H
#define FLOOR_MSGPACK_H

#include <stddef.h>
#include <stdint.h>

typedef struct { const uint8_t *p, *end; } cur_t;

static inline int need(cur_t *c, size_t n) { return (size_t)(c->end - c->p) >= n; }

static inline uint64_t be(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = v << 8 | p[i];
    return v;
}

/* An unsigned integer; -1 when the next value is not one. */
static inline int read_uint(cur_t *c, uint64_t *v) {
    if (!need(c, 1)) return -1;
    uint8_t t = *c->p;
    int n = t <= 0x7f ? 0 : t == 0xcc ? 1 : t == 0xcd ? 2 : t == 0xce ? 4 : t == 0xcf ? 8 : -1;
    if (n < 0 || !need(c, 1 + (size_t)n)) return -1;
    *v = n ? be(c->p + 1, n) : t;
    c->p += 1 + n;
    return 0;
}

/* A str, bin or nil (*len = 0, *s = NULL); -1 when the next value is none of them. */
static inline int read_bytes(cur_t *c, const uint8_t **s, size_t *len) {
    if (!need(c, 1)) return -1;
    uint8_t t = *c->p;
    int n;
    size_t l;
    if (t == 0xc0) { c->p++; *s = NULL; *len = 0; return 0; }
    if ((t & 0xe0) == 0xa0) { n = 0; l = t & 0x1f; }
    else if (t == 0xd9 || t == 0xc4) n = 1;
    else if (t == 0xda || t == 0xc5) n = 2;
    else if (t == 0xdb || t == 0xc6) n = 4;
    else return -1;
    if (!need(c, 1 + (size_t)n)) return -1;
    if (n) l = (size_t)be(c->p + 1, n);
    c->p += 1 + n;
    if (!need(c, l)) return -1;
    *s = c->p;
    *len = l;
    c->p += l;
    return 0;
}

static inline int read_array(cur_t *c, size_t *n) {
    if (!need(c, 1)) return -1;
    uint8_t t = *c->p;
    if ((t & 0xf0) == 0x90) { *n = t & 0x0f; c->p++; return 0; }
    if (t == 0xdc && need(c, 3)) { *n = (size_t)be(c->p + 1, 2); c->p += 3; return 0; }
    if (t == 0xdd && need(c, 5)) { *n = (size_t)be(c->p + 1, 4); c->p += 5; return 0; }
    return -1;
}

#endif
