/*
 * Routed messages read from the federation broker by the relay thread (inbound.h;
 * docs/federation.md, "The routed path on the relay thread").
 *
 * The broker connection is a connection of kind MQTT: the thread reads it, and each whole QoS 0
 * PUBLISH on another router's route topic to this one is checked here as the receiving side's
 * Python checks it (peers.py Peers._on_federation and _on_path, signing.Verifier, batch.py,
 * codec.decode_route, frames.check_routed, state.Federation.on_route), and delivered to the
 * local receivers Python taught for it: the payloads writer W sends for (group, member) whose
 * frames start with a learned header, a native ROUTE's or a 5.x MESSAGE's (so: of that group,
 * to that member, from a sender W carries, as Python found when it delivered the first of
 * them). Everything else (a heartbeat,
 * a record, a header not learned, a receiver not attached, a handed-on message, a property or
 * a form this file does not read) goes to Python as it came, with the rest of the read, and
 * the thread reads the connection again only when Python says so: Python sees the stream in
 * order. A message is either delivered whole here or handed to Python untouched: every payload
 * of an envelope is checked before the first one is delivered.
 *
 * With the federation key, the signature is checked here (HMAC-SHA256 over the topic, the
 * head and the payload) and so are replays: the last sequence number of each run of another
 * router's route messages is kept here, and Python's Verifier reads and raises it
 * (link_floor, link_seen), so a message accepted by either is refused by both after. A
 * message whose clock is more than 60 s off, or unsigned, goes to Python, which refuses it.
 * Everything here runs with the mutex held.
 */
#include "inbound.h"

#include "conns.h"
#include "framing.h"
#include "loop.h"
#include "sha256.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_RUNS 4096      /* runs of other routers remembered (signing.MAX_RUNS) */
#define MAX_INROUTES 65536 /* learned inbound routes, router-wide */
#define MAX_SKEW_MS 60000  /* signing.MAX_SKEW */
#define NAME_FROM 0
#define NAME_SENT 1
#define NAME_BATCH 2
#define NAME_MAC 3
#define NAME_BEAT 4


/* ------------------------------------------------------------------ learned routes */

static uint64_t hash_gd(uint32_t writer, const uint8_t *gd, size_t n) {
    uint64_t h = 1469598103934665603ULL ^ writer;
    for (size_t i = 0; i < n; i++) h = (h ^ gd[i]) * 1099511628211ULL;
    return h;
}

static void free_inroute(inroute_t *x) {
    free(x->gd);
    free(x->key);
    free(x->dests);
    free(x);
}

static int in_valid(const Relay *r, const inroute_t *x) {
    return x->gen == r->ggen[x->slot] && x->fgen == r->fed.gen;
}

/* The learned route of frames ``fr`` (the payload's, ``n`` bytes) writer ``w`` sent for ``gd``;
 * the stale ones met on the way are dropped. */
static inroute_t *in_match(Relay *r, uint32_t w, const uint8_t *gd, size_t gdlen,
                           const uint8_t *fr, size_t n) {
    fed_t *f = &r->fed;
    inroute_t **pp = &f->ib[hash_gd(w, gd, gdlen) % IN_BUCKETS];
    while (*pp != NULL) {
        inroute_t *x = *pp;
        if (!in_valid(r, x)) {
            *pp = x->next;
            free_inroute(x);
            f->ninroutes--;
            continue;
        }
        if (x->writer == w && x->gdlen == gdlen && memcmp(x->gd, gd, gdlen) == 0 &&
            n >= 4 + (size_t)x->klen && memcmp(fr + 4, x->key, x->klen) == 0)
            return x;
        pp = &x->next;
    }
    return NULL;
}

/* Whole frames of ``x``'s header (native, or 5.x), ``count`` of them and nothing after, each
 * within its max_frame (frames.check_routed, as the fast path checks a client's frames:
 * framing.c). */
static int frames_ok(const inroute_t *x, const uint8_t *p, size_t n, uint64_t count) {
    size_t pos = 0, need = x->kind == JG5 ? 4 : 1; /* the payload's own header, at least */
    uint64_t k = 0;
    while (pos < n) {
        if (n - pos < 4) return 0;
        size_t len = be32(p + pos);
        if (len >= 0x80000000u || len > x->max_frame || len > n - pos - 4) return 0;
        size_t q = 4 + (size_t)x->klen;
        if (q + need > 4 + len || memcmp(p + pos + 4, x->key, x->klen) != 0) return 0;
        if (!payload_ends_frame(x->kind, p + pos, q, 4 + len)) return 0;
        pos += 4 + len;
        k++;
    }
    return k == count;
}

