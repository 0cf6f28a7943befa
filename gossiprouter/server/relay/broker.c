/*
 * The federation broker's connection on the relay thread (broker.h; docs/federation.md, "The
 * routed path on the relay thread").
 *
 * Python hands the broker socket's writes over at the start of a broker session (link_open:
 * the thread keeps a duplicate of the socket, so a descriptor number Python closes and reuses
 * is never written). From then on every byte for the broker goes through here, under the
 * mutex: paho's (link_write: written at once when nothing waits, else queued behind what
 * waits) and the thread's own, so the two never interleave within a packet and keep the order
 * they were written in. What the socket does not take waits in ``out`` (EPOLLOUT); a failed
 * write breaks the link (Python's next write meets the error, as paho's own send would).
 *
 * While the session is up (link_enable), a learned route may carry fed targets: the other
 * routers its frames also go to, each with the start of the routed message's header
 * (codec.encode_route). The thread then publishes the remote share itself, as Python would
 * (peers.py, Peers._send_route and _flush_routes): a run of frames of one route in one read is
 * one route payload per target, numbered by the fan-out counter it shares with Python (Moves);
 * what one round routes to a router leaves as one QoS 0 PUBLISH on that router's route topic
 * (an envelope of several payloads with the batch property, within the broker's Maximum Packet
 * Size), with this router's origin, the send time and, with the federation key, a signature of
 * its own run (signing.py). The bounds are Python's: bridge_queue_bytes for what waits, the
 * broker's limit per message; what is beyond is dropped and counted, as Python counts it.
 * Every change of the link (enable, disable, open, close, invalidate) bumps its generation:
 * routes learned before it go back to Python, which learns them again as things are now.
 * Everything here runs with the mutex held.
 */
#include "broker.h"

#include "loop.h"
#include "routes.h"
#include "sha256.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define OUT_KEEP (256 * 1024) /* a buffer this large is freed once empty */

/* ------------------------------------------------------------------ the byte stream */

void disarm(Relay *r) {
    fed_t *f = &r->fed;
    if (f->armed) {
        epoll_ctl(r->ep, EPOLL_CTL_DEL, f->fd, NULL);
        f->armed = 0;
    }
}

void out_drop(fed_t *f) {
    f->dropped += f->len - f->off;
    f->off = f->len = 0;
    if (f->cap > OUT_KEEP) {
        free(f->out);
        f->out = NULL;
        f->cap = 0;
    }
}

void fail(Relay *r, int err) {
    fed_t *f = &r->fed;
    f->broken = 1;
    f->err = err ? err : EPIPE;
    f->write_errors++;
    disarm(r);
    out_drop(f);
}

/* Write what waits in ``out`` (what the socket does not take waits for EPOLLOUT). */
void out_push(Relay *r) {
    fed_t *f = &r->fed;
    if (f->fd < 0 || f->broken) return;
    while (f->off < f->len) {
        ssize_t n = send(f->fd, f->out + f->off, f->len - f->off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
            f->off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!f->armed) {
                struct epoll_event ev = {.events = EPOLLOUT, .data.u64 = FED_EVENT};
                if (epoll_ctl(r->ep, EPOLL_CTL_ADD, f->fd, &ev) == 0) f->armed = 1;
                else fail(r, errno);
            }
            return;
        }
        fail(r, n == 0 ? EPIPE : errno);
        return;
    }
    f->off = f->len = 0;
    disarm(r);
    if (f->cap > OUT_KEEP) {
        free(f->out);
        f->out = NULL;
        f->cap = 0;
    }
}

/* Room for ``n`` more bytes at the end of ``out`` (NULL: no memory). */
uint8_t *out_room(fed_t *f, size_t n) {
    if (f->len + n > f->cap && f->off) {
        memmove(f->out, f->out + f->off, f->len - f->off);
        f->len -= f->off;
        f->off = 0;
    }
    if (f->len + n > f->cap) {
        size_t cap = f->cap ? f->cap : 4096;
        while (cap < f->len + n) cap *= 2;
        uint8_t *p = realloc(f->out, cap);
        if (p == NULL) return NULL;
        f->out = p;
        f->cap = cap;
    }
    uint8_t *p = f->out + f->len;
    f->len += n;
    return p;
}

void fed_writable(Relay *r) { out_push(r); }

/* ------------------------------------------------------------------ route payloads */

static size_t mp_uint(uint8_t *p, uint64_t v) { /* msgpack's shortest form, as msgpack packs */
    if (v < 0x80) {
        p[0] = (uint8_t)v;
        return 1;
    }
    int n = v < 0x100 ? 1 : v < 0x10000 ? 2 : v <= 0xffffffffULL ? 4 : 8;
    p[0] = n == 1 ? 0xcc : n == 2 ? 0xcd : n == 4 ? 0xce : 0xcf;
    for (int i = 0; i < n; i++) p[1 + i] = (uint8_t)(v >> (8 * (n - 1 - i)));
    return (size_t)n + 1;
}

