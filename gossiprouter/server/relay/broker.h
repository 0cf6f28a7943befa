/*
 * The federation broker's connection on the relay thread (broker.c): the remote share of a
 * learned route published by the thread itself, batched per destination router, and every
 * byte written to the broker, Python's (paho's) included, in one ordered stream.
 */
#ifndef GOSSIPROUTER_RELAY_BROKER_H
#define GOSSIPROUTER_RELAY_BROKER_H

#include "relay.h"

/* The epoll data of the broker socket's EPOLLOUT registration (connections are >= 0, the stop
 * fd is -1). */
#define FED_EVENT ((uint64_t)-2)

/* The thread may publish the remote share of a route with fed targets now. */
static inline int fed_usable(const Relay *r) {
    return r->fed.routing && !r->fed.broken && r->fed.fd >= 0;
}

/* A frame of route ``rt`` (with fed targets) at ``p``: published with the frames of the same
 * route that follow it in the read (one route payload; what is beyond the link's bounds is
 * dropped and counted when the payload is made, as Python drops it). */
RELAY_INTERNAL void fed_frame(Relay *r, route_t *rt, const uint8_t *p, size_t n);
/* The read's frames are all seen: the run of frames pending becomes a route payload. */
RELAY_INTERNAL void fed_end_read(Relay *r);
/* Publish what this round routed to other routers (one message per router, more beyond the
 * broker's limit), before Python may write (a hand-over, a signal) and at the round's end. */
RELAY_INTERNAL void fed_flush(Relay *r);
/* The broker socket takes bytes again (EPOLLOUT). */
RELAY_INTERNAL void fed_writable(Relay *r);
RELAY_INTERNAL void fed_free(Relay *r);

/* For link.c (Python's methods on the link): the byte stream and the link's state. */
RELAY_INTERNAL void disarm(Relay *r);
RELAY_INTERNAL void out_drop(fed_t *f);
RELAY_INTERNAL void fail(Relay *r, int err);
RELAY_INTERNAL void out_push(Relay *r);
RELAY_INTERNAL uint8_t *out_room(fed_t *f, size_t n);
RELAY_INTERNAL void bump(Relay *r);
RELAY_INTERNAL void stop_routing(Relay *r);

RELAY_INTERNAL PyObject *Relay_link_open(Relay *self, PyObject *args);
RELAY_INTERNAL PyObject *Relay_link_enable(Relay *self, PyObject *args);
RELAY_INTERNAL PyObject *Relay_link_disable(Relay *self, PyObject *unused);
RELAY_INTERNAL PyObject *Relay_link_close(Relay *self, PyObject *args);
RELAY_INTERNAL PyObject *Relay_link_invalidate(Relay *self, PyObject *unused);
RELAY_INTERNAL PyObject *Relay_link_write(Relay *self, PyObject *arg);
RELAY_INTERNAL PyObject *Relay_link_dst(Relay *self, PyObject *args);
RELAY_INTERNAL PyObject *Relay_link_collect(Relay *self, PyObject *unused);
RELAY_INTERNAL PyObject *Relay_link_pending(Relay *self, PyObject *unused);
RELAY_INTERNAL PyObject *Relay_fanout(Relay *self, PyObject *const *args, Py_ssize_t nargs);
RELAY_INTERNAL PyObject *Relay_hmac(Relay *self, PyObject *args);

#endif