/* ------------------------------------------------------------------ reading a message */

/* msgpack: a str (its whole encoding's length in *n), an unsigned int. 0: not that. */
static int mp_str(const uint8_t *h, const uint8_t *e, size_t *n) {
    if (h >= e) return 0;
    size_t len, head;
    if ((*h & 0xe0) == 0xa0) len = *h & 31, head = 1;
    else if (*h == 0xd9 && e - h >= 2) len = h[1], head = 2;
    else if (*h == 0xda && e - h >= 3) len = be16(h + 1), head = 3;
    else return 0;
    if ((size_t)(e - h) < head + len) return 0;
    *n = head + len;
    return 1;
}

static int mp_uint(const uint8_t **hp, const uint8_t *e, uint64_t *v) {
    const uint8_t *h = *hp;
    if (h >= e) return 0;
    int n = *h < 0x80 ? 0 : *h == 0xcc ? 1 : *h == 0xcd ? 2 : *h == 0xce ? 4 : *h == 0xcf ? 8 : -1;
    if (n < 0 || e - h < 1 + n) return 0;
    uint64_t x = n ? 0 : *h;
    for (int i = 0; i < n; i++) x = x << 8 | h[1 + i];
    *v = x;
    *hp = h + 1 + n;
    return 1;
}

typedef struct {
    const uint8_t *gd, *frames;
    size_t gdlen, flen;
    uint64_t count;
} item_t;

/* One route payload (codec.encode_route) of writer ``w``: the 6-element header of a message
 * routed first by ``w`` (handed-on ones are Python's), its origin ``w``'s. */
static int parse_item(const fwriter_t *w, const uint8_t *p, size_t n, item_t *it) {
    if (n < 3) return 0;
    size_t hl = be16(p);
    if (hl < 1 || 2 + hl > n) return 0;
    const uint8_t *h = p + 2, *e = h + hl;
    if (*h++ != 0x96) return 0;
    if ((size_t)(e - h) < w->olen || memcmp(h, w->origin, w->olen) != 0) return 0;
    h += w->olen;
    const uint8_t *gd = h;
    size_t sl;
    if (!mp_str(h, e, &sl)) return 0;
    h += sl;
    if (h < e && *h == 0xc0) h++;
    else if (h + 1 < e && *h == 0xc4 && (size_t)(e - h) >= 2 + (size_t)h[1]) h += 2 + h[1];
    else return 0;
    it->gd = gd;
    it->gdlen = (size_t)(h - gd);
    uint64_t seq;
    if (!mp_uint(&h, e, &it->count) || it->count == 0 || it->count > 0x7fffffff) return 0;
    if (h >= e || *h++ != 0xc2) return 0; /* handed: false */
    if (!mp_uint(&h, e, &seq) || h != e) return 0;
    it->frames = e;
    it->flen = n - 2 - hl;
    return 1;
}

/* The next payload of the message: the whole of it, or an envelope's next (batch.py). */
static int next_item(int batch, const uint8_t **pp, const uint8_t *end, const uint8_t **item,
                     size_t *n) {
    const uint8_t *p = *pp;
    if (p >= end) return 0;
    if (!batch) {
        *item = p;
        *n = (size_t)(end - p);
        *pp = end;
        return 1;
    }
    if (end - p < 4) return -1;
    size_t len = be32(p);
    if (len == 0 || len > (size_t)(end - p - 4)) return -1;
    *item = p + 4;
    *n = len;
    *pp = p + 4 + len;
    return 1;
}

static int name_id(const fed_t *f, const uint8_t *k, size_t n) {
    for (int i = 0; i < 5; i++)
        if (f->nlen[i] == n && memcmp(f->names[i], k, n) == 0) return i;
    return -1;
}

/* Printable ASCII only (anything else, valid UTF-8 or not, Python reads and judges). */
static int plain(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] < 0x20 || p[i] > 0x7e) return 0;
    return 1;
}

static int digits(const uint8_t *p, size_t n, uint64_t *v) {
    if (n == 0 || n > 19) return 0;
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') return 0;
        x = x * 10 + (uint64_t)(p[i] - '0');
    }
    *v = x;
    return 1;
}

static frun_t *find_run(fed_t *f, const uint8_t *run, size_t n) {
    for (uint32_t i = 0; i < f->nruns; i++) {
        frun_t *x = &f->runs[(f->runpos + f->nruns - 1 - i) % MAX_RUNS]; /* newest first */
        if (x->len == n && memcmp(x->run, run, n) == 0) return x;
    }
    return NULL;
}