static void put_be(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * (n - 1 - i)));
}


/* A routed message for ``d`` of ``count`` frames is dropped (counted as Python counts it). */
static void lost(fdst_t *d, uint64_t count) {
    d->lost++;
    d->lost_frames += count;
}

/* One route payload (encode_route: the header's length, the header, the frames) for each fed
 * target of the run, in its router's batch for this round; or counted lost, as Python counts a
 * routed message it cannot send (Peers._send_route). */
static void emit(Relay *r) {
    fed_t *f = &r->fed;
    uint8_t tail[1 + 9 + 1 + 9];
    uint64_t seq = atomic_fetch_add(&f->fanout, 1) + 1;
    size_t tl = mp_uint(tail, f->run_count);
    tail[tl++] = 0xc2; /* handed: false */
    tl += mp_uint(tail + tl, seq);
    for (int i = 0; i < f->run_nfed; i++) {
        const ftarget_t *t = &f->run_fed[i];
        if (t->dst >= f->ndst) continue; /* (never: learn checks it) */
        fdst_t *d = &f->dsts[t->dst];
        size_t head = t->plen + tl, plen = 2 + head + f->run_len;
        size_t waiting = f->len - f->off + f->round_bytes;
        if (waiting + plen + 4 > f->queue_limit) {
            f->queue_full++;
            lost(d, f->run_count);
            continue;
        }
        if (f->max_packet && plen + d->bound > f->max_packet) {
            f->oversized++;
            lost(d, f->run_count);
            continue;
        }
        uint32_t *c = grow(d->counts, &d->ccap, d->npay, sizeof *d->counts);
        if (c == NULL) {
            lost(d, f->run_count);
            continue;
        }
        d->counts = c;
        if (d->len + plen + 4 > d->cap) {
            size_t cap = d->cap ? d->cap : 4096;
            while (cap < d->len + plen + 4) cap *= 2;
            uint8_t *p = realloc(d->buf, cap);
            if (p == NULL) {
                lost(d, f->run_count);
                continue;
            }
            d->buf = p;
            d->cap = cap;
        }
        if (!d->queued) {
            uint32_t *q = grow(f->round, &f->capround, f->nround, sizeof *f->round);
            if (q == NULL) { /* it could not be published */
                lost(d, f->run_count);
                continue;
            }
            f->round = q;
            f->round[f->nround++] = t->dst;
            d->queued = 1;
        }
        uint8_t *p = d->buf + d->len;
        put_be(p, plen, 4);
        put_be(p + 4, head, 2);
        memcpy(p + 6, t->prefix, t->plen);
        memcpy(p + 6 + t->plen, tail, tl);
        memcpy(p + 6 + head, f->run_p, f->run_len);
        d->len += plen + 4;
        d->counts[d->npay++] = f->run_count;
        f->round_bytes += plen + 4;
    }
    f->run_count = 0;
    f->run_len = 0;
    f->run_fed = NULL;
}

void fed_frame(Relay *r, route_t *rt, const uint8_t *p, size_t n) {
    fed_t *f = &r->fed;
    if (f->run_count && f->run_fed == rt->fed && f->run_p + f->run_len == p &&
        f->run_count < 0x7fffffff) {
        f->run_len += n;
        f->run_count++;
        return;
    }
    fed_end_read(r);
    f->run_fed = rt->fed;
    f->run_nfed = rt->nfed;
    f->run_p = p;
    f->run_len = n;
    f->run_count = 1;
}

void fed_end_read(Relay *r) {
    if (r->fed.run_count) emit(r);
}

/* ------------------------------------------------------------------ publishing */

static size_t vbi_len(size_t n) { return n < 128 ? 1 : n < 16384 ? 2 : n < 2097152 ? 3 : 4; }

static size_t put_vbi(uint8_t *p, size_t n) {
    size_t i = 0;
    do {
        uint8_t b = n & 127;
        n >>= 7;
        p[i++] = n ? b | 128 : b;
    } while (n);
    return i;
}

/* One PUBLISH (QoS 0) of ``payload`` on ``d``'s topic, at the end of ``out``: 0, or -1 (no
 * memory). The user properties as Python's (Peers._publish_route): origin, send time, the
 * batch mark for an envelope, and the signature (signing.Signer.sign) with the key. */
