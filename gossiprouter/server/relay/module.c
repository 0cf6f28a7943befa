/*
 * gossiprouter.server._relay, the Python module (relay.h tells the whole design): the type
 * Relay, its life (a thread started and stopped), the decisions Python hands it (learn,
 * invalidate: routes.c keeps them), and what Python collects from it (upcalls, counters).
 * Its methods on one connection are in conns.c.
 */
#include "broker.h"
#include "conns.h"
#include "inbound.h"
#include "loop.h"
#include "routes.h"
#include "workers.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define MAX_BYTES_DEFAULT (64 * 1024 * 1024)

/* Relay(max_bytes=MAX_BYTES_DEFAULT, threads=0, promote_reads=20, idle_ms=2000, batch=False):
 * ``max_bytes`` bounds what the thread holds between reads, router-wide (relay.h);
 * ``threads``: the busy connections' threads at most (workers.c; 0: the relay thread reads
 * every connection), given to a connection that reads ``promote_reads`` times within 100 ms,
 * and taken back after ``idle_ms`` without a read (tests set them: promotion after a count of
 * reads alone); ``batch``: those threads run as SCHED_BATCH (workers.c, relay_sched). */
static int Relay_init(Relay *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"max_bytes", "threads", "promote_reads", "idle_ms", "batch", NULL};
    Py_ssize_t max_bytes = MAX_BYTES_DEFAULT;
    int threads = 0, promote_reads = 20, idle_ms = 2000, batch = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|niiip", kwlist, &max_bytes, &threads,
                                     &promote_reads, &idle_ms, &batch))
        return -1;
    if (promote_reads < 1 || idle_ms < 1) {
        PyErr_SetString(PyExc_ValueError, "promote_reads and idle_ms must be at least 1");
        return -1;
    }
    if (max_bytes < 0) {
        PyErr_SetString(PyExc_ValueError, "max_bytes must not be negative");
        return -1;
    }
    if (threads < 0 || threads > MAX_WORKERS) {
        PyErr_Format(PyExc_ValueError, "threads must be 0..%d", MAX_WORKERS);
        return -1;
    }
    if (self->thread_started) {
        PyErr_SetString(PyExc_RuntimeError, "the relay is running");
        return -1;
    }
    if (self->scratch == NULL) self->scratch = malloc(RECV_SIZE);
    if (self->scratch == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->max_bytes = (size_t)max_bytes;
    if (pthread_mutex_init(&self->mu, NULL) != 0 || pthread_mutex_init(&self->turn, NULL) != 0 ||
        sem_init(&self->ready, 0, 0) != 0) {
        PyErr_SetString(PyExc_OSError, "pthread_mutex_init or sem_init failed");
        return -1;
    }
    self->ep = epoll_create1(EPOLL_CLOEXEC);
    self->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    self->stopfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (self->ep < 0 || self->efd < 0 || self->stopfd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    if (watch_in(self->ep, self->stopfd, (uint64_t)-1) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    self->next_gen = 1;
    self->promote_reads = (uint32_t)promote_reads;
    self->idle_ms = idle_ms;
    self->batch = batch;
    if (workers_init(self, threads) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static PyObject *Relay_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    Relay *self = (Relay *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->ep = self->efd = self->stopfd = -1;
    self->fed.fd = -1;
    return (PyObject *)self;
}

static void stop_thread(Relay *self) {
    if (!self->thread_started) return;

    py_lock(self);
    self->stopping = 1;
    pthread_mutex_unlock(&self->mu);
    uint64_t one = 1;
    ssize_t w = write(self->stopfd, &one, sizeof one);
    (void)w;
    Py_BEGIN_ALLOW_THREADS
    pthread_join(self->thread, NULL);
    workers_stop(self);
    Py_END_ALLOW_THREADS
    self->thread_started = 0;
}

static void Relay_dealloc(Relay *self) {
    stop_thread(self);
    workers_free(self);
    inbound_free(self);
    fed_free(self);
    for (size_t i = 0; i < self->nconns; i++)
        if (self->conns[i]) free_conn(self->conns[i]);
    free(self->conns);
    free(self->free_idx);
    free(self->dirty);
    free(self->scratch);
    while (self->wrap != NULL) {
        wrap_t *next = self->wrap->next;
        free(self->wrap);
        self->wrap = next;
    }
    up_t *u = self->up_head;
    while (u) {
        up_t *next = u->next;
        free(u);
        u = next;
    }
    if (self->ep >= 0) close(self->ep);
    if (self->efd >= 0) close(self->efd);
    if (self->stopfd >= 0) close(self->stopfd);
    pthread_mutex_destroy(&self->mu);
    pthread_mutex_destroy(&self->turn);
    sem_destroy(&self->ready);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Relay_start(Relay *self, PyObject *unused) {
    if (self->thread_started) Py_RETURN_NONE;
    self->stopping = 0;
    uint64_t v; /* a stop() before: its wake-up must not end (or spin) the new thread */
    ssize_t rd = read(self->stopfd, &v, sizeof v);
    (void)rd;
    if (pthread_create(&self->thread, NULL, thread_main, self) != 0) {
        PyErr_SetString(PyExc_OSError, "could not start the relay thread");
        return NULL;
    }
    self->thread_started = 1;
    /* Its scheduling is set when start() returns: info()["sched_refused"] says if it was not. */
    int rc;
    Py_BEGIN_ALLOW_THREADS
    do rc = sem_wait(&self->ready);
    while (rc != 0 && errno == EINTR);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *Relay_stop(Relay *self, PyObject *unused) {
    stop_thread(self);
    Py_RETURN_NONE;
}

static PyObject *Relay_fileno(Relay *self, PyObject *unused) { return PyLong_FromLong(self->efd); }

/* The fed targets of learn(): a sequence of (dst, prefix) (broker.c), or NULL and *n = -1 with
 * an exception set. None: no targets. */
static ftarget_t *fed_targets(PyObject *fed, int *n) {
    *n = 0;
    if (fed == NULL || fed == Py_None) return NULL;
    PyObject *seq = PySequence_Fast(fed, "fed must be a sequence of (dst, prefix)");
    if (seq == NULL) goto bad;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
    if (k > 65536) {
        PyErr_SetString(PyExc_ValueError, "learn: too many fed targets");
        Py_DECREF(seq);
        goto bad;
    }
    ftarget_t *t = k ? calloc((size_t)k, sizeof(ftarget_t)) : NULL;
    if (k && t == NULL) {
        PyErr_NoMemory();
        Py_DECREF(seq);
        goto bad;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        unsigned int dst;
        const char *prefix;
        Py_ssize_t plen;
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "Iy#", &dst, &prefix, &plen) ||
            plen < 1 || plen > 1024) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "learn: a fed target is (dst, 1 to 1024 bytes)");
            free_targets(t, (int)i);
            Py_DECREF(seq);
            goto bad;
        }
        t[i].dst = dst;
        t[i].plen = (uint32_t)plen;
        t[i].prefix = malloc((size_t)plen);
        if (t[i].prefix == NULL) {
            PyErr_NoMemory();
            free_targets(t, (int)i);
            Py_DECREF(seq);
            goto bad;
        }
        memcpy(t[i].prefix, prefix, (size_t)plen);
    }
    Py_DECREF(seq);
    *n = (int)k;
    return t;
bad:
    *n = -1;
    return NULL;
}

/* learn(cid, key, out, skip, max_frame, dests, slot=0, remote=False, fed=None) -> bool: False
 * when it cannot be repeated now (a connection unknown, or a receiver not attached);
 * ValueError for arguments no caller may pass (they would make the thread read or write out of
 * bounds). ``remote``: the frames also go to other routers (UP_REMOTE upcalls, as received;
 * UP_REMOTE_J5 from a 5.x connection, UP_REMOTE_J2 from a 2.12 one, whose receivers get them
 * re-wrapped: Python re-wraps the remote share); ``fed``: ... published by the thread to these
 * (dst, header start) while the broker link routes (broker.c; frames sent as received only);
 * the upcall when it does not. */
static PyObject *Relay_learn(Relay *self, PyObject *args) {
    long long cid, slot = 0;
    Py_buffer key, out;
    Py_ssize_t skip, max_frame;
    PyObject *dests, *fedarg = NULL;
    int remote = 0;
    if (!PyArg_ParseTuple(args, "Ly*y*nnO|LpO", &cid, &key, &out, &skip, &max_frame, &dests,
                          &slot, &remote, &fedarg))
        return NULL;
    int64_t *ids = NULL;
    const char *bad = NULL;
    int nfed = 0;
    ftarget_t *fed = NULL;
    if (check_cid(cid) < 0) goto fail;
    if (key.len < 1 || key.len > MAX_HOLD) bad = "learn: key must be 1 to MAX_HOLD bytes";
    else if (out.len > MAX_HOLD) bad = "learn: out must be at most MAX_HOLD bytes";
    else if (skip < 0 || skip > key.len) bad = "learn: skip must be 0 to len(key)";
    else if (max_frame < 1) bad = "learn: max_frame must be positive";
    else if (slot < 0 || slot >= GROUP_SLOTS) bad = "learn: slot must be 0 to GROUP_SLOTS - 1";
    else if (fedarg != NULL && fedarg != Py_None && !remote)
        bad = "learn: fed targets only with remote";
    else if (fedarg != NULL && fedarg != Py_None && out.len)
        bad = "learn: fed targets only for frames sent as received";
    if (bad != NULL) {
        PyErr_SetString(PyExc_ValueError, bad);
        goto fail;
    }
    Py_ssize_t nd;
    ids = read_cids(dests, 0, &nd, "learn");
    if (ids == NULL) goto fail;
    fed = fed_targets(fedarg, &nfed);
    if (nfed < 0) goto fail;
    route_t want = {
        .key = key.buf,
        .klen = (uint32_t)key.len,
        .out = out.buf,
        .olen = (uint32_t)out.len,
        .skip = (uint32_t)skip,
        .max_frame = max_frame > 0x7fffffff ? 0x7fffffff : (uint32_t)max_frame,
        .ndest = (int)nd,
        .dests = ids,
        .slot = (uint32_t)slot,
        .remote = remote,
        .nfed = nfed,
        .fed = fed,
    };
    int dup;
    py_lock(self);
    for (int i = 0; i < nfed; i++)
        if (fed[i].dst >= self->fed.ndst) { /* not a destination: none of them */
            free_targets(want.fed, want.nfed);
            want.fed = NULL;
            want.nfed = 0;
            break;
        }
    int ok = learn(self, cid, &want, &dup);
    ids = want.dests; /* NULL: learned, the route has them */
    pthread_mutex_unlock(&self->mu);
    free(ids);
    free_targets(want.fed, want.nfed); /* (NULL when learned: the route has them) */
    PyBuffer_Release(&key);
    PyBuffer_Release(&out);
    if (dup) {
        PyErr_SetString(PyExc_ValueError, "learn: a connection is twice among the dests");
        return NULL;
    }
    return PyBool_FromLong(ok);
fail:
    free(ids);
    free_targets(fed, nfed > 0 ? nfed : 0);
    PyBuffer_Release(&key);
    PyBuffer_Release(&out);
    return NULL;
}

/* invalidate(slot=-1): forget the decisions learned for a group slot (-1: every decision). */
static PyObject *Relay_invalidate(Relay *self, PyObject *const *args, Py_ssize_t nargs) {
    long long slot = -1;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "invalidate(slot=-1) takes at most 1 argument");
        return NULL;
    }
    if (nargs == 1) {
        slot = PyLong_AsLongLong(args[0]);
        if (slot == -1 && PyErr_Occurred()) return NULL;
        if (slot < -1 || slot >= GROUP_SLOTS) {
            PyErr_Format(PyExc_ValueError, "invalidate: slot %lld is not -1 or 0 to %d", slot,
                         GROUP_SLOTS - 1);
            return NULL;
        }
    }
    py_lock(self);
    invalidate(self, slot);
    pthread_mutex_unlock(&self->mu);
    Py_RETURN_NONE;
}

