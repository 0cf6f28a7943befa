/*
 * Python's methods on the federation broker's connection (broker.c says what the link does):
 * handing the socket's writes over and back, the thread's settings and destinations, the
 * counters, and Python's own writes through it. module.c puts them in the type's method table.
 */
#include "broker.h"

#include "loop.h"
#include "sha256.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_DSTS 4096 /* other routers the thread publishes to (beyond: Python's share) */

/* link_open(fd): the broker socket's writes go through the thread from now on. */
PyObject *Relay_link_open(Relay *self, PyObject *args) {
    int fd;
    if (!PyArg_ParseTuple(args, "i", &fd)) return NULL;
    int dup = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dup < 0) return PyErr_SetFromErrno(PyExc_OSError);
    py_lock(self);
    fed_t *f = &self->fed;
    stop_routing(self);
    disarm(self);
    out_drop(f);
    if (f->fd >= 0) close(f->fd);
    f->fd = dup;
    f->broken = 0;
    f->err = 0;
    pthread_mutex_unlock(&self->mu);
    Py_RETURN_NONE;
}

/* link_enable(key, run, props, from_len, sent_len, batch_len, mac_len, limit, max_packet,
 * queue_limit): the thread publishes learned remote shares (see the file's comment). */
PyObject *Relay_link_enable(Relay *self, PyObject *args) {
    Py_buffer key, props;
    const char *run;
    Py_ssize_t runlen, lens[4], limit, max_packet, queue_limit;
    if (!PyArg_ParseTuple(args, "y*s#y*nnnnnnn", &key, &run, &runlen, &props, &lens[0], &lens[1],
                          &lens[2], &lens[3], &limit, &max_packet, &queue_limit))
        return NULL;
    const char *bad = NULL;
    Py_ssize_t sum = 0;
    for (int i = 0; i < 4; i++) {
        if (lens[i] < 0) bad = "link_enable: negative property length";
        sum += lens[i];
    }
    if (sum != props.len) bad = "link_enable: the property lengths do not add up";
    else if (runlen < 1 || runlen > 40 || memchr(run, ':', (size_t)runlen))
        bad = "link_enable: run must be 1 to 40 characters without ':'";
    else if (limit < 1 || max_packet < 0 || queue_limit < 0)
        bad = "link_enable: limits must be positive";
    hmac_key_t *k = NULL;
    uint8_t *pcopy = NULL;
    if (bad == NULL && key.len) {
        k = malloc(sizeof *k);
        if (k != NULL) hmac_key(k, key.buf, (size_t)key.len);
    }
    if (bad == NULL) pcopy = malloc(props.len ? (size_t)props.len : 1);
    if (bad == NULL && (pcopy == NULL || (key.len && k == NULL))) {
        free(k);
        free(pcopy);
        PyBuffer_Release(&key);
        PyBuffer_Release(&props);
        return PyErr_NoMemory();
    }
    if (bad != NULL) {
        PyBuffer_Release(&key);
        PyBuffer_Release(&props);
        PyErr_SetString(PyExc_ValueError, bad);
        return NULL;
    }
    if (props.len) memcpy(pcopy, props.buf, (size_t)props.len);
    py_lock(self);
    fed_t *f = &self->fed;
    stop_routing(self);
    free(f->key);
    free(f->props);
    f->key = k;
    f->keyed = k != NULL;
    f->props = pcopy;
    f->from_len = (size_t)lens[0];
    f->sent_len = (size_t)lens[1];
    f->batch_len = (size_t)lens[2];
    f->mac_len = (size_t)lens[3];
    memcpy(f->run, run, (size_t)runlen);
    f->runlen = (size_t)runlen;
    f->sign_seq = 0;
    f->limit = (size_t)limit;
    f->max_packet = (size_t)max_packet;
    f->queue_limit = (size_t)queue_limit;
    f->routing = 1;
    pthread_mutex_unlock(&self->mu);
    PyBuffer_Release(&key);
    PyBuffer_Release(&props);
    Py_RETURN_NONE;
}

/* link_disable(): remote shares are Python's again (the broker session is not up). */
PyObject *Relay_link_disable(Relay *self, PyObject *unused) {
    py_lock(self);
    stop_routing(self);
    pthread_mutex_unlock(&self->mu);
    Py_RETURN_NONE;
}

/* link_close(timeout=0.0): the broker socket is Python's again (it is about to be closed):
 * what waits for it is written if the socket takes it within ``timeout`` seconds (paho's
 * DISCONNECT after its last messages, say), the rest dropped (counted: link_collect). */