/* The run's last sequence number is at least ``seq`` (a new run replaces the oldest). */
void run_seen(fed_t *f, const uint8_t *run, size_t n, uint64_t seq) {
    if (n == 0 || n >= sizeof f->runs[0].run) return;
    frun_t *x = find_run(f, run, n);
    if (x == NULL) {
        if (f->runs == NULL) f->runs = calloc(MAX_RUNS, sizeof(frun_t));
        if (f->runs == NULL) return;
        if (f->nruns < MAX_RUNS) {
            x = &f->runs[(f->runpos + f->nruns++) % MAX_RUNS];
        } else {
            x = &f->runs[f->runpos];
            f->runpos = (f->runpos + 1) % MAX_RUNS;
        }
        memcpy(x->run, run, n);
        x->len = n;
        x->last = 0;
    }
    if (seq > x->last) x->last = seq;
}

uint64_t run_floor(fed_t *f, const uint8_t *run, size_t n) {
    frun_t *x = find_run(f, run, n);
    return x == NULL ? 0 : x->last;
}

/* The signature ``v`` (``run:seq:ts:mac``) of the message: 1 and its run and seq when it is
 * this federation's and current; 0 otherwise (Python judges it, and refuses it). */
static int signed_ok(const fed_t *f, const fwriter_t *w, const uint8_t *v, size_t vn,
                     const uint8_t *payload, size_t pn, const uint8_t **run, size_t *rn,
                     uint64_t *seq) {
    const uint8_t *c[3];
    int k = 0;
    for (size_t i = 0; i < vn && k < 3; i++)
        if (v[i] == ':') c[k++] = v + i;
    if (k < 3 || memchr(c[2] + 1, ':', (size_t)(v + vn - c[2] - 1)) != NULL) return 0;
    uint64_t ts;
    *run = v;
    *rn = (size_t)(c[0] - v);
    if (!digits(c[0] + 1, (size_t)(c[1] - c[0] - 1), seq) ||
        !digits(c[1] + 1, (size_t)(c[2] - c[1] - 1), &ts) || v + vn - c[2] - 1 != 64)
        return 0;
    const hmac_key_t *key = f->key;
    sha256_t s = key->inner;
    uint8_t mac[SHA256_SIZE];
    sha256_update(&s, w->topic, w->tlen);
    sha256_update(&s, "", 1);
    sha256_update(&s, v, (size_t)(c[2] - v));
    sha256_update(&s, "", 1);
    sha256_update(&s, payload, pn);
    hmac_final(key, &s, mac);
    static const char hex[] = "0123456789abcdef";
    uint8_t diff = 0;
    for (int i = 0; i < SHA256_SIZE; i++)
        diff |= (uint8_t)(c[2][1 + 2 * i] ^ hex[mac[i] >> 4]) |
                (uint8_t)(c[2][2 + 2 * i] ^ hex[mac[i] & 15]);
    if (diff) return 0;
    int64_t skew = wall_ms() - (int64_t)ts;
    return skew <= MAX_SKEW_MS && skew >= -MAX_SKEW_MS;
}

