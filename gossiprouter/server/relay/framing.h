/*
 * The three framings (framing.c): where a frame of a learned route ends in what a connection
 * sent, and the start of a frame cut by a read, held until the next.
 */
#ifndef GOSSIPROUTER_RELAY_FRAMING_H
#define GOSSIPROUTER_RELAY_FRAMING_H

#include "relay.h"

#include <sys/types.h>

RELAY_INTERNAL ssize_t frame_len(Relay *r, conn_t *c, route_t **rtp, const uint8_t *p,
                                 size_t avail);
/* The payload of a whole frame (``p[q:end]``, after its learned header) makes it a plain routed
 * frame (NATIVE: one msgpack bin ending it; JG5: a u32 length ending it). */
RELAY_INTERNAL int payload_ends_frame(int kind, const uint8_t *p, size_t q, size_t end);
RELAY_INTERNAL void set_hold(Relay *r, conn_t *c, uint8_t *buf, size_t len, size_t cap);
RELAY_INTERNAL void drop_hold(Relay *r, conn_t *c);
RELAY_INTERNAL int keep_rest(Relay *r, conn_t *c, const uint8_t *buf, size_t pos, size_t len);

#endif