PyObject *Relay_link_close(Relay *self, PyObject *args) {
    double timeout = 0.0;
    if (!PyArg_ParseTuple(args, "|d", &timeout)) return NULL;
    int64_t deadline = now_ns() + (int64_t)(timeout > 0 && timeout < 60 ? timeout * 1e9 : 0);
    py_lock(self);
    fed_t *f = &self->fed;
    if (f->fd >= 0 || f->routing) {
        stop_routing(self);
        out_push(self);
        while (f->fd >= 0 && !f->broken && f->off < f->len && now_ns() < deadline) {
            struct pollfd p = {.fd = f->fd, .events = POLLOUT};
            pthread_mutex_unlock(&self->mu);
            Py_BEGIN_ALLOW_THREADS
            poll(&p, 1, 20);
            Py_END_ALLOW_THREADS
            py_lock(self);
            out_push(self);
        }
        disarm(self);
        out_drop(f);
        if (f->fd >= 0) close(f->fd);
        f->fd = -1;
        f->broken = 0;
    }
    pthread_mutex_unlock(&self->mu);
    Py_RETURN_NONE;
}

/* link_invalidate(): the routes with fed targets learned so far are Python's again. */
PyObject *Relay_link_invalidate(Relay *self, PyObject *unused) {
    py_lock(self);
    bump(self);
    pthread_mutex_unlock(&self->mu);
    Py_RETURN_NONE;
}

/* link_write(data) -> len(data): bytes for the broker, after everything written before them;
 * OSError when the link broke (or is not open: EBADF). */
PyObject *Relay_link_write(Relay *self, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) return NULL;
    py_lock(self);
    fed_t *f = &self->fed;
    int err = f->fd < 0 ? EBADF : f->broken ? f->err : 0;
    size_t done = 0, n = (size_t)b.len;
    while (!err && f->off == f->len && done < n) { /* nothing waits: straight to the socket */
        ssize_t w = send(f->fd, (const uint8_t *)b.buf + done, n - done,
                         MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w > 0) done += (size_t)w;
        else if (w < 0 && errno == EINTR) continue;
        else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        else {
            fail(self, w == 0 ? EPIPE : errno);
            err = f->err;
        }
    }
    if (!err && done < n) {
        uint8_t *p = out_room(f, n - done);
        if (p == NULL) {
            fail(self, ENOMEM);
            err = ENOMEM;
        } else {
            memcpy(p, (const uint8_t *)b.buf + done, n - done);
            out_push(self); /* arms EPOLLOUT (or meets the error) */
            if (f->broken) err = f->err;
        }
    }
    pthread_mutex_unlock(&self->mu);
    PyBuffer_Release(&b);
    if (err) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromSize_t(n);
}

/* link_dst(topic, bound) -> int: a destination router for fed targets (its route topic, and a
 * PUBLISH's bytes beyond the payload on it at most); -1 beyond MAX_DSTS. */
PyObject *Relay_link_dst(Relay *self, PyObject *args) {
    Py_buffer topic;
    Py_ssize_t bound;
    if (!PyArg_ParseTuple(args, "y*n", &topic, &bound)) return NULL;
    if (topic.len < 1 || topic.len > 65535 || bound < 0) {
        PyBuffer_Release(&topic);
        PyErr_SetString(PyExc_ValueError, "link_dst: a topic of 1 to 65535 bytes, a bound >= 0");
        return NULL;
    }
    uint8_t *t = malloc((size_t)topic.len);
    if (t == NULL) {
        PyBuffer_Release(&topic);
        return PyErr_NoMemory();
    }
    memcpy(t, topic.buf, (size_t)topic.len);
    long idx = -1;
    py_lock(self);
    fed_t *f = &self->fed;
    if (f->ndst < MAX_DSTS) {
        fdst_t *p = grow(f->dsts, &f->capdst, f->ndst, sizeof *f->dsts);
        if (p != NULL) f->dsts = p;
        if (f->ndst < f->capdst) {
            fdst_t *d = &f->dsts[f->ndst];
            memset(d, 0, sizeof *d);
            d->topic = t;
            d->tlen = (uint32_t)topic.len;
            d->bound = bound > 0x7fffffff ? 0x7fffffff : (uint32_t)bound;
            t = NULL;
            idx = (long)f->ndst++;
        }
    }
    pthread_mutex_unlock(&self->mu);
    free(t);
    PyBuffer_Release(&topic);
    return PyLong_FromLong(idx);
}

/* Append a row to ``list`` (a new reference to ``t`` taken): 0, or -1 (an exception set). */
static int append(PyObject *list, PyObject *t) {
    int rc = t == NULL || PyList_Append(list, t) < 0 ? -1 : 0;
    Py_XDECREF(t);
    return rc;
}