/* Put the upcalls ``u`` (a chain, not yet handed to Python) back in front of the queue. */
static void requeue(Relay *self, up_t *u) {
    if (u == NULL) return;
    size_t n = 1, remote = IS_REMOTE(u->kind) ? u->len : 0;
    up_t *last = u;
    while (last->next) {
        last = last->next;
        n++;
        if (IS_REMOTE(last->kind)) remote += last->len;
    }
    py_lock(self);
    self->held_remote += remote;
    last->next = self->up_head;
    self->up_head = u;
    if (self->up_tail == NULL) self->up_tail = last;
    self->up_count += n;
    signal_python(self);
    pthread_mutex_unlock(&self->mu);
}

/* upcalls() -> list[(cid, kind, bytes)], in the order queued, then (cid, LOST, b"") for each
 * connection an upcall could not be queued for. What cannot be handed over for lack of memory
 * stays queued (and signalled) for the next call; MemoryError only when nothing could be. */
static PyObject *Relay_upcalls(Relay *self, PyObject *unused) {
    uint64_t v;
    ssize_t rd = read(self->efd, &v, sizeof v);
    (void)rd;
    PyObject *list = PyList_New(0);
    if (list == NULL) return NULL; /* nothing taken: all of it stays queued */
    py_lock(self);
    up_t *u = self->up_head;
    self->up_head = self->up_tail = NULL;
    self->up_count = 0;
    self->signalled = 0;
    for (up_t *x = u; x != NULL; x = x->next) /* taken: no longer held by the thread */
        if (IS_REMOTE(x->kind)) self->held_remote -= x->len;
    pthread_mutex_unlock(&self->mu);
    while (u) {
        PyObject *t = Py_BuildValue("(Liy#)", (long long)u->cid, u->kind, (const char *)u->data,
                                    (Py_ssize_t)u->len);
        if (t == NULL || PyList_Append(list, t) < 0) {
            Py_XDECREF(t);
            break;
        }
        Py_DECREF(t);
        up_t *next = u->next;
        free(u);
        u = next;
    }
    if (u != NULL) { /* out of memory: the rest (and any lost connection) next time */
        requeue(self, u);
        if (PyList_GET_SIZE(list) == 0) {
            Py_DECREF(list);
            return PyErr_NoMemory();
        }
        PyErr_Clear();
        return list;
    }
    py_lock(self);
    while (self->lost_head != NULL) {
        conn_t *c = self->lost_head;
        PyObject *t = Py_BuildValue("(Liy#)", (long long)c->cid, UP_LOST, "", (Py_ssize_t)0);
        if (t == NULL || PyList_Append(list, t) < 0) {
            Py_XDECREF(t);
            PyErr_Clear();
            signal_python(self); /* reported at the next call */
            break;
        }
        Py_DECREF(t);
        self->lost_head = c->lost_next;
        c->lost_next = NULL;
        c->lost = 2; /* reported: Python closes it */
    }
    pthread_mutex_unlock(&self->mu);
    return list;
}

