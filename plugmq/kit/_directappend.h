/* The direct append: a store's plain single append, called by a compiled caller without Python
 * objects in between (plugmq.core.contracts.DirectAppending).
 *
 * The store hands out a PyCapsule named PLUGMQ_DIRECT_APPEND whose pointer is a DirectAppend:
 * `append(context, fields, out, msg_id)` stores one record whose AppendRequest fields are
 * `fields[DA_TOPIC..DA_PREPARED]` (borrowed; in AppendRequest's field order, properties a dict)
 * with every check, refusal and error the store's `append` has, and answers
 *   1: stored; out = (queue offset, commit-log offset, size, store timestamp), *msg_id a new str;
 *   0: not taken, nothing done (the store's publish step is not empty now: a log listener or a
 *      flush wait): the caller calls the store's `append`;
 *  -1: an error is set (nothing stored, as `append` raises it).
 * `append_many(context, n, fields, rows, ts)` does the same for n >= 1 records at once (fields:
 * n * DA_FIELDS, request after request; the store's batch append: every record is checked
 * before any is written) and on 1 fills rows with 3 int64 per record (queue offset, commit-log
 * offset, size) and *ts with their one store timestamp. `id_prefix`: the 16 characters every
 * message id of this store starts with (the commit-log offset in 16 hex digits follows).
 * `context` keeps the store's kernel alive while the capsule lives.
 */
#ifndef PLUGMQ_DIRECTAPPEND_H
#define PLUGMQ_DIRECTAPPEND_H

#include <Python.h>
#include <stdint.h>

#define PLUGMQ_DIRECT_APPEND "plugmq.direct_append"
#define PLUGMQ_DIRECT_APPEND_VERSION 2

enum { DA_TOPIC, DA_QUEUE_ID, DA_BODY, DA_PROPERTIES, DA_TAGS_CODE, DA_BORN_TS, DA_BORN_HOST, DA_RECONSUME,
       DA_SYS_FLAG, DA_PREPARED, DA_FIELDS };

typedef struct {
    int version;
    PyObject *context; /* strong reference */
    int (*append)(PyObject *context, PyObject *const *fields, int64_t out[4], PyObject **msg_id);
    int (*append_many)(PyObject *context, Py_ssize_t n, PyObject *const *fields, int64_t *rows, int64_t *ts);
    char id_prefix[16];
} DirectAppend;

#endif
