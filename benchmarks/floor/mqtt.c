/* Just enough MQTT 3.1.1 for the floor relay's federated mode: see mqtt.h. */
#define _GNU_SOURCE
#include "mqtt.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The remaining-length varint of n at out; its length. */
static size_t varint(uint8_t *out, size_t n) {
    size_t i = 0;
    do {
        uint8_t b = n & 0x7f;
        n >>= 7;
        out[i++] = b | (n ? 0x80 : 0);
    } while (n);
    return i;
}

static int write_all(int fd, const uint8_t *p, size_t n) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Read one whole packet (blocking) into buf; its first byte, or -1. */
static int read_packet(int fd, uint8_t *buf, size_t cap) {
    size_t have = 0;
    for (;;) {
        const uint8_t *t, *pl;
        size_t tl, pll;
        long n = mqtt_next(buf, have, &t, &tl, &pl, &pll);
        if (n < 0) return -1;
        if (n > 0) return buf[0];
        if (have == cap) return -1;
        ssize_t r = recv(fd, buf + have, cap - have, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        have += (size_t)r;
    }
}

int mqtt_connect(int port, const char *client_id, const char *const *filters, int nfilters) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
        perror("floor-relay: connect to the broker on 127.0.0.1");
        if (fd >= 0) close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    uint8_t pkt[1024], body[1024];
    size_t idlen = strlen(client_id), n = 0;
    if (idlen > 200) {
        fprintf(stderr, "floor-relay: client id too long\n");
        close(fd);
        return -1;
    }
    /* CONNECT: "MQTT", level 4, clean session, keepalive 0, the client id */
    const uint8_t head[] = {0, 4, 'M', 'Q', 'T', 'T', 4, 0x02, 0, 0};
    memcpy(body, head, sizeof head);
    n = sizeof head;
    body[n++] = (uint8_t)(idlen >> 8);
    body[n++] = (uint8_t)idlen;
    memcpy(body + n, client_id, idlen);
    n += idlen;
    pkt[0] = 0x10;
    size_t h = 1 + varint(pkt + 1, n);
    memcpy(pkt + h, body, n);
    if (write_all(fd, pkt, h + n) || read_packet(fd, body, sizeof body) != 0x20 || body[3]) {
        fprintf(stderr, "floor-relay: the broker refused the connection\n");
        close(fd);
        return -1;
    }
    /* SUBSCRIBE, packet id 1, each filter at QoS 0 */
    n = 0;
    body[n++] = 0;
    body[n++] = 1;
    for (int i = 0; i < nfilters; i++) {
        size_t fl = strlen(filters[i]);
        if (n + fl + 3 > sizeof body) {
            fprintf(stderr, "floor-relay: topic filters too long\n");
            close(fd);
            return -1;
        }
        body[n++] = (uint8_t)(fl >> 8);
        body[n++] = (uint8_t)fl;
        memcpy(body + n, filters[i], fl);
        n += fl;
        body[n++] = 0;
    }
    pkt[0] = 0x82;
    h = 1 + varint(pkt + 1, n);
    memcpy(pkt + h, body, n);
    /* SUBACK, and the retained messages after it, are read by the relay's loop. */
    if (write_all(fd, pkt, h + n)) {
        perror("floor-relay: subscribe");
        close(fd);
        return -1;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}

size_t mqtt_publish_size(size_t tlen, size_t n) {
    uint8_t tmp[8];
    return 1 + varint(tmp, 2 + tlen + n) + 2 + tlen + n;
}

size_t mqtt_publish(uint8_t *out, const char *topic, size_t tlen, const uint8_t *payload,
                    size_t n, int retain) {
    size_t i = 0;
    out[i++] = 0x30 | (retain ? 1 : 0);
    i += varint(out + i, 2 + tlen + n);
    out[i++] = (uint8_t)(tlen >> 8);
    out[i++] = (uint8_t)tlen;
    memcpy(out + i, topic, tlen);
    i += tlen;
    memcpy(out + i, payload, n);
    return i + n;
}

long mqtt_next(const uint8_t *p, size_t have, const uint8_t **topic, size_t *tlen,
               const uint8_t **payload, size_t *plen) {
    size_t len = 0, i = 1;
    int shift = 0;
    *topic = NULL;
    for (;;) { /* the remaining length */
        if (i >= have) return 0;
        if (i > 4) return -1;
        len |= (size_t)(p[i] & 0x7f) << shift;
        shift += 7;
        if (!(p[i++] & 0x80)) break;
    }
    if (have < i + len) return 0;
    if ((p[0] >> 4) == 3 && !(p[0] & 0x06)) { /* PUBLISH, QoS 0 */
        if (len < 2) return -1;
        size_t tl = (size_t)p[i] << 8 | p[i + 1];
        if (2 + tl > len) return -1;
        *topic = p + i + 2;
        *tlen = tl;
        *payload = p + i + 2 + tl;
        *plen = len - 2 - tl;
    }
    return (long)(i + len);
}