int inbound(Relay *r, const uint8_t *p, size_t n) {
    fed_t *f = &r->fed;
    if (!f->inbound || !f->routing || n < 2) return 0;
    size_t tl = be16(p);
    if (2 + tl > n) return 0;
    uint32_t wi = 0;
    fwriter_t *w = NULL;
    for (; wi < f->nwriter; wi++)
        if (f->writers[wi].tlen == tl && memcmp(f->writers[wi].topic, p + 2, tl) == 0) {
            w = &f->writers[wi];
            break;
        }
    if (w == NULL) return 0;
    /* The properties: user properties only (the route topic's; any other: Python's). */
    size_t pos = 2 + tl, plen = 0, vb = 0;
    int done = 0;
    while (vb < 4 && pos + vb < n) {
        uint8_t b = p[pos + vb];
        plen |= (size_t)(b & 127) << (7 * vb);
        vb++;
        if (!(b & 128)) {
            done = 1;
            break;
        }
    }
    if (!done || pos + vb + plen > n) return 0;
    const uint8_t *q = p + pos + vb, *pend = q + plen, *payload = pend;
    size_t pn = n - pos - vb - plen;
    const uint8_t *sent = NULL, *mac = NULL;
    size_t sentn = 0, macn = 0;
    int from = 0, batch = 0;
    while (q < pend) {
        if (*q++ != 0x26 || pend - q < 2) return 0;
        size_t kn = be16(q);
        if ((size_t)(pend - q) < 2 + kn + 2) return 0;
        const uint8_t *k = q + 2;
        size_t vn = be16(k + kn);
        if ((size_t)(pend - k - kn - 2) < vn) return 0;
        const uint8_t *v = k + kn + 2;
        if (!plain(k, kn) || !plain(v, vn)) return 0;
        q = v + vn;
        switch (name_id(f, k, kn)) {
        case NAME_FROM: from = 1; break;
        case NAME_SENT: sent = v, sentn = vn; break;
        case NAME_BATCH: batch = 1; break;
        case NAME_MAC: mac = v, macn = vn; break;
        case NAME_BEAT: return 0; /* a heartbeat */
        default: break;
        }
    }
    uint64_t sent_ms, seq = 0;
    if (!from || sent == NULL || !digits(sent, sentn, &sent_ms)) return 0;
    const uint8_t *run = NULL;
    size_t rn = 0;
    if (f->keyed && (mac == NULL || !signed_ok(f, w, mac, macn, payload, pn, &run, &rn, &seq) ||
                     rn == 0 || rn >= sizeof f->runs[0].run))
        return 0;
    /* Every payload checked, and every receiver writable, before the first is delivered. */
    const uint8_t *at = payload, *end = payload + pn, *ip;
    size_t in, fan = 0;
    int items = 0, got;
    while ((got = next_item(batch, &at, end, &ip, &in)) > 0) {
        item_t it;
        inroute_t *x;
        if (!parse_item(w, ip, in, &it) ||
            (x = in_match(r, wi, it.gd, it.gdlen, it.frames, it.flen)) == NULL ||
            !frames_ok(x, it.frames, it.flen, it.count))
            return 0;
        for (int i = 0; i < x->ndest; i++) {
            conn_t *d = get_conn(r, x->dests[i]);
            if (d == NULL || !d->attached || d->evicting) return 0;
        }
        fan += (size_t)x->ndest * it.flen;
        items++;
    }
    if (got < 0 || items == 0 || (batch && items < 2)) return 0;
    if (r->held_partial + r->held_pending + r->staged + fan > r->max_bytes) {
        r->over_cap++;
        return 0;
    }
    if (f->keyed) {
        /* The writer's run is found at once where it was last (else searched, newest first). */
        frun_t *x = f->runs != NULL && w->run_at < MAX_RUNS ? &f->runs[w->run_at] : NULL;
        if (x == NULL || x->len != rn || memcmp(x->run, run, rn) != 0) x = find_run(f, run, rn);
        if (x != NULL && seq <= x->last) { /* a replay: Python could not tell it now */
            f->unauthenticated++;
            return 1;
        }
        if (x != NULL) x->last = seq;
        else run_seen(f, run, rn, seq);
        x = x != NULL ? x : find_run(f, run, rn);
        if (x != NULL) w->run_at = (uint32_t)(x - f->runs);
    }
    if (w->age_ms > 0 && wall_ms() - (int64_t)sent_ms > w->age_ms) {
        w->expired++; /* (Peers._on_path: Liveness.too_old) */
        return 1;
    }
    w->messages++;
    w->payloads += (uint64_t)items;
    at = payload;
    while (next_item(batch, &at, end, &ip, &in) > 0) {
        item_t it;
        parse_item(w, ip, in, &it);
        inroute_t *x = in_match(r, wi, it.gd, it.gdlen, it.frames, it.flen);
        for (int i = 0; i < x->ndest; i++) /* (counted as Python counts them: delivered_in) */
            deliver(r, get_conn(r, x->dests[i]), x->dests[i], NULL, 0, it.frames, it.flen);
        w->frames += it.count;
        w->delivered += it.count * (uint64_t)x->ndest;
    }
    return 1;
}

/* ------------------------------------------------------------------ learning */

