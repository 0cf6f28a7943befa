/* The floors' listening socket (relay.c, threads.c): 127.0.0.1 only. A benchmark reference, not
 * product code. */
#ifndef FLOOR_LISTEN_H
#define FLOOR_LISTEN_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>

/* A socket listening on 127.0.0.1:port (type_flags: SOCK_NONBLOCK and the like, or 0); -1 with
 * errno set when it cannot be bound. */
static inline int listen_loopback(int port, int type_flags) {
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | type_flags, 0);
    if (lfd < 0) return -1;
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(lfd, (struct sockaddr *)&sa, sizeof sa) || listen(lfd, 4096)) {
        close(lfd);
        return -1;
    }
    return lfd;
}

#endif
