/* Just enough MQTT 3.1.1 for the floor relay's federated mode (mqtt.c): a blocking connect and
 * subscribe at start, QoS 0 PUBLISH packets built into a buffer, and PUBLISH packets taken from
 * what the broker sent. A benchmark reference, not product code. */
#ifndef FLOOR_MQTT_H
#define FLOOR_MQTT_H

#include <stddef.h>
#include <stdint.h>

/* Connect to the broker on 127.0.0.1:port as client_id (clean session, no keepalive) and
 * subscribe to the nfilters topic filters at QoS 0; the connected socket (non-blocking from
 * then on: its SUBACK and what follows are for the caller to read), or -1 with the cause on
 * stderr. */
int mqtt_connect(int port, const char *client_id, const char *const *filters, int nfilters);

/* The bytes of a QoS 0 PUBLISH of payload to topic (retained if retain) written at out, which
 * has room for mqtt_publish_size(tlen, n) bytes; returns that size. */
size_t mqtt_publish_size(size_t tlen, size_t n);
size_t mqtt_publish(uint8_t *out, const char *topic, size_t tlen, const uint8_t *payload,
                    size_t n, int retain);

/* The packet at p (have bytes): 0 when it is not whole yet, -1 when it cannot be read, else its
 * length; *topic and *payload are set for a QoS 0 PUBLISH (*topic NULL for any other packet). */
long mqtt_next(const uint8_t *p, size_t have, const uint8_t **topic, size_t *tlen,
               const uint8_t **payload, size_t *plen);

#endif