int learn_in(Relay *r, inroute_t *want) {
    fed_t *f = &r->fed;
    if (!f->routing || want->writer >= f->nwriter) return 0;
    for (int i = 0; i < want->ndest; i++) {
        conn_t *d = get_conn(r, want->dests[i]);
        if (d == NULL || !d->attached || d->evicting) return 0;
        for (int j = 0; j < i; j++)
            if (want->dests[j] == want->dests[i]) return 0;
    }
    inroute_t **pp = &f->ib[hash_gd(want->writer, want->gd, want->gdlen) % IN_BUCKETS];
    while (*pp != NULL) { /* the same route learned before, and stale ones, go */
        inroute_t *x = *pp;
        if (!in_valid(r, x) || (x->writer == want->writer && x->gdlen == want->gdlen &&
                                x->klen == want->klen &&
                                memcmp(x->gd, want->gd, want->gdlen) == 0 &&
                                memcmp(x->key, want->key, want->klen) == 0)) {
            *pp = x->next;
            free_inroute(x);
            f->ninroutes--;
            continue;
        }
        pp = &x->next;
    }
    if (f->ninroutes >= MAX_INROUTES) return 0;
    inroute_t *x = malloc(sizeof *x);
    if (x == NULL) return 0;
    *x = *want;
    x->gen = r->ggen[want->slot];
    x->fgen = f->gen;
    x->next = f->ib[hash_gd(want->writer, want->gd, want->gdlen) % IN_BUCKETS];
    f->ib[hash_gd(want->writer, want->gd, want->gdlen) % IN_BUCKETS] = x;
    f->ninroutes++;
    want->gd = want->key = NULL;
    want->dests = NULL;
    return 1;
}

void inbound_free(Relay *r) {
    fed_t *f = &r->fed;
    for (int b = 0; b < IN_BUCKETS; b++) {
        while (f->ib[b] != NULL) {
            inroute_t *x = f->ib[b];
            f->ib[b] = x->next;
            free_inroute(x);
        }
    }
    f->ninroutes = 0;
    for (uint32_t i = 0; i < f->nwriter; i++) {
        free(f->writers[i].topic);
        free(f->writers[i].origin);
    }
    free(f->writers);
    free(f->runs);
}

/* ------------------------------------------------------------------ Python's methods */

/* link_inbound(names): the user properties' names, in order: from, sent, batch, mac, beat. */
PyObject *Relay_link_inbound(Relay *self, PyObject *args) {
    const char *n[5];
    Py_ssize_t len[5];
    if (!PyArg_ParseTuple(args, "(s#s#s#s#s#)", &n[0], &len[0], &n[1], &len[1], &n[2], &len[2],
                          &n[3], &len[3], &n[4], &len[4]))
        return NULL;
    for (int i = 0; i < 5; i++)
        if (len[i] < 1 || len[i] >= (Py_ssize_t)sizeof self->fed.names[0]) {
            PyErr_SetString(PyExc_ValueError, "link_inbound: names of 1 to 39 characters");
            return NULL;
        }
    py_lock(self);
    for (int i = 0; i < 5; i++) {
        memcpy(self->fed.names[i], n[i], (size_t)len[i]);
        self->fed.nlen[i] = (size_t)len[i];
    }
    self->fed.inbound = 1;
    pthread_mutex_unlock(&self->mu);
    Py_RETURN_NONE;
}

/* link_writer(topic, origin, age_ms) -> int: another router the thread reads routed messages
 * from (its route topic to this router, its origin as a header has it: a msgpack str, and the
 * age beyond which its frames are dropped, 0: none); the same index for the same topic, its
 * age updated. -1: too many. */
PyObject *Relay_link_writer(Relay *self, PyObject *args) {
    Py_buffer topic, origin;
    long long age;
    if (!PyArg_ParseTuple(args, "y*y*L", &topic, &origin, &age)) return NULL;
    long idx = -1;
    uint8_t *t = NULL, *o = NULL;
    if (topic.len < 1 || topic.len > 65535 || origin.len < 1 || origin.len > 65535) {
        PyBuffer_Release(&topic);
        PyBuffer_Release(&origin);
        PyErr_SetString(PyExc_ValueError, "link_writer: a topic and an origin of 1 to 65535 bytes");
        return NULL;
    }
    py_lock(self);
    fed_t *f = &self->fed;
    for (uint32_t i = 0; i < f->nwriter && idx < 0; i++)
        if (f->writers[i].tlen == (uint32_t)topic.len &&
            memcmp(f->writers[i].topic, topic.buf, (size_t)topic.len) == 0) {
            f->writers[i].age_ms = age > 0 ? age : 0;
            idx = (long)i;
        }
    if (idx < 0 && f->nwriter < 4096) {
        fwriter_t *p = grow(f->writers, &f->capwriter, f->nwriter, sizeof *f->writers);
        if (p != NULL) f->writers = p;
        t = malloc((size_t)topic.len);
        o = malloc((size_t)origin.len);
        if (f->nwriter < f->capwriter && t != NULL && o != NULL) {
            fwriter_t *w = &f->writers[f->nwriter];
            memset(w, 0, sizeof *w);
            memcpy(t, topic.buf, (size_t)topic.len);
            memcpy(o, origin.buf, (size_t)origin.len);
            w->topic = t;
            w->tlen = (uint32_t)topic.len;
            w->origin = o;
            w->olen = (uint32_t)origin.len;
            w->age_ms = age > 0 ? age : 0;
            t = o = NULL;
            idx = (long)f->nwriter++;
        }
    }
    pthread_mutex_unlock(&self->mu);
    free(t);
    free(o);
    PyBuffer_Release(&topic);
    PyBuffer_Release(&origin);
    return PyLong_FromLong(idx);
}

