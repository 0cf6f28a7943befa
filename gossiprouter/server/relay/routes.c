/*
 * The learned routes of each connection (relay.h, "Decisions"): a table per connection, up to
 * MAX_ROUTES, keyed by the exact header bytes Python learned. Each route remembers its group's
 * invalidation slot and that slot's generation; invalidate() bumps a slot's generation (or the
 * epoch, for every route), and a connection's reads drop what went stale. Mutex held throughout.
 */
#include "routes.h"

#include <stdlib.h>
#include <string.h>

void free_targets(ftarget_t *fed, int n) {
    if (fed == NULL) return;
    for (int i = 0; i < n; i++) free(fed[i].prefix);
    free(fed);
}

static void free_route(route_t *rt) {
    free(rt->key);
    free(rt->out);
    free(rt->dests);
    free_targets(rt->fed, rt->nfed);
}

void free_routes(conn_t *c) {
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

/* Drop the routes a change of their group made stale (the last one moves into their place). */
void prune(Relay *r, conn_t *c) {
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

/* Before a read of ``c`` is relayed: forget what an invalidate() since its last read made
 * stale (every route after invalidate(), those of the changed groups after invalidate(slot)). */
void forget_stale(Relay *r, conn_t *c) {
    if (c->epoch != r->epoch) {
        free_routes(c);
        c->epoch = r->epoch;
    } else if (c->ginv != r->ginv && c->nroutes) {
        prune(r, c); /* a group changed: its routes (and an emptied table) go now */
    }
    c->ginv = r->ginv;
}

route_t *match(Relay *r, conn_t *c, const uint8_t *p, size_t avail) {
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
int starts_route(Relay *r, conn_t *c, const uint8_t *p, size_t avail) {
    for (int i = 0; i < c->nroutes; i++)
        if (avail < c->routes[i].klen && route_valid(r, &c->routes[i]) &&
            memcmp(p, c->routes[i].key, avail) == 0)
            return 1;
    return 0;
}

/* learn(): the decision ``want`` for the frames of ``cid`` (its key and out are Python's
 * buffers, copied here; its dests and fed targets, allocated by the caller, are taken:
 * want->dests and want->fed are NULL then; fed targets only while the broker link routes). 1: learned; 0: it cannot be repeated now (a connection unknown or lost, a receiver
 * not attached or evicting, or no memory: Python routes these frames). ``*dup``: a connection
 * is twice among the dests. */
int learn(Relay *r, int64_t cid, route_t *want, int *dup) {
    conn_t *c = get_conn(r, cid);
    int ok = c != NULL && !c->lost;
    int nd = want->ndest, marked = 0;
    *dup = 0;
    for (; ok && marked < nd; marked++) {
        conn_t *d = get_conn(r, want->dests[marked]);
        ok = d != NULL && d->attached && !d->evicting;
        if (ok && d->mark) { /* one frame would go twice to one socket */
            *dup = 1;
            ok = 0;
        }
        if (ok) d->mark = 1;
    }
    for (int i = 0; i < marked; i++) {
        conn_t *d = get_conn(r, want->dests[i]);
        if (d != NULL) d->mark = 0;
    }
    if (!ok) return 0;
    if (want->nfed && !r->fed.routing) {
        free_targets(want->fed, want->nfed); /* the link stopped meanwhile: Python's share */
        want->fed = NULL;
        want->nfed = 0;
    }
    if (c->epoch != r->epoch) {
        free_routes(c);
        c->epoch = r->epoch;
    }
    /* A header already learned (e.g. learned again after a miss on its frame's shape). */
    for (int i = 0; i < c->nroutes; i++) {
        if (c->routes[i].klen == want->klen &&
            memcmp(c->routes[i].key, want->key, want->klen) == 0) {
            free_route(&c->routes[i]);
            c->routes[i] = c->routes[--c->nroutes];
            break;
        }
    }
    if (c->nroutes == MAX_ROUTES) prune(r, c);
    if (c->nroutes == MAX_ROUTES) free_routes(c);
    routes_room(c);
    route_t *rt = c->routes ? &c->routes[c->nroutes] : NULL;
    if (rt != NULL) {
        rt->key = malloc(want->klen);
        rt->out = malloc(want->olen ? want->olen : 1);
    }
    if (rt == NULL || rt->key == NULL || rt->out == NULL) {
        if (rt != NULL) {
            free(rt->key);
            free(rt->out);
        }
        return 0; /* not learned: Python routes these frames */
    }
    memcpy(rt->key, want->key, want->klen);
    if (want->olen) memcpy(rt->out, want->out, want->olen);
    rt->klen = want->klen;
    rt->olen = want->olen;
    rt->skip = want->skip;
    rt->max_frame = want->max_frame;
    rt->ndest = nd;
    rt->dests = want->dests;
    rt->slot = want->slot;
    rt->gen = r->ggen[want->slot];
    rt->remote = want->remote;
    rt->nfed = want->nfed;
    rt->fed = want->fed;
    rt->fgen = want->nfed ? r->fed.gen : 0;
    want->dests = NULL;
    want->fed = NULL;
    want->nfed = 0;
    c->last_hit = c->nroutes;
    c->nroutes++;
    return 1;
}

/* invalidate(slot): forget the decisions of a group slot (-1: every decision). Nothing is
 * freed here: each connection's next read (forget_stale) or lookup (match) drops its own. */
void invalidate(Relay *r, long long slot) {
    if (slot < 0) r->epoch++;
    else r->ggen[slot]++;
    r->ginv++;
    r->invalidations++;
}

/* The routes of ``c`` still valid (info()). */
size_t live_routes(Relay *r, const conn_t *c) {
    size_t n = 0;
    if (c->epoch == r->epoch)
        for (int k = 0; k < c->nroutes; k++) n += (size_t)route_valid(r, &c->routes[k]);
    return n;
}
