/*
 * SHA-256 and HMAC-SHA256 (FIPS 180-4, RFC 2104), for the federation key's signatures of the
 * routed messages the relay thread publishes (broker.c; signing.py is Python's side, whose
 * stdlib hmac the tests compare this with). No dependency: the extension builds wherever a C
 * compiler and the Python headers are, as before.
 */
#ifndef GOSSIPROUTER_RELAY_SHA256_H
#define GOSSIPROUTER_RELAY_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define SHA256_BLOCK 64
#define SHA256_SIZE 32

typedef struct {
    uint32_t h[8];
    uint64_t bytes; /* hashed so far */
    uint8_t buf[SHA256_BLOCK];
    size_t used;
} sha256_t;

/* An HMAC key made ready once: the inner and outer hashes after their padded key blocks. */
typedef struct {
    sha256_t inner, outer;
} hmac_key_t;

__attribute__((visibility("hidden"))) void sha256_init(sha256_t *s);
__attribute__((visibility("hidden"))) void sha256_update(sha256_t *s, const void *data, size_t n);
__attribute__((visibility("hidden"))) void sha256_final(sha256_t *s, uint8_t out[SHA256_SIZE]);
__attribute__((visibility("hidden"))) void hmac_key(hmac_key_t *k, const uint8_t *key, size_t n);
/* An HMAC in progress starts as a copy of the key's inner hash (hmac_key_t.inner). */
__attribute__((visibility("hidden"))) void hmac_final(const hmac_key_t *k, sha256_t *inner,
                                                      uint8_t out[SHA256_SIZE]);

#endif