/* link_learn_in(writer, gd, key, max_frame, dests, slot, kind=NATIVE) -> bool: the payloads
 * ``writer`` sends for ``gd`` whose frames (of framing ``kind``: NATIVE or JG5) start with
 * ``key`` go to ``dests`` (connection ids, attached), until group slot ``slot`` or the link
 * changes. */
PyObject *Relay_link_learn_in(Relay *self, PyObject *args) {
    unsigned int writer;
    Py_buffer gd, key;
    Py_ssize_t max_frame;
    PyObject *dests;
    long long slot;
    int kind = NATIVE;
    if (!PyArg_ParseTuple(args, "Iy*y*nOL|i", &writer, &gd, &key, &max_frame, &dests, &slot,
                          &kind))
        return NULL;
    inroute_t want = {0};
    const char *bad = NULL;
    if (gd.len < 2 || gd.len > 65535 || key.len < 1 || key.len > MAX_HOLD)
        bad = "link_learn_in: gd of 2 to 65535 bytes, key of 1 to MAX_HOLD";
    else if (max_frame < 1 || slot < 0 || slot >= GROUP_SLOTS)
        bad = "link_learn_in: max_frame > 0, slot 0 to GROUP_SLOTS - 1";
    else if (kind != NATIVE && kind != JG5)
        bad = "link_learn_in: kind NATIVE or JG5";
    if (bad != NULL) {
        PyErr_SetString(PyExc_ValueError, bad);
        goto fail;
    }
    Py_ssize_t nd;
    want.dests = read_cids(dests, 1, &nd, "link_learn_in");
    if (want.dests == NULL) goto fail;
    want.gd = malloc((size_t)gd.len);
    want.key = malloc((size_t)key.len);
    if (want.gd == NULL || want.key == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    memcpy(want.gd, gd.buf, (size_t)gd.len);
    memcpy(want.key, key.buf, (size_t)key.len);
    want.writer = writer;
    want.gdlen = (uint32_t)gd.len;
    want.klen = (uint32_t)key.len;
    want.max_frame = max_frame > 0x7fffffff ? 0x7fffffff : (uint32_t)max_frame;
    want.slot = (uint32_t)slot;
    want.kind = kind;
    want.ndest = (int)nd;
    py_lock(self);
    int ok = learn_in(self, &want);
    pthread_mutex_unlock(&self->mu);
    free(want.dests); /* (NULL when learned) */
    free(want.gd);
    free(want.key);
    PyBuffer_Release(&gd);
    PyBuffer_Release(&key);
    return PyBool_FromLong(ok);
fail:
    free(want.dests);
    free(want.gd);
    free(want.key);
    PyBuffer_Release(&gd);
    PyBuffer_Release(&key);
    return NULL;
}

/* link_seen(run, seq): Python accepted route message ``seq`` of ``run`` (signing.Verifier). */
PyObject *Relay_link_seen(Relay *self, PyObject *args) {
    const char *run;
    Py_ssize_t n;
    unsigned long long seq;
    if (!PyArg_ParseTuple(args, "s#K", &run, &n, &seq)) return NULL;
    py_lock(self);
    run_seen(&self->fed, (const uint8_t *)run, (size_t)n, seq);
    pthread_mutex_unlock(&self->mu);
    Py_RETURN_NONE;
}

/* link_floor(run) -> int: the last route message of ``run`` accepted (0: none known). */
PyObject *Relay_link_floor(Relay *self, PyObject *args) {
    const char *run;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "s#", &run, &n)) return NULL;
    py_lock(self);
    uint64_t last = run_floor(&self->fed, (const uint8_t *)run, (size_t)n);
    pthread_mutex_unlock(&self->mu);
    return PyLong_FromUnsignedLongLong(last);
}
