/*
 * The learned routes of each connection (routes.c): Python's decisions, which frames from a
 * connection go where, each valid until a change of its group (invalidate).
 */
#ifndef GOSSIPROUTER_RELAY_ROUTES_H
#define GOSSIPROUTER_RELAY_ROUTES_H

#include "relay.h"

#define MAX_ROUTES 64

/* A route is used only while no change of its group (or of everything) came after it. */
/* A route with fed targets also only while the broker link is as it was (broker.c). */
static inline int route_valid(Relay *r, const route_t *rt) {
    return rt->gen == r->ggen[rt->slot] && (rt->nfed == 0 || rt->fgen == r->fed.gen);
}

RELAY_INTERNAL void free_routes(conn_t *c);
RELAY_INTERNAL void free_targets(ftarget_t *fed, int n);
RELAY_INTERNAL void forget_stale(Relay *r, conn_t *c);
RELAY_INTERNAL void prune(Relay *r, conn_t *c);
RELAY_INTERNAL route_t *match(Relay *r, conn_t *c, const uint8_t *p, size_t avail);
RELAY_INTERNAL int starts_route(Relay *r, conn_t *c, const uint8_t *p, size_t avail);
RELAY_INTERNAL int learn(Relay *r, int64_t cid, route_t *want, int *dup);
RELAY_INTERNAL void invalidate(Relay *r, long long slot);
RELAY_INTERNAL size_t live_routes(Relay *r, const conn_t *c);

#endif