/* collect() -> (list[(cid, bytes_in, frames, delivered, bytes_out, writes, last_ns)], now_ns,
 * held_partial, held_pending, workers): what the thread did since the last call, per
 * connection touched, the bytes it holds now (partial frames, what sockets did not take), and
 * the connections on threads of their own now (workers.c). */
static PyObject *Relay_collect(Relay *self, PyObject *unused) {
    PyObject *list = PyList_New(0);
    if (list == NULL) return NULL;
    py_lock(self);
    for (size_t i = 0; i < self->nconns; i++) {
        conn_t *c = self->conns[i];
        if (c == NULL || !c->touched) continue;
        PyObject *t = Py_BuildValue("(LKKKKKL)", (long long)make_cid((uint32_t)i, c->gen),
                                    (unsigned long long)c->bytes_in, (unsigned long long)c->frames,
                                    (unsigned long long)c->delivered,
                                    (unsigned long long)c->bytes_out,
                                    (unsigned long long)c->writes, (long long)c->last_ns);
        if (t == NULL || PyList_Append(list, t) < 0) {
            Py_XDECREF(t);
            Py_DECREF(list);
            pthread_mutex_unlock(&self->mu);
            return NULL;
        }
        Py_DECREF(t);
        c->bytes_in = c->frames = c->delivered = c->bytes_out = c->writes = 0;
        c->touched = 0;
    }
    size_t partial = self->held_partial, pending = self->held_pending;
    int workers = workers_busy(self);
    pthread_mutex_unlock(&self->mu);
    PyObject *out = Py_BuildValue("(NLnni)", list, (long long)now_ns(), (Py_ssize_t)partial,
                                  (Py_ssize_t)pending, workers);
    return out;
}

