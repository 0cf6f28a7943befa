/*
 * Python's methods on one connection (relay.h): ``open`` gives it an id (cid: an index into
 * Relay.conns and a generation, so that a closed connection's id never names the next one),
 * ``read`` hands its reading to the thread, ``attach`` its writing; ``send`` writes for Python
 * in order with the thread; ``unread``, ``take`` and ``close`` take it back, with the bytes
 * the thread held for it.
 */
#include "conns.h"

#include "framing.h"
#include "loop.h"
#include "routes.h"
#include "workers.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>

/* A connection's memory, when close() forgets it (or the Relay goes). */
void free_conn(conn_t *c) {
    free_routes(c); /* and its table */
    free(c->hold);
    free(c->pend);
    free(c);
}

int64_t *read_cids(PyObject *dests, Py_ssize_t min, Py_ssize_t *n, const char *what) {
    PyObject *seq = PySequence_Fast(dests, "dests must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t nd = PySequence_Fast_GET_SIZE(seq);
    int64_t *ids = NULL;
    if (nd < min || nd > (Py_ssize_t)IDX_MASK + 1) {
        PyErr_Format(PyExc_ValueError, "%s: %zd dests (%zd to as many as connections)", what, nd,
                     min);
    } else if ((ids = malloc(sizeof(int64_t) * (size_t)(nd ? nd : 1))) == NULL) {
        PyErr_NoMemory();
    } else {
        for (Py_ssize_t i = 0; i < nd; i++) {
            long long d = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
            if ((d == -1 && PyErr_Occurred()) || check_cid(d) < 0) {
                free(ids);
                ids = NULL;
                break;
            }
            ids[i] = d;
        }
    }
    Py_DECREF(seq);
    *n = nd;
    return ids;
}

/* open(fd, kind, max_hold=MAX_HOLD) -> cid: a connection the relay may later read / write.
 * ``max_hold``: the largest frame the thread holds across reads (a larger one cut by a read
 * goes to Python, which charges it to its router-wide budget for partial frames: the thread's
 * holds must stay within what Python admits without it). */
PyObject *Relay_open(Relay *self, PyObject *args) {
    int fd, kind;
    Py_ssize_t max_hold = MAX_HOLD;
    if (!PyArg_ParseTuple(args, "ii|n", &fd, &kind, &max_hold)) return NULL;
    if (fd < 0 || max_hold < 0 || max_hold > MAX_HOLD) {
        PyErr_Format(PyExc_ValueError,
                     "open(fd=%d, max_hold=%zd): fd must not be negative, max_hold is 0..%d",
                     fd, max_hold, MAX_HOLD);
        return NULL;
    }
    if (kind != 0 && kind != NATIVE && kind != JG2 && kind != JG5 && kind != MQTT) {
        PyErr_SetString(PyExc_ValueError, "unknown framing");
        return NULL;
    }
    conn_t *c = calloc(1, sizeof(conn_t));
    if (c == NULL) return PyErr_NoMemory();
    py_lock(self);
    size_t idx;
    if (self->nfree) {
        idx = (size_t)self->free_idx[--self->nfree];
    } else {
        if (self->nconns == self->capconns) {
            size_t n = self->capconns ? self->capconns * 2 : 256;
            if (n > IDX_MASK + 1) {
                pthread_mutex_unlock(&self->mu);
                free(c);
                PyErr_SetString(PyExc_OverflowError, "too many relay connections");
                return NULL;
            }
            conn_t **p = realloc(self->conns, n * sizeof(conn_t *));
            int64_t *f = realloc(self->free_idx, n * sizeof(int64_t));
            if (p) self->conns = p;
            if (f) self->free_idx = f;
            if (p == NULL || f == NULL) {
                pthread_mutex_unlock(&self->mu);
                free(c);
                return PyErr_NoMemory();
            }
            self->capconns = n;
        }
        idx = self->nconns++;
    }
    c->active = 1;
    c->fd = fd;
    c->gen = self->next_gen++ & ((1u << GEN_BITS) - 1);
    if (c->gen == 0) c->gen = self->next_gen++;
    c->kind = kind;
    c->max_hold = (size_t)max_hold;
    c->epoch = self->epoch;
    self->conns[idx] = c;
    int64_t cid = make_cid((uint32_t)idx, c->gen);
    c->cid = cid;
    pthread_mutex_unlock(&self->mu);
    return PyLong_FromLongLong(cid);
}

/* read(cid, raw, held=b""): the thread reads the connection (again). With ``held``, the start
 * of a frame Python's session kept (at most max_hold bytes), the next bytes continue it here;
 * with ``raw`` the next chunk goes to Python unparsed (Python keeps something it cannot hand
 * back: a larger frame, a 2.12 object in its decoder, the rest of a skipped frame). */
PyObject *Relay_read(Relay *self, PyObject *args) {
    long long cid;
    int raw;
    Py_buffer held = {0};
    if (!PyArg_ParseTuple(args, "Lp|y*", &cid, &raw, &held)) return NULL;
    if (check_cid(cid) < 0) {
        PyBuffer_Release(&held);
        return NULL;
    }
    py_lock(self);
    conn_t *c = get_conn(self, cid);
    int ok = 0;
    const char *bad = NULL;
    if (c != NULL && c->lost) {
        /* Python closes it (UP_LOST is queued): it is not read again. */
        pthread_mutex_unlock(&self->mu);
        PyBuffer_Release(&held);
        Py_RETURN_NONE;
    }
    if (c != NULL && held.len > 0) {
        /* The start of a frame Python cut and hands back: the next bytes continue it. Only
         * while nothing is held here (after an upcall), and within what is held. The bytes
         * move from Python's count to the thread's (Python asks room() first). */
        uint8_t *p = NULL;
        if (c->hlen) {
            bad = "read(held): the thread still holds bytes of this connection";
        } else if ((size_t)held.len > c->max_hold) {
            bad = "read(held): more than the connection's max_hold";
        } else if ((p = malloc((size_t)held.len)) == NULL) {
            ok = ENOMEM;
        } else {
            memcpy(p, held.buf, (size_t)held.len);
            set_hold(self, c, p, (size_t)held.len, (size_t)held.len);
            raw = 0;
        }
    }
    if (c != NULL && !ok && bad == NULL) {
        c->raw = raw;
        if (!c->reading) {
            if (watch_in(conn_ep(self, c), c->fd, (uint64_t)cid) == 0) c->reading = 1;
            else ok = errno;
        }
    }
    pthread_mutex_unlock(&self->mu);
    if (held.obj != NULL) PyBuffer_Release(&held);
    if (c == NULL) {
        PyErr_SetString(PyExc_KeyError, "no such relay connection");
        return NULL;
    }
    if (bad != NULL) {
        PyErr_SetString(PyExc_ValueError, bad);
        return NULL;
    }
    if (ok == ENOMEM) return PyErr_NoMemory();
    if (ok) {
        errno = ok;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

/* The methods taking one connection id: parse it and take the mutex (-1: a parse error,
 * raised, and no mutex taken); *c is the connection or NULL (unknown or closed). */
static int lock_conn(Relay *self, PyObject *args, conn_t **c, long long *cid) {
    if (!PyArg_ParseTuple(args, "L", cid) || check_cid(*cid) < 0) return -1;
    py_lock(self);
    *c = get_conn(self, *cid);
    return 0;
}

/* The methods taking one connection id and giving back bytes: ``locked`` makes them for a
 * connection, the mutex held; a connection unknown or closed gives none. */
static PyObject *conn_bytes(Relay *self, PyObject *args,
                            PyObject *(*locked)(Relay *self, conn_t *c)) {
    long long cid;
    conn_t *c;
    if (lock_conn(self, args, &c, &cid) < 0) return NULL;
    PyObject *out = c == NULL ? PyBytes_FromStringAndSize(NULL, 0) : locked(self, c);
    pthread_mutex_unlock(&self->mu);
    return out;
}

static PyObject *unread_locked(Relay *self, conn_t *c) {
    stop_reading(self, c);
    PyObject *out = PyBytes_FromStringAndSize((const char *)c->hold, (Py_ssize_t)c->hlen);
    drop_hold(self, c);
    return out;
}

/* unread(cid) -> bytes: stop reading; the bytes of a partial frame held, for Python. */
PyObject *Relay_unread(Relay *self, PyObject *args) {
    return conn_bytes(self, args, unread_locked);
}

/* attach(cid) -> bool: the thread may write to the connection (its queue is empty). */
PyObject *Relay_attach(Relay *self, PyObject *args) {
    long long cid;
    conn_t *c;
    if (lock_conn(self, args, &c, &cid) < 0) return NULL;
    int ok = c != NULL && !c->lost;
    if (ok) {
        c->attached = 1;
        c->evicting = 0;
    }
    pthread_mutex_unlock(&self->mu);
    return PyBool_FromLong(ok);
}

static PyObject *take_pending_locked(Relay *self, conn_t *c) {
    PyObject *out = PyBytes_FromStringAndSize((const char *)c->pend, (Py_ssize_t)c->plen);
    self->held_pending -= c->plen;
    free(c->pend);
    c->pend = NULL;
    c->plen = 0;
    c->attached = 0; /* routes to it stay: their frames go to Python while it is detached */
    c->evicting = 0;
    return out;
}

/* take(cid) -> bytes: detach the connection from the thread's writes; its pending bytes. */
PyObject *Relay_take(Relay *self, PyObject *args) {
    return conn_bytes(self, args, take_pending_locked);
}

static PyObject *close_locked(Relay *self, conn_t *c) {
    stop_reading(self, c);
    release_worker(self, c);
    PyObject *out = take_pending_locked(self, c);
    drop_hold(self, c);
    size_t idx = (size_t)(c->cid & IDX_MASK);
    if (c->lost == 1) { /* not reported yet: off the lost list */
        conn_t **pp = &self->lost_head;
        while (*pp != c) pp = &(*pp)->lost_next;
        *pp = c->lost_next;
    }
    self->conns[idx] = NULL;
    self->free_idx[self->nfree++] = (int64_t)idx;
    free_conn(c);
    return out;
}

/* close(cid) -> bytes: forget the connection (before its socket is closed); its pending
 * bytes. */
PyObject *Relay_close(Relay *self, PyObject *args) {
    return conn_bytes(self, args, close_locked);
}

/* send(cid, data) -> int: write for Python, in order with the thread's writes: the bytes the
 * socket took; -1: the connection has pending bytes (take() them first); -2: not attached.
 * When the socket does not take everything the connection is detached (Python queues the
 * rest); an error detaches it too and is raised. */
PyObject *Relay_send(Relay *self, PyObject *const *args, Py_ssize_t nargs) {
    /* METH_FASTCALL, bytes without the buffer protocol: it is every direct send's cost. */
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "send(cid, data) takes 2 arguments");
        return NULL;
    }
    long long cid = PyLong_AsLongLong(args[0]);
    if ((cid == -1 && PyErr_Occurred()) || check_cid(cid) < 0) return NULL;
    Py_buffer buf = {0};
    const char *data;
    Py_ssize_t len;
    if (PyBytes_CheckExact(args[1])) {
        data = PyBytes_AS_STRING(args[1]);
        len = PyBytes_GET_SIZE(args[1]);
    } else {
        if (PyObject_GetBuffer(args[1], &buf, PyBUF_SIMPLE) < 0) return NULL;
        data = buf.buf;
        len = buf.len;
    }
    py_lock(self);
    conn_t *c = get_conn(self, cid);
    long long result;
    int err = 0;
    if (c == NULL || !c->attached) {
        result = -2;
    } else if (c->plen || c->evicting) {
        result = -1;
    } else {
        ssize_t n = send(c->fd, data, (size_t)len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) n = 0;
            else err = errno;
        }
        if (err || n < len) c->attached = 0; /* Python queues the rest: it writes now */
        result = err ? 0 : n; /* counted by Python */
    }
    pthread_mutex_unlock(&self->mu);
    if (buf.obj != NULL) PyBuffer_Release(&buf);
    if (err) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromLongLong(result);
}