/* link_collect() -> (out, in, oversized, queue_full, write_errors, dropped_bytes, replayed):
 * since the last call, what the thread published per destination router, ``out``: list[(dst,
 * messages, payloads, frames, lost, lost_frames)], and what it read per other router,
 * ``in``: list[(writer, messages, payloads, frames, delivered, expired)]. */
PyObject *Relay_link_collect(Relay *self, PyObject *unused) {
    PyObject *out = PyList_New(0), *in = PyList_New(0);
    if (out == NULL || in == NULL) goto fail;
    py_lock(self);
    fed_t *f = &self->fed;
    for (uint32_t i = 0; i < f->ndst; i++) {
        fdst_t *d = &f->dsts[i];
        if (!(d->messages | d->lost | d->frames)) continue;
        if (append(out, Py_BuildValue("(IKKKKK)", i, (unsigned long long)d->messages,
                                      (unsigned long long)d->payloads,
                                      (unsigned long long)d->frames, (unsigned long long)d->lost,
                                      (unsigned long long)d->lost_frames)) < 0)
            goto unlock;
        d->messages = d->payloads = d->frames = d->lost = d->lost_frames = 0;
    }
    for (uint32_t i = 0; i < f->nwriter; i++) {
        fwriter_t *w = &f->writers[i];
        if (!(w->messages | w->expired)) continue;
        if (append(in, Py_BuildValue("(IKKKKK)", i, (unsigned long long)w->messages,
                                     (unsigned long long)w->payloads,
                                     (unsigned long long)w->frames,
                                     (unsigned long long)w->delivered,
                                     (unsigned long long)w->expired)) < 0)
            goto unlock;
        w->messages = w->payloads = w->frames = w->delivered = w->expired = 0;
    }
    unsigned long long over = f->oversized, full = f->queue_full, errs = f->write_errors,
                       dropped = f->dropped, replayed = f->unauthenticated;
    f->oversized = f->queue_full = f->write_errors = f->dropped = f->unauthenticated = 0;
    pthread_mutex_unlock(&self->mu);
    return Py_BuildValue("(NNKKKKK)", out, in, over, full, errs, dropped, replayed);
unlock:
    pthread_mutex_unlock(&self->mu);
fail:
    Py_XDECREF(out);
    Py_XDECREF(in);
    return NULL;
}

/* link_pending() -> int: bytes for the broker not written yet (the socket's and this round's). */
PyObject *Relay_link_pending(Relay *self, PyObject *unused) {
    py_lock(self);
    size_t n = self->fed.len - self->fed.off + self->fed.round_bytes;
    pthread_mutex_unlock(&self->mu);
    return PyLong_FromSize_t(n);
}

/* fanout() -> the next fan-out number (Moves.number); fanout(n): numbers go on after n at
 * least (the count Python had reached), returns the last one taken. */
PyObject *Relay_fanout(Relay *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "fanout(n=None) takes at most 1 argument");
        return NULL;
    }
    if (nargs == 0 || args[0] == Py_None)
        return PyLong_FromUnsignedLongLong(atomic_fetch_add(&self->fed.fanout, 1) + 1);
    unsigned long long n = PyLong_AsUnsignedLongLong(args[0]);
    if (n == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    unsigned long long cur = atomic_load(&self->fed.fanout);
    while (cur < n && !atomic_compare_exchange_weak(&self->fed.fanout, &cur, n)) {
    }
    return PyLong_FromUnsignedLongLong(atomic_load(&self->fed.fanout));
}

/* _hmac(key, data) -> str: HMAC-SHA256 in hex (tests: the same as Python's hmac). */
PyObject *Relay_hmac(Relay *self, PyObject *args) {
    Py_buffer key, data;
    if (!PyArg_ParseTuple(args, "y*y*", &key, &data)) return NULL;
    hmac_key_t k;
    hmac_key(&k, key.buf, (size_t)key.len);
    sha256_t s = k.inner;
    sha256_update(&s, data.buf, (size_t)data.len);
    uint8_t mac[SHA256_SIZE];
    hmac_final(&k, &s, mac);
    PyBuffer_Release(&key);
    PyBuffer_Release(&data);
    char hex[2 * SHA256_SIZE];
    for (int i = 0; i < SHA256_SIZE; i++) {
        hex[2 * i] = "0123456789abcdef"[mac[i] >> 4];
        hex[2 * i + 1] = "0123456789abcdef"[mac[i] & 15];
    }
    return PyUnicode_FromStringAndSize(hex, 2 * SHA256_SIZE);
}