static int publish(fed_t *f, fdst_t *d, const uint8_t *payload, size_t plen, int batch,
                   const char *sent, size_t slen) {
    char head[128];
    size_t hl = 0, siglen = 0;
    if (f->keyed) {
        int k = snprintf(head, sizeof head, "%.*s:%llu:%s", (int)f->runlen, f->run,
                         (unsigned long long)(f->sign_seq + 1), sent);
        if (k < 0 || (size_t)k >= sizeof head) return -1;
        hl = (size_t)k;
        siglen = hl + 1 + 2 * SHA256_SIZE;
    }
    size_t props = f->from_len + f->sent_len + 2 + slen + (batch ? f->batch_len : 0) +
                   (f->keyed ? f->mac_len + 2 + siglen : 0);
    size_t rest = 2 + d->tlen + vbi_len(props) + props + plen;
    if (rest >= 268435456) return -1; /* beyond MQTT's remaining length */
    uint8_t *p = out_room(f, 1 + vbi_len(rest) + rest);
    if (p == NULL) return -1;
    *p++ = 0x30;
    p += put_vbi(p, rest);
    put_be(p, d->tlen, 2);
    memcpy(p + 2, d->topic, d->tlen);
    p += 2 + d->tlen;
    p += put_vbi(p, props);
    const uint8_t *pr = f->props;
    memcpy(p, pr, f->from_len + f->sent_len);
    p += f->from_len + f->sent_len;
    pr += f->from_len + f->sent_len;
    put_be(p, slen, 2);
    memcpy(p + 2, sent, slen);
    p += 2 + slen;
    if (batch) {
        memcpy(p, pr, f->batch_len);
        p += f->batch_len;
    }
    pr += f->batch_len;
    if (f->keyed) {
        static const char hex[] = "0123456789abcdef";
        const hmac_key_t *key = f->key;
        sha256_t s = key->inner;
        uint8_t mac[SHA256_SIZE];
        sha256_update(&s, d->topic, d->tlen);
        sha256_update(&s, "", 1);
        sha256_update(&s, head, hl);
        sha256_update(&s, "", 1);
        sha256_update(&s, payload, plen);
        hmac_final(key, &s, mac);
        f->sign_seq++;
        memcpy(p, pr, f->mac_len);
        p += f->mac_len;
        put_be(p, siglen, 2);
        memcpy(p + 2, head, hl);
        p += 2 + hl;
        *p++ = ':';
        for (int i = 0; i < SHA256_SIZE; i++) {
            *p++ = (uint8_t)hex[mac[i] >> 4];
            *p++ = (uint8_t)hex[mac[i] & 15];
        }
    }
    memcpy(p, payload, plen);
    return 0;
}

/* ``d``'s batch as messages, as Batches.take cuts it: a payload alone, or an envelope of
 * several within ``limit`` (checked against the broker's limit, as Python checks one). */
static void publish_dst(fed_t *f, fdst_t *d, const char *sent, size_t slen) {
    size_t pos = 0;
    uint32_t j = 0;
    while (pos < d->len) {
        size_t start = pos, size = 0;
        uint32_t items = 0;
        uint64_t frames = 0;
        while (pos < d->len) {
            size_t n = (size_t)be32(d->buf + pos) + 4;
            if (items && size + n > f->limit) break;
            pos += n;
            size += n;
            items++;
            frames += d->counts[j++];
        }
        int ok;
        if (items == 1) {
            ok = publish(f, d, d->buf + start + 4, size - 4, 0, sent, slen) == 0;
        } else if (f->max_packet && size + d->bound > f->max_packet) {
            f->oversized++;
            ok = 0;
        } else {
            ok = publish(f, d, d->buf + start, size, 1, sent, slen) == 0;
        }
        if (ok) {
            d->messages++;
            d->payloads += items;
            d->frames += frames;
        } else {
            d->lost += items;
            d->lost_frames += frames;
        }
    }
}

void fed_flush(Relay *r) {
    fed_t *f = &r->fed;
    if (!f->nround) return;
    char sent[24];
    int k = snprintf(sent, sizeof sent, "%lld", (long long)wall_ms());
    size_t slen = k > 0 ? (size_t)k : 0;
    int usable = fed_usable(r);
    for (uint32_t i = 0; i < f->nround; i++) {
        fdst_t *d = &f->dsts[f->round[i]];
        if (usable) {
            publish_dst(f, d, sent, slen);
        } else { /* the link broke during the round */
            d->lost += d->npay;
            for (uint32_t j = 0; j < d->npay; j++) d->lost_frames += d->counts[j];
        }
        d->len = 0;
        d->npay = 0;
        d->queued = 0;
        if (d->cap > OUT_KEEP) {
            free(d->buf);
            d->buf = NULL;
            d->cap = 0;
        }
    }
    f->nround = 0;
    f->round_bytes = 0;
    if (usable) out_push(r);
}

/* Routes with fed targets learned before now are Python's again (Python learns them anew). */
void bump(Relay *r) {
    r->fed.gen++;
    r->ginv++;
}

void stop_routing(Relay *r) {
    fed_t *f = &r->fed;
    fed_flush(r); /* what this round routed is written (or counted lost) first */
    f->routing = 0;
    bump(r);
}

void fed_free(Relay *r) {
    fed_t *f = &r->fed;
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
    free(f->out);
    free(f->key);
    free(f->props);
    for (uint32_t i = 0; i < f->ndst; i++) {
        free(f->dsts[i].topic);
        free(f->dsts[i].buf);
        free(f->dsts[i].counts);
    }
    free(f->dsts);
    free(f->round);
}