/* room() -> int: the bytes the thread may still hold (max_bytes less what it holds). */
static PyObject *Relay_room(Relay *self, PyObject *unused) {
    py_lock(self);
    size_t held = self->held_partial + self->held_pending;
    size_t room = held < self->max_bytes ? self->max_bytes - held : 0;
    pthread_mutex_unlock(&self->mu);
    return PyLong_FromSize_t(room);
}

/* info() -> dict: counters for tests and profiles. */
static PyObject *Relay_info(Relay *self, PyObject *unused) {
    py_lock(self);
    size_t live = 0, reading = 0, attached = 0, routes = 0, holding = 0, buffers = 0,
           tables = 0;
    for (size_t i = 0; i < self->nconns; i++) {
        conn_t *c = self->conns[i];
        if (c == NULL) continue;
        live++;
        reading += c->reading;
        attached += c->attached;
        routes += live_routes(self, c);
        holding += c->hlen > 0 || c->plen > 0;
        buffers += (c->hold != NULL) + (c->pend != NULL);
        tables += c->routes != NULL;
    }
    PyObject *d = Py_BuildValue(
        "{s:K,s:K,s:K,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:K,s:K,s:K,s:K,s:i,s:i,s:K,"
        "s:K,s:i,s:i}",
        "rounds",
        (unsigned long long)self->rounds, "upcalls", (unsigned long long)self->upcalls,
        "invalidations", (unsigned long long)self->invalidations, "connections",
        (Py_ssize_t)live, "reading", (Py_ssize_t)reading, "attached", (Py_ssize_t)attached,
        "routes", (Py_ssize_t)routes, "queued", (Py_ssize_t)self->up_count, "held_partial",
        (Py_ssize_t)self->held_partial, "held_pending", (Py_ssize_t)self->held_pending,
        "holding", (Py_ssize_t)holding, "buffers", (Py_ssize_t)buffers, "route_tables",
        (Py_ssize_t)tables, "max_bytes",
        (Py_ssize_t)self->max_bytes, "over_cap", (unsigned long long)self->over_cap, "broken",
        (unsigned long long)self->broken, "lost", (unsigned long long)self->lost, "handoffs",
        (unsigned long long)self->handoffs, "threads", self->nworkers, "workers",
        workers_busy(self), "promotions", (unsigned long long)self->promotions, "demotions",
        (unsigned long long)self->demotions, "batch", self->batch, "sched_refused",
        atomic_load(&self->sched_refused));
    pthread_mutex_unlock(&self->mu);
    return d;
}

