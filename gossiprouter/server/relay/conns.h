/*
 * Python's methods on one connection (conns.c): how Python hands a connection to the thread
 * and takes it back. module.c puts them in the type's method table.
 */
#ifndef GOSSIPROUTER_RELAY_CONNS_H
#define GOSSIPROUTER_RELAY_CONNS_H

#include "relay.h"

/* A cid from Python: ValueError when it cannot be one (negative, or beyond the id space,
 * which would alias a live connection's index and generation). */
static inline int check_cid(long long cid) {
    if (cid < 0 || cid >= CID_LIMIT) {
        PyErr_Format(PyExc_ValueError, "relay connection id %lld out of range", cid);
        return -1;
    }
    return 0;
}

/* The connection ids of ``dests`` (a sequence), in a new array (*n of them, at least ``min``):
 * NULL with an exception set when it is not one (what: the caller's name for errors). */
RELAY_INTERNAL int64_t *read_cids(PyObject *dests, Py_ssize_t min, Py_ssize_t *n,
                                  const char *what);
RELAY_INTERNAL void free_conn(conn_t *c);
RELAY_INTERNAL PyObject *Relay_open(Relay *self, PyObject *args);
RELAY_INTERNAL PyObject *Relay_read(Relay *self, PyObject *args);
RELAY_INTERNAL PyObject *Relay_unread(Relay *self, PyObject *args);
RELAY_INTERNAL PyObject *Relay_attach(Relay *self, PyObject *args);
RELAY_INTERNAL PyObject *Relay_take(Relay *self, PyObject *args);
RELAY_INTERNAL PyObject *Relay_close(Relay *self, PyObject *args);
RELAY_INTERNAL PyObject *Relay_send(Relay *self, PyObject *const *args, Py_ssize_t nargs);

#endif
