/*
 * Routed messages read from the federation broker by the relay thread (inbound.c): checked as
 * the receiving router's Python checks them, and delivered to the local receivers it taught.
 */
#ifndef GOSSIPROUTER_RELAY_INBOUND_H
#define GOSSIPROUTER_RELAY_INBOUND_H

#include "relay.h"

/* The variable header and payload (``n`` bytes) of a QoS 0 PUBLISH read from the broker: 1 when
 * handled here (delivered, or dropped and counted: a replay, frames too old), 0 when it is
 * Python's (nothing was done). */
RELAY_INTERNAL int inbound(Relay *r, const uint8_t *p, size_t n);
/* Learn ``want`` (its gd, key and dests are taken when learned: NULL then). 1: learned. */
RELAY_INTERNAL int learn_in(Relay *r, inroute_t *want);
/* The last sequence number of another router's run of route-message signatures. */
RELAY_INTERNAL void run_seen(fed_t *f, const uint8_t *run, size_t n, uint64_t seq);
RELAY_INTERNAL uint64_t run_floor(fed_t *f, const uint8_t *run, size_t n);
RELAY_INTERNAL void inbound_free(Relay *r);

RELAY_INTERNAL PyObject *Relay_link_inbound(Relay *self, PyObject *args);
RELAY_INTERNAL PyObject *Relay_link_writer(Relay *self, PyObject *args);
RELAY_INTERNAL PyObject *Relay_link_learn_in(Relay *self, PyObject *args);
RELAY_INTERNAL PyObject *Relay_link_seen(Relay *self, PyObject *args);
RELAY_INTERNAL PyObject *Relay_link_floor(Relay *self, PyObject *args);

#endif