/* _fail_upcalls(n): the next n upcalls fail as if memory were exhausted (tests only). */
static PyObject *Relay_fail_upcalls(Relay *self, PyObject *args) {
    int n;
    if (!PyArg_ParseTuple(args, "i", &n)) return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "_fail_upcalls: n must not be negative");
        return NULL;
    }
    py_lock(self);
    self->fail_upcalls = n;
    pthread_mutex_unlock(&self->mu);
    Py_RETURN_NONE;
}

static PyMethodDef Relay_methods[] = {
    {"start", (PyCFunction)Relay_start, METH_NOARGS, "Start the relay thread."},
    {"stop", (PyCFunction)Relay_stop, METH_NOARGS, "Stop the relay thread and wait for it."},
    {"fileno", (PyCFunction)Relay_fileno, METH_NOARGS, "The fd readable when upcalls wait."},
    {"open", (PyCFunction)Relay_open, METH_VARARGS, "open(fd, kind, max_hold) -> cid"},
    {"read", (PyCFunction)Relay_read, METH_VARARGS, "read(cid, raw, held=b''): read it."},
    {"unread", (PyCFunction)Relay_unread, METH_VARARGS, "unread(cid) -> held bytes."},
    {"attach", (PyCFunction)Relay_attach, METH_VARARGS, "attach(cid) -> bool"},
    {"take", (PyCFunction)Relay_take, METH_VARARGS, "take(cid) -> pending bytes (detaches)."},
    {"close", (PyCFunction)Relay_close, METH_VARARGS, "close(cid) -> pending bytes."},
    {"send", (PyCFunction)(void (*)(void))Relay_send, METH_FASTCALL, "send(cid, data) -> int"},
    {"learn", (PyCFunction)Relay_learn, METH_VARARGS,
     "learn(cid, key, out, skip, max_frame, dests, slot=0, remote=False, fed=None) -> bool"},
    {"link_open", (PyCFunction)Relay_link_open, METH_VARARGS,
     "link_open(fd): the broker socket's writes go through the thread."},
    {"link_enable", (PyCFunction)Relay_link_enable, METH_VARARGS,
     "link_enable(key, run, props, from_len, sent_len, batch_len, mac_len, limit, max_packet, "
     "queue_limit): the thread publishes learned remote shares."},
    {"link_disable", (PyCFunction)Relay_link_disable, METH_NOARGS,
     "link_disable(): remote shares are Python's again."},
    {"link_close", (PyCFunction)Relay_link_close, METH_VARARGS,
     "link_close(timeout=0.0): the broker socket is Python's again."},
    {"link_invalidate", (PyCFunction)Relay_link_invalidate, METH_NOARGS,
     "link_invalidate(): routes with fed targets are Python's again until learned anew."},
    {"link_write", (PyCFunction)Relay_link_write, METH_O, "link_write(data) -> len(data)"},
    {"link_dst", (PyCFunction)Relay_link_dst, METH_VARARGS, "link_dst(topic, bound) -> int"},
    {"link_collect", (PyCFunction)Relay_link_collect, METH_NOARGS,
     "link_collect() -> (out, in, oversized, queue_full, write_errors, dropped, replayed)"},
    {"link_pending", (PyCFunction)Relay_link_pending, METH_NOARGS,
     "link_pending() -> bytes for the broker not written yet"},
    {"fanout", (PyCFunction)(void (*)(void))Relay_fanout, METH_FASTCALL,
     "fanout(n=None) -> the next fan-out number (n: go on after n at least)"},
    {"link_inbound", (PyCFunction)Relay_link_inbound, METH_VARARGS,
     "link_inbound((from, sent, batch, mac, beat)): the thread reads routed messages."},
    {"link_writer", (PyCFunction)Relay_link_writer, METH_VARARGS,
     "link_writer(topic, origin, age_ms) -> int"},
    {"link_learn_in", (PyCFunction)Relay_link_learn_in, METH_VARARGS,
     "link_learn_in(writer, gd, key, max_frame, dests, slot) -> bool"},
    {"link_seen", (PyCFunction)Relay_link_seen, METH_VARARGS, "link_seen(run, seq)"},
    {"link_floor", (PyCFunction)Relay_link_floor, METH_VARARGS, "link_floor(run) -> int"},
    {"_hmac", (PyCFunction)Relay_hmac, METH_VARARGS, "_hmac(key, data) -> hex (tests only)."},
    {"invalidate", (PyCFunction)(void (*)(void))Relay_invalidate, METH_FASTCALL,
     "invalidate(slot=-1): forget the routes of a group slot (-1: every route)."},
    {"upcalls", (PyCFunction)Relay_upcalls, METH_NOARGS, "upcalls() -> [(cid, kind, data)]"},
    {"collect", (PyCFunction)Relay_collect, METH_NOARGS, "collect() -> (per-connection, now)"},
    {"room", (PyCFunction)Relay_room, METH_NOARGS, "room() -> bytes it may still hold"},
    {"info", (PyCFunction)Relay_info, METH_NOARGS, "info() -> dict"},
    {"_fail_upcalls", (PyCFunction)Relay_fail_upcalls, METH_VARARGS,
     "_fail_upcalls(n): the next n upcalls fail as if out of memory (tests only)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RelayType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gossiprouter.server._relay.Relay",
    .tp_basicsize = sizeof(Relay),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The compiled fast path: a relay thread (see the module's source).",
    .tp_new = Relay_new,
    .tp_init = (initproc)Relay_init,
    .tp_dealloc = (destructor)Relay_dealloc,
    .tp_methods = Relay_methods,
};

static struct PyModuleDef relaymodule = {
    PyModuleDef_HEAD_INIT, "gossiprouter.server._relay",
    "The optional compiled fast path of gossiprouter (docs/performance.md, Light load).", -1,
    NULL,
};

PyMODINIT_FUNC PyInit__relay(void) {
    if (PyType_Ready(&RelayType) < 0) return NULL;
    PyObject *m = PyModule_Create(&relaymodule);
    if (m == NULL) return NULL;
    Py_INCREF(&RelayType);
    if (PyModule_AddObject(m, "Relay", (PyObject *)&RelayType) < 0) {
        Py_DECREF(&RelayType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "NATIVE", NATIVE);
    PyModule_AddIntConstant(m, "JG2", JG2);
    PyModule_AddIntConstant(m, "JG5", JG5);
    PyModule_AddIntConstant(m, "MQTT", MQTT);
    PyModule_AddIntConstant(m, "DATA", UP_DATA);
    PyModule_AddIntConstant(m, "EOF", UP_EOF);
    PyModule_AddIntConstant(m, "ERROR", UP_ERROR);
    PyModule_AddIntConstant(m, "EVICT", UP_EVICT);
    PyModule_AddIntConstant(m, "LOST", UP_LOST);
    PyModule_AddIntConstant(m, "REMOTE", UP_REMOTE);
    PyModule_AddIntConstant(m, "REMOTE_J5", UP_REMOTE_J5);
    PyModule_AddIntConstant(m, "REMOTE_J2", UP_REMOTE_J2);
    PyModule_AddIntConstant(m, "GROUP_SLOTS", GROUP_SLOTS);
    PyModule_AddIntConstant(m, "MAX_HOLD", MAX_HOLD);
    return m;
}
