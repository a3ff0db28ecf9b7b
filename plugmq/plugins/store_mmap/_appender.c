/* The compiled append kernel of store_mmap: encode records and place them in the mapped files.
 *
 * Why C: in CPython every field packed, every CRC, every consume-queue entry and every result
 * object costs a few hundred nanoseconds of interpreter work, about as much as a whole raw
 * append; measured, the pure-Python append path (appender.py, kept as the reference and the
 * fallback) stays below a third of a raw mmap append loop. This kernel does the same work, byte
 * for byte, in one call per append or per batch.
 *
 * Contract (see appender.py, PyAppender, for the same algorithm in Python):
 *   put(requests, start, results) -> int
 *     Called under the store's put lock. First checks and encodes every request of
 *     requests[start:] (raising ValidationError / StoreError / MessageTooLargeError before
 *     anything is written), then writes records straight into the current commit-log segment
 *     and their 20-byte entries into the consume-queue files, appends one AppendResult per record
 *     to `results`, and publishes the new commit-log end, then the new queue max offsets.
 *     It stops early when a file boundary needs Python (a segment roll-over, disk blocks for the
 *     segment or a queue file - every byte gets its blocks before it is written, so a full disk
 *     is an error, never a SIGBUS -, a queue never seen) and says which in `need`; it returns the
 *     index of the first request not placed. The caller provides what is needed and calls again.
 *   append_one(request) -> AppendResult | None   (None: see `need`, provide, call again)
 *   take_pending() -> bytes   index entries noted since the last call: native int64 triples
 *                             (RocketMQ index key hash of "topic#key", commit-log offset, store ts)
 *
 * Nothing here calls Python code between the first write and the publication, so readers (which
 * only look below the published ends) never see a partial record.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <zlib.h>

#include "../../kit/_hwcrc32.h" /* zlib's CRC-32, by ISA-L where it is installed */
#include "../../kit/_directappend.h" /* the direct append handed to a compiled caller */
#include "_layout.h"            /* offsets, magics and sizes: generated from layout.py */

#define QUEUE_CACHE 64
#define RELEASE_GIL_ABOVE (256 * 1024)

enum { NEED_NONE = 0, NEED_ROLL = 1, NEED_CQ_FILE = 2, NEED_QUEUE = 3, NEED_ALLOCATE = 4 };

/* zlib's CRC-32 (the one zlib.crc32 computes, so the Python twin writes the same bytes), by
 * ISA-L where it is installed (see _hwcrc32.h): ~5x cheaper per 1 KiB record. */
static inline uint32_t crc32_update(uint32_t crc, const unsigned char *p, size_t n) { return hwcrc32(crc, p, n); }

/* ------------------------------------------------------------------------------------------ */
/* small helpers                                                                               */
/* ------------------------------------------------------------------------------------------ */

static inline void put_be16(unsigned char *p, uint16_t v) {
    p[0] = (unsigned char)(v >> 8);
    p[1] = (unsigned char)v;
}
static inline void put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}
static inline void put_be64(unsigned char *p, uint64_t v) {
    put_be32(p, (uint32_t)(v >> 32));
    put_be32(p + 4, (uint32_t)v);
}

/* The layout of a types.MappingProxyType object; checked against a live proxy at import, and
 * only used when the check passed (otherwise properties go through the mapping protocol). */
typedef struct {
    PyObject_HEAD PyObject *mapping;
} proxy_layout;
static int proxy_layout_ok = 0;

static int str_eq(PyObject *a, PyObject *b) {
    if (a == b) return 1;
    Py_ssize_t n = PyUnicode_GET_LENGTH(a);
    if (n != PyUnicode_GET_LENGTH(b) || PyUnicode_KIND(a) != PyUnicode_KIND(b)) return 0;
    return memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b), (size_t)n * PyUnicode_KIND(a)) == 0;
}

/* Java String.hashCode continued over the UTF-16 code units of `s` (a str). */
static uint32_t java_hash_continue(uint32_t h, PyObject *s, Py_ssize_t begin, Py_ssize_t end) {
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    for (Py_ssize_t i = begin; i < end; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c > 0xFFFF) {
            c -= 0x10000;
            h = 31u * h + (0xD800u + (c >> 10));
            h = 31u * h + (0xDC00u + (c & 0x3FF));
        } else {
            h = 31u * h + c;
        }
    }
    return h;
}

static int64_t index_hash(uint32_t h) {
    /* RocketMQ: abs(key.hashCode()), with Integer.MIN_VALUE (whose abs stays negative) as 0 */
    int32_t s = (int32_t)h;
    if (s == INT32_MIN) return 0;
    return s < 0 ? -(int64_t)s : (int64_t)s;
}

/* ------------------------------------------------------------------------------------------ */
/* the Appender type                                                                           */
/* ------------------------------------------------------------------------------------------ */

enum {
    RQ_TOPIC,
    RQ_QUEUE_ID,
    RQ_BODY,
    RQ_PROPERTIES,
    RQ_TAGS_CODE,
    RQ_BORN_TS,
    RQ_BORN_HOST,
    RQ_RECONSUME,
    RQ_SYS_FLAG,
    RQ_PREPARED,
    RQ_FIELDS
};
static const char *request_fields[RQ_FIELDS] = {
    "topic",     "queue_id",        "body",            "properties", "tags_code",
    "born_timestamp_ms", "born_host", "reconsume_times", "sys_flag",   "prepared_transaction_offset"};

enum { RS_STATUS, RS_MSG_ID, RS_QUEUE_OFFSET, RS_PHYS, RS_SIZE, RS_STORE_TS, RS_FIELDS };
static const char *result_fields[RS_FIELDS] = {"status", "msg_id", "queue_offset", "commit_log_offset",
                                               "size", "store_timestamp_ms"};

typedef struct {
    PyObject *topic;      /* new reference */
    PyObject *body;       /* new reference */
    PyObject *topic_info; /* new reference: (prefix bytes, bare tail bytes, bare tail crc) */
    Py_ssize_t props_off; /* serialized properties in the scratch buffer, or -1 for none */
    Py_ssize_t props_len;
    uint32_t tail_crc;
    int32_t queue_id, sys_flag, flag, reconsume;
    int64_t born_ts, prepared, tags_code;
    unsigned char born[8];
    Py_ssize_t total;
    Py_ssize_t hash_off, hash_count;
} Rec;

/* A consume queue the kernel wrote to: kept between calls, checked against the queue once per call. */
typedef struct {
    PyObject *topic; /* strong references */
    PyObject *cq;
    PyObject *file;  /* the queue's current file (cq._cur) when the view was taken, or NULL */
    int32_t queue_id;
    int64_t max_offset, published, base, per_file, room; /* room: entries of the file with disk blocks */
    unsigned long checked; /* the call that last checked this slot against the queue */
    Py_buffer view;
    int has_view;
} QueueSlot;

typedef struct {
    PyObject_HEAD
    unsigned char store_host[8];
    char id_prefix[16];
    PyObject *topics, *learn_topic, *hosts, *host_bytes, *queues, *commit_log, *now_ms, *check_body_size;
    PyObject *validation_error, *store_error;
    /* the store around the kernel (bind()): its put lock, write gate, and the Python halves */
    PyObject *lock_acquire, *lock_release, *retention, *check_writable, *provide, *make_room, *drain, *closed_message;
    Py_ssize_t index_batch;
    double next_check;
    int closed;
    PyObject *request_type, *result_type, *put_ok;
    PyObject *request_get[RQ_FIELDS];
    Py_ssize_t request_off[RQ_FIELDS]; /* slot offsets of the request's fields, or -1 */
    PyObject *result_set[RS_FIELDS];
    Py_ssize_t result_off[RS_FIELDS];
    PyObject *keys_name, *uniq_name, *born_host_name;
    long long max_body, max_record, segment_size;
    int index_unique;
    /* state */
    long long last_ts, messages, appended_bytes;
    Py_ssize_t pending_count;
    int64_t *pending;
    Py_ssize_t pending_cap;
    int need;
    long long need_size, need_qoff;
    PyObject *need_cq, *need_topic;
    long long need_qid;
    int busy, system_clock;
    unsigned long busy_thread; /* who set busy: another thread waits on the put lock, the same one re-entered */
    unsigned long call;
    /* the current commit-log segment, kept (with its buffer) while it stays current */
    PyObject *seg;
    Py_buffer seg_view;
    int has_seg_view;
    int64_t seg_start, seg_size, seg_allocated; /* allocated: bytes of the segment with disk blocks */
    QueueSlot slots[QUEUE_CACHE];
    int nslots;
    /* the last topic and born host seen, with what they map to */
    PyObject *last_topic, *last_topic_info, *last_host, *last_host_packed;
    uint32_t last_topic_hash; /* Java hash of "<last_topic>#" */
    /* scratch reused across calls */
    char *scratch;
    Py_ssize_t scratch_len, scratch_cap;
    Rec *recs;
    Py_ssize_t recs_cap;
    int64_t *hashes;
    Py_ssize_t hashes_len, hashes_cap;
    /* append_columns: (queue offset, commit-log offset, size) per record instead of AppendResults */
    int columnar;
    int64_t *cols;
    Py_ssize_t cols_len, cols_cap;
    /* the direct append (direct_capsule): allowed while the store's publish step is empty; the
     * request's fields of the call under way (read instead of a request object's) */
    int direct;
    PyObject *const *direct_fields, *const *direct_at; /* direct_at: the fields of the request being encoded */
} Appender;

static PyObject *S_allocated, *S_room, *S_full, *S_next_check, *S_cur, *S_wrote, *S_start, *S_size, *S_mm, *S_max_offset, *S_cq_cur, *S_cq_base, *S_per_file,
    *S_topic_kw;

static int grow(void **buf, Py_ssize_t *cap, Py_ssize_t need, size_t item) {
    if (need <= *cap) return 0;
    Py_ssize_t cap2 = *cap ? *cap : 64;
    while (cap2 < need) cap2 *= 2;
    void *p = PyMem_Realloc(*buf, (size_t)cap2 * item);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *buf = p;
    *cap = cap2;
    return 0;
}

static int scratch_put(Appender *self, const char *data, Py_ssize_t n) {
    if (grow((void **)&self->scratch, &self->scratch_cap, self->scratch_len + n, 1) < 0) return -1;
    memcpy(self->scratch + self->scratch_len, data, (size_t)n);
    self->scratch_len += n;
    return 0;
}

static int hash_put(Appender *self, int64_t h) {
    if (grow((void **)&self->hashes, &self->hashes_cap, self->hashes_len + 1, sizeof(int64_t)) < 0) return -1;
    self->hashes[self->hashes_len++] = h;
    return 0;
}

static PyObject *get_field(Appender *self, PyObject *req, int field) {
    if (req == NULL) return Py_NewRef(self->direct_at[field]); /* a direct append's fields */
    if (Py_TYPE(req) == (PyTypeObject *)self->request_type) {
        Py_ssize_t off = self->request_off[field];
        if (off >= 0) { /* the slot itself, as member_descriptor.__get__ reads it */
            PyObject *v = *(PyObject **)((char *)req + off);
            if (v != NULL) return Py_NewRef(v);
        }
        PyObject *d = self->request_get[field];
        if (d != NULL) return Py_TYPE(d)->tp_descr_get(d, req, self->request_type);
    }
    return PyObject_GetAttrString(req, request_fields[field]);
}

/* The offset of a T_OBJECT_EX slot behind a member descriptor, or -1. */
static Py_ssize_t slot_offset(PyObject *descr) {
    if (Py_TYPE(descr) != &PyMemberDescr_Type) return -1;
    PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
    if (m == NULL || m->type != T_OBJECT_EX || (m->flags & READONLY)) return -1;
    return m->offset;
}

/* An int field into [lo, hi]; -1 with ValidationError otherwise. */
static int int_field(Appender *self, PyObject *req, int field, long long lo, long long hi, long long *out) {
    PyObject *v = get_field(self, req, field);
    if (v == NULL) return -1;
    if (!PyLong_Check(v)) {
        PyErr_Format(self->validation_error, "append request field %s must be an int, got %R", request_fields[field], v);
        Py_DECREF(v);
        return -1;
    }
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred()) {
        Py_DECREF(v);
        return -1;
    }
    if (field == RQ_QUEUE_ID && (overflow < 0 || (!overflow && x < 0))) {
        PyErr_Format(self->validation_error, "queue id must be >= 0, got %R", v);
        Py_DECREF(v);
        return -1;
    }
    if (overflow || x < lo || x > hi) {
        PyErr_Format(self->validation_error,
                     "append request field out of range (%s = %R): queue_id, sys_flag and reconsume_times must "
                     "fit int32; born_timestamp_ms, prepared_transaction_offset and tags_code int64",
                     request_fields[field], v);
        Py_DECREF(v);
        return -1;
    }
    Py_DECREF(v);
    *out = x;
    return 0;
}

/* UTF-8 of a str with surrogates passed through (as Python's "surrogatepass"); *tmp holds a
 * temporary bytes object to release after use, or NULL. */
static const char *utf8_of(PyObject *s, Py_ssize_t *len, PyObject **tmp) {
    *tmp = NULL;
    const char *u = PyUnicode_AsUTF8AndSize(s, len);
    if (u != NULL) return u;
    if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) return NULL;
    PyErr_Clear();
    *tmp = PyUnicode_AsEncodedString(s, "utf-8", "surrogatepass");
    if (*tmp == NULL) return NULL;
    *len = PyBytes_GET_SIZE(*tmp);
    return PyBytes_AS_STRING(*tmp);
}

static int has_separator(const char *p, Py_ssize_t n) {
    return memchr(p, '\x01', (size_t)n) != NULL || memchr(p, '\x02', (size_t)n) != NULL;
}

/* Append "key\x01value\x02" to the scratch buffer. */
static int put_property(Appender *self, PyObject *key, PyObject *value) {
    if (!PyUnicode_Check(key)) {
        PyErr_Format(self->validation_error, "property names must be strings, got %R", key);
        return -1;
    }
    if (!PyUnicode_Check(value)) {
        PyErr_Format(self->validation_error, "property %R must be a string, got %s", key, Py_TYPE(value)->tp_name);
        return -1;
    }
    PyObject *kt, *vt;
    Py_ssize_t kn, vn;
    const char *k = utf8_of(key, &kn, &kt);
    if (k == NULL) return -1;
    const char *v = utf8_of(value, &vn, &vt);
    if (v == NULL) {
        Py_XDECREF(kt);
        return -1;
    }
    int rc = 0;
    if (has_separator(k, kn) || has_separator(v, vn)) {
        PyErr_Format(self->validation_error,
                     "property %R contains \\x01 or \\x02, the separators of the stored property string", key);
        rc = -1;
    } else if (scratch_put(self, k, kn) < 0 || scratch_put(self, "\x01", 1) < 0 || scratch_put(self, v, vn) < 0 ||
               scratch_put(self, "\x02", 1) < 0) {
        rc = -1;
    }
    Py_XDECREF(kt);
    Py_XDECREF(vt);
    return rc;
}

/* Index hashes of "topic#key" for every whitespace-separated key of `keys` (str.split()). */
static int note_keys(Appender *self, uint32_t topic_hash, PyObject *keys, int split) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(keys);
    if (!split) return n ? hash_put(self, index_hash(java_hash_continue(topic_hash, keys, 0, n))) : 0;
    int kind = PyUnicode_KIND(keys);
    const void *data = PyUnicode_DATA(keys);
    Py_ssize_t i = 0;
    while (i < n) {
        while (i < n && Py_UNICODE_ISSPACE(PyUnicode_READ(kind, data, i))) i++;
        Py_ssize_t begin = i;
        while (i < n && !Py_UNICODE_ISSPACE(PyUnicode_READ(kind, data, i))) i++;
        if (i > begin && hash_put(self, index_hash(java_hash_continue(topic_hash, keys, begin, i))) < 0) return -1;
    }
    return 0;
}

static void clear_recs(Appender *self, Py_ssize_t count) {
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_CLEAR(self->recs[i].topic);
        Py_CLEAR(self->recs[i].body);
        Py_CLEAR(self->recs[i].topic_info);
    }
}

/* Check and encode one request into rec (pass 1). */
static int encode(Appender *self, PyObject *req, Rec *rec) {
    long long x;
    PyObject *topic = get_field(self, req, RQ_TOPIC);
    if (topic == NULL) return -1;
    rec->topic = topic;
    if (!PyUnicode_Check(topic)) {
        PyErr_Format(self->validation_error, "topic must be a string, got %R", topic);
        return -1;
    }
    PyObject *info;
    if (topic == self->last_topic) {
        info = Py_NewRef(self->last_topic_info);
    } else {
        info = PyDict_GetItemWithError(self->topics, topic);
        if (info == NULL) {
            if (PyErr_Occurred()) return -1;
            info = PyObject_CallOneArg(self->learn_topic, topic); /* validates the name (it becomes a directory) */
            if (info == NULL) return -1;
        } else {
            Py_INCREF(info);
        }
        Py_INCREF(topic);
        Py_XSETREF(self->last_topic, topic);
        Py_INCREF(info);
        Py_XSETREF(self->last_topic_info, info);
        self->last_topic_hash = 31u * java_hash_continue(0, topic, 0, PyUnicode_GET_LENGTH(topic)) + '#';
    }
    rec->topic_info = info;
    if (!PyTuple_Check(info) || PyTuple_GET_SIZE(info) != 3 || !PyBytes_Check(PyTuple_GET_ITEM(info, 0)) ||
        !PyBytes_Check(PyTuple_GET_ITEM(info, 1))) {
        PyErr_SetString(PyExc_TypeError, "learn_topic must return (prefix: bytes, bare tail: bytes, crc: int)");
        return -1;
    }
    if (int_field(self, req, RQ_QUEUE_ID, 0, INT32_MAX, &x) < 0) return -1;
    rec->queue_id = (int32_t)x;

    PyObject *body = get_field(self, req, RQ_BODY);
    if (body == NULL) return -1;
    rec->body = body;
    if (!PyBytes_Check(body)) {
        PyErr_Format(self->validation_error, "append request body must be bytes, got %s", Py_TYPE(body)->tp_name);
        return -1;
    }
    Py_ssize_t body_len = PyBytes_GET_SIZE(body);
    if (body_len > self->max_body) {
        PyObject *limit = PyLong_FromLongLong(self->max_body);
        PyObject *kw = limit ? PyDict_New() : NULL;
        if (kw != NULL && PyDict_SetItem(kw, S_topic_kw, topic) == 0) {
            PyObject *args = PyTuple_Pack(2, body, limit);
            if (args != NULL) {
                PyObject *r = PyObject_Call(self->check_body_size, args, kw);
                Py_XDECREF(r);
                Py_DECREF(args);
            }
        }
        Py_XDECREF(kw);
        Py_XDECREF(limit);
        if (!PyErr_Occurred())
            PyErr_Format(self->validation_error, "message body of %zd bytes is over the limit", body_len);
        return -1;
    }
    if (int_field(self, req, RQ_SYS_FLAG, INT32_MIN, INT32_MAX, &x) < 0) return -1;
    rec->sys_flag = (int32_t)x;
    if (int_field(self, req, RQ_RECONSUME, INT32_MIN, INT32_MAX, &x) < 0) return -1;
    rec->reconsume = (int32_t)x;
    if (int_field(self, req, RQ_BORN_TS, INT64_MIN, INT64_MAX, &x) < 0) return -1;
    rec->born_ts = x;
    if (int_field(self, req, RQ_PREPARED, INT64_MIN, INT64_MAX, &x) < 0) return -1;
    rec->prepared = x;
    if (int_field(self, req, RQ_TAGS_CODE, INT64_MIN, INT64_MAX, &x) < 0) return -1;
    rec->tags_code = x;

    /* born host: 8 bytes when IPv4:port, else a private property and a flag */
    PyObject *host = get_field(self, req, RQ_BORN_HOST);
    if (host == NULL) return -1;
    if (!PyUnicode_Check(host)) {
        PyErr_Format(self->validation_error, "born_host must be a string 'ip:port', got %R", host);
        Py_DECREF(host);
        return -1;
    }
    PyObject *packed;
    if (host == self->last_host) {
        packed = Py_NewRef(self->last_host_packed);
    } else {
        packed = PyDict_GetItemWithError(self->hosts, host);
        if (packed == NULL) {
            if (PyErr_Occurred()) {
                Py_DECREF(host);
                return -1;
            }
            packed = PyObject_CallOneArg(self->host_bytes, host);
            if (packed == NULL) {
                Py_DECREF(host);
                return -1;
            }
        } else {
            Py_INCREF(packed);
        }
        Py_INCREF(host);
        Py_XSETREF(self->last_host, host);
        Py_INCREF(packed);
        Py_XSETREF(self->last_host_packed, packed);
    }
    rec->flag = 0;
    if (PyBytes_Check(packed) && PyBytes_GET_SIZE(packed) == 8) {
        memcpy(rec->born, PyBytes_AS_STRING(packed), 8);
    } else {
        memset(rec->born, 0, 8);
        rec->flag = FLAG_BORN_HOST_IN_PROPS;
    }
    Py_DECREF(packed);

    /* properties: "k\x01v\x02"... into the scratch buffer; KEYS and the unique id are indexed */
    PyObject *props = get_field(self, req, RQ_PROPERTIES);
    if (props == NULL) {
        Py_DECREF(host);
        return -1;
    }
    PyObject *dict = NULL, *items = NULL;
    if (PyDict_Check(props)) {
        dict = props;
    } else if (proxy_layout_ok && Py_TYPE(props) == &PyDictProxy_Type &&
               PyDict_Check(((proxy_layout *)props)->mapping)) {
        dict = ((proxy_layout *)props)->mapping;
    } else {
        items = PyMapping_Items(props);
        if (items == NULL) {
            Py_DECREF(host);
            Py_DECREF(props);
            return -1;
        }
    }
    Py_ssize_t start = self->scratch_len;
    PyObject *keys = NULL, *uniq = NULL; /* borrowed, alive while props is */
    Py_ssize_t count = dict ? PyDict_GET_SIZE(dict) : PyList_GET_SIZE(items);
    Py_ssize_t pos = 0;
    int rc = 0;
    for (Py_ssize_t i = 0; i < count && rc == 0; i++) {
        PyObject *k, *v;
        if (dict) {
            if (!PyDict_Next(dict, &pos, &k, &v)) break;
        } else {
            PyObject *pair = PyList_GET_ITEM(items, i);
            if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
                PyErr_SetString(self->validation_error, "properties must be a mapping of str to str");
                rc = -1;
                break;
            }
            k = PyTuple_GET_ITEM(pair, 0);
            v = PyTuple_GET_ITEM(pair, 1);
        }
        if (PyUnicode_Check(k)) {
            if (rec->flag && str_eq(k, self->born_host_name)) continue; /* replaced below */
            if (PyUnicode_Check(v)) {
                if (str_eq(k, self->keys_name))
                    keys = v;
                else if (str_eq(k, self->uniq_name))
                    uniq = v;
            }
        }
        rc = put_property(self, k, v);
    }
    if (rc == 0 && rec->flag) rc = put_property(self, self->born_host_name, host);
    Py_DECREF(host);
    Py_ssize_t props_len = self->scratch_len - start;
    rec->hash_off = self->hashes_len;
    if (rc == 0 && props_len > MAX_PROPERTIES_BYTES) {
        PyErr_Format(self->store_error,
                     "serialized properties are %zd bytes; a record holds at most %d (move large values into the body)",
                     props_len, MAX_PROPERTIES_BYTES);
        rc = -1;
    }
    if (rc == 0 && (keys != NULL || (uniq != NULL && self->index_unique))) {
        uint32_t th = self->last_topic_hash; /* encode() made `topic` the last topic */
        if (keys != NULL) rc = note_keys(self, th, keys, 1);
        if (rc == 0 && uniq != NULL && self->index_unique) rc = note_keys(self, th, uniq, 0);
    }
    rec->hash_count = self->hashes_len - rec->hash_off;
    Py_XDECREF(items);
    Py_DECREF(props);
    if (rc < 0) return -1;

    PyObject *prefix = PyTuple_GET_ITEM(info, 0);
    Py_ssize_t prefix_len = PyBytes_GET_SIZE(prefix);
    if (props_len > 0) {
        rec->props_off = start;
        rec->props_len = props_len; /* the tail's CRC is taken when it is written */
    } else {
        rec->props_off = -1;
        rec->props_len = 0;
        rec->tail_crc = (uint32_t)PyLong_AsUnsignedLongMask(PyTuple_GET_ITEM(info, 2));
        if (PyErr_Occurred()) return -1;
    }
    rec->total = HEADER_SIZE + body_len + prefix_len + PROPS_LEN_SIZE + props_len;
    if (rec->total > self->max_record) {
        PyErr_Format(self->store_error,
                     "a record of %zd bytes (body %zd, topic and properties %zd, header %d) does not fit a "
                     "commit-log segment of %lld bytes (at most %lld per record); raise commit_log_segment_size "
                     "or send less",
                     rec->total, body_len, prefix_len + PROPS_LEN_SIZE + props_len, HEADER_SIZE, self->segment_size,
                     self->max_record);
        return -1;
    }
    return 0;
}

/* -- placing (pass 2) ------------------------------------------------------------------------ */

static int get_ll(PyObject *obj, PyObject *name, int64_t *out) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) return -1;
    long long x = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred()) return -1;
    *out = x;
    return 0;
}

/* An int attribute, or `fallback` when the object has no such attribute. */
static int get_ll_or(PyObject *obj, PyObject *name, int64_t fallback, int64_t *out) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
        PyErr_Clear();
        *out = fallback;
        return 0;
    }
    long long x = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred()) return -1;
    *out = x;
    return 0;
}

static int set_ll(PyObject *obj, PyObject *name, int64_t value) {
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL) return -1;
    int rc = PyObject_SetAttr(obj, name, v);
    Py_DECREF(v);
    return rc;
}

static void drop_segment(Appender *self) {
    if (self->has_seg_view) PyBuffer_Release(&self->seg_view);
    self->has_seg_view = 0;
    Py_CLEAR(self->seg);
}

static void drop_queue_file(QueueSlot *q) {
    if (q->has_view) PyBuffer_Release(&q->view);
    q->has_view = 0;
    Py_CLEAR(q->file);
}

static void drop_queues(Appender *self) {
    for (int i = 0; i < self->nslots; i++) {
        drop_queue_file(&self->slots[i]);
        Py_CLEAR(self->slots[i].topic);
        Py_CLEAR(self->slots[i].cq);
    }
    self->nslots = 0;
}

/* The commit log's current segment and write position. The segment's buffer is kept between
 * calls while the segment stays current (the export also keeps its mapping from being closed). */
static int load_segment(Appender *self, int64_t *pos) {
    PyObject *cur = PyObject_GetAttr(self->commit_log, S_cur);
    if (cur == NULL) return -1;
    if (cur == Py_None) {
        Py_DECREF(cur);
        drop_segment(self);
        PyErr_SetString(self->store_error, "the commit log has no open segment (the store is closed)");
        return -1;
    }
    if (cur != self->seg) {
        drop_segment(self);
        self->seg = cur; /* takes the reference */
        PyObject *mm = PyObject_GetAttr(cur, S_mm);
        if (mm == NULL) {
            Py_CLEAR(self->seg);
            return -1;
        }
        int rc = PyObject_GetBuffer(mm, &self->seg_view, PyBUF_WRITABLE);
        Py_DECREF(mm);
        if (rc < 0) {
            Py_CLEAR(self->seg);
            return -1;
        }
        self->has_seg_view = 1;
        if (get_ll(cur, S_start, &self->seg_start) < 0 || get_ll(cur, S_size, &self->seg_size) < 0) {
            drop_segment(self);
            return -1;
        }
        if (self->seg_view.len < self->seg_size) {
            drop_segment(self);
            PyErr_SetString(self->store_error, "commit-log segment mapping is shorter than the segment");
            return -1;
        }
    } else {
        Py_DECREF(cur);
    }
    if (get_ll_or(self->seg, S_allocated, self->seg_size, &self->seg_allocated) < 0) return -1;
    int64_t wrote;
    if (get_ll(self->commit_log, S_wrote, &wrote) < 0) return -1;
    *pos = wrote - self->seg_start;
    if (*pos < 0 || *pos > self->seg_size) {
        PyErr_Format(self->store_error, "commit-log write position %lld is outside its segment", (long long)wrote);
        return -1;
    }
    return 0;
}

/* Bring a slot in line with its queue (once per call): its current file and max offset. */
static int check_slot(Appender *self, QueueSlot *q) {
    q->checked = self->call;
    if (get_ll(q->cq, S_max_offset, &q->max_offset) < 0) return -1;
    if (get_ll_or(q->cq, S_room, INT64_MAX, &q->room) < 0) return -1;
    q->published = q->max_offset;
    PyObject *cur = PyObject_GetAttr(q->cq, S_cq_cur);
    if (cur == NULL) return -1;
    if (cur == q->file) {
        Py_DECREF(cur);
        return 0;
    }
    drop_queue_file(q);
    q->base = INT64_MIN; /* no usable file: the first record asks for one */
    if (cur == Py_None) {
        Py_DECREF(cur);
        return 0;
    }
    q->file = cur;
    PyObject *mm = PyObject_GetAttr(cur, S_mm);
    if (mm == NULL) return -1;
    int rc = PyObject_GetBuffer(mm, &q->view, PyBUF_WRITABLE);
    Py_DECREF(mm);
    if (rc < 0) return -1;
    q->has_view = 1;
    int64_t base;
    if (get_ll(q->cq, S_cq_base, &base) < 0 || get_ll(q->cq, S_per_file, &q->per_file) < 0) return -1;
    if (q->view.len < q->per_file * CQ_ENTRY_SIZE) {
        PyErr_SetString(self->store_error, "consume-queue file is shorter than its entries");
        return -1;
    }
    q->base = base;
    return 0;
}

/* Make what this call wrote visible: commit-log end first, then the queue ends. */
static int publish(Appender *self, int64_t pos, int64_t wrote0) {
    int rc = 0;
    if (self->seg != NULL && self->seg_start + pos != wrote0) {
        if (set_ll(self->commit_log, S_wrote, self->seg_start + pos) < 0) rc = -1;
    }
    for (int i = 0; i < self->nslots; i++) {
        QueueSlot *q = &self->slots[i];
        if (q->checked == self->call && q->max_offset != q->published) {
            if (set_ll(q->cq, S_max_offset, q->max_offset) < 0) rc = -1;
            else q->published = q->max_offset;
        }
    }
    return rc;
}

/* The slot of (topic, queue id); NULL with `need` set (or an error). */
static QueueSlot *queue_slot(Appender *self, PyObject *topic, int32_t queue_id, int64_t pos, int64_t *wrote0) {
    for (int i = 0; i < self->nslots; i++) {
        QueueSlot *q = &self->slots[i];
        if (q->queue_id == queue_id && str_eq(q->topic, topic)) {
            if (q->checked != self->call && check_slot(self, q) < 0) return NULL;
            return q;
        }
    }
    PyObject *qid = PyLong_FromLong(queue_id);
    if (qid == NULL) return NULL;
    PyObject *key = PyTuple_Pack(2, topic, qid);
    Py_DECREF(qid);
    if (key == NULL) return NULL;
    PyObject *cq = PyDict_GetItemWithError(self->queues, key);
    Py_DECREF(key);
    if (cq == NULL) {
        if (PyErr_Occurred()) return NULL;
        self->need = NEED_QUEUE;
        Py_INCREF(topic);
        Py_XSETREF(self->need_topic, topic);
        self->need_qid = queue_id;
        return NULL;
    }
    if (self->nslots == QUEUE_CACHE) { /* many queues: publish, then forget them all */
        if (publish(self, pos, *wrote0) < 0) return NULL;
        *wrote0 = self->seg_start + pos;
        drop_queues(self);
    }
    QueueSlot *q = &self->slots[self->nslots++];
    memset(q, 0, sizeof(*q));
    q->topic = Py_NewRef(topic);
    q->cq = Py_NewRef(cq);
    q->queue_id = queue_id;
    q->base = INT64_MIN;
    if (check_slot(self, q) < 0) return NULL;
    return q;
}

static long long now_ms(Appender *self) {
    if (self->system_clock) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
    }
    PyObject *now = PyObject_CallNoArgs(self->now_ms);
    if (now == NULL) return -1;
    long long ts = PyLong_AsLongLong(now);
    Py_DECREF(now);
    return ts;
}

/* The message id of the record at `phys`: the store's 16-character prefix, then phys in hex. */
static PyObject *make_msg_id(Appender *self, int64_t phys) {
    static const char hex[] = "0123456789ABCDEF";
    PyObject *msg_id = PyUnicode_New(32, 127);
    if (msg_id == NULL) return NULL;
    Py_UCS1 *d = PyUnicode_1BYTE_DATA(msg_id);
    memcpy(d, self->id_prefix, 16);
    for (int i = 0; i < 16; i++) d[16 + i] = (Py_UCS1)hex[((uint64_t)phys >> (60 - 4 * i)) & 0xF];
    return msg_id;
}

static PyObject *make_result(Appender *self, int64_t qoff, int64_t phys, Py_ssize_t total, int64_t ts) {
    PyObject *msg_id = make_msg_id(self, phys);
    if (msg_id == NULL) return NULL;
    PyObject *values[RS_FIELDS];
    values[RS_STATUS] = Py_NewRef(self->put_ok);
    values[RS_MSG_ID] = msg_id;
    values[RS_QUEUE_OFFSET] = PyLong_FromLongLong(qoff);
    values[RS_PHYS] = PyLong_FromLongLong(phys);
    values[RS_SIZE] = PyLong_FromSsize_t(total);
    values[RS_STORE_TS] = PyLong_FromLongLong(ts);
    PyObject *result = NULL;
    if (values[RS_QUEUE_OFFSET] && values[RS_PHYS] && values[RS_SIZE] && values[RS_STORE_TS]) {
        PyTypeObject *type = (PyTypeObject *)self->result_type;
        result = type->tp_alloc(type, 0); /* zero-filled: every slot starts empty */
        for (int i = 0; result != NULL && i < RS_FIELDS; i++) {
            Py_ssize_t off = self->result_off[i];
            if (off >= 0) { /* what member_descriptor.__set__ does to an empty slot */
                *(PyObject **)((char *)result + off) = values[i];
                values[i] = NULL;
                continue;
            }
            PyObject *d2 = self->result_set[i];
            if (Py_TYPE(d2)->tp_descr_set(d2, result, values[i]) < 0) Py_CLEAR(result);
        }
        /* A result holds only a str, ints and an enum member: it can never be part of a cycle,
         * so the cyclic GC need not track it (as CPython does for tuples of atoms). */
        if (result != NULL && PyObject_GC_IsTracked(result)) PyObject_GC_UnTrack(result);
    }
    for (int i = 0; i < RS_FIELDS; i++) Py_XDECREF(values[i]);
    return result;
}

static int pending_add(Appender *self, const Rec *rec, int64_t phys, int64_t ts) {
    if (rec->hash_count == 0) return 0;
    if (grow((void **)&self->pending, &self->pending_cap, (self->pending_count + rec->hash_count) * 3,
             sizeof(int64_t)) < 0)
        return -1;
    int64_t *out = self->pending + self->pending_count * 3;
    for (Py_ssize_t k = 0; k < rec->hash_count; k++) {
        *out++ = self->hashes[rec->hash_off + k];
        *out++ = phys;
        *out++ = ts;
    }
    self->pending_count += rec->hash_count;
    return 0;
}

static void write_record(Appender *self, unsigned char *restrict dst, const Rec *rec, int64_t qoff, int64_t phys,
                         int64_t ts) {
    Py_ssize_t body_len = PyBytes_GET_SIZE(rec->body);
    const unsigned char *body = (const unsigned char *)PyBytes_AS_STRING(rec->body);
    PyObject *prefix = PyTuple_GET_ITEM(rec->topic_info, 0);
    Py_ssize_t prefix_len = PyBytes_GET_SIZE(prefix);
    uint32_t body_crc;
    if (body_len >= RELEASE_GIL_ABOVE) {
        Py_BEGIN_ALLOW_THREADS
        memcpy(dst + HEADER_SIZE, body, (size_t)body_len);
        body_crc = crc32_update(0, body, (size_t)body_len);
        Py_END_ALLOW_THREADS
    } else {
        memcpy(dst + HEADER_SIZE, body, (size_t)body_len);
        body_crc = crc32_update(0, body, (size_t)body_len);
    }
    unsigned char *tail = dst + HEADER_SIZE + body_len;
    uint32_t tail_crc = rec->tail_crc;
    if (rec->props_off >= 0) {
        memcpy(tail, PyBytes_AS_STRING(prefix), (size_t)prefix_len);
        put_be16(tail + prefix_len, (uint16_t)rec->props_len);
        memcpy(tail + prefix_len + PROPS_LEN_SIZE, self->scratch + rec->props_off, (size_t)rec->props_len);
        tail_crc = crc32_update(0, tail, (size_t)(prefix_len + PROPS_LEN_SIZE + rec->props_len));
    } else {
        PyObject *bare = PyTuple_GET_ITEM(rec->topic_info, 1);
        memcpy(tail, PyBytes_AS_STRING(bare), (size_t)PyBytes_GET_SIZE(bare));
    }
    unsigned char h[HEADER_SIZE];
    put_be32(h + OFF_TOTAL, (uint32_t)rec->total);
    put_be32(h + OFF_MAGIC, MESSAGE_MAGIC);
    put_be32(h + OFF_BODY_CRC, body_crc);
    put_be32(h + OFF_QUEUE_ID, (uint32_t)rec->queue_id);
    put_be32(h + OFF_FLAG, (uint32_t)rec->flag);
    put_be64(h + OFF_QUEUE_OFFSET, (uint64_t)qoff);
    put_be64(h + OFF_PHYS, (uint64_t)phys);
    put_be32(h + OFF_SYS_FLAG, (uint32_t)rec->sys_flag);
    put_be64(h + OFF_BORN_TS, (uint64_t)rec->born_ts);
    memcpy(h + OFF_BORN_HOST, rec->born, 8);
    put_be64(h + OFF_STORE_TS, (uint64_t)ts);
    memcpy(h + OFF_STORE_HOST, self->store_host, 8);
    put_be32(h + OFF_RECONSUME, (uint32_t)rec->reconsume);
    put_be64(h + OFF_PREPARED, (uint64_t)rec->prepared);
    put_be64(h + OFF_TAGS_CODE, (uint64_t)rec->tags_code);
    put_be32(h + OFF_BODY_LEN, (uint32_t)body_len);
    put_be32(h + OFF_RECORD_CRC, crc32_update(tail_crc, h + RECORD_CRC_FROM, HEADER_SIZE - RECORD_CRC_FROM));
    memcpy(dst, h, HEADER_SIZE);
}

/* Pass 1: check and encode items[start:count] into recs; nothing is written if one is refused. */
static int encode_all(Appender *self, PyObject *const *items, Py_ssize_t count, Py_ssize_t start) {
    Py_ssize_t n = count - start;
    if (grow((void **)&self->recs, &self->recs_cap, n, sizeof(Rec)) < 0) return -1;
    memset(self->recs, 0, (size_t)n * sizeof(Rec));
    self->scratch_len = 0;
    self->hashes_len = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (items[start + i] == NULL) self->direct_at = self->direct_fields + (start + i) * RQ_FIELDS;
        if (encode(self, items[start + i], &self->recs[i]) < 0) {
            clear_recs(self, i + 1);
            return -1;
        }
    }
    return 0;
}

/* The store timestamp of a call: never earlier than the previous one. */
static int stamp(Appender *self, long long *ts) {
    long long now = now_ms(self);
    if (now == -1 && PyErr_Occurred()) return -1;
    *ts = now < self->last_ts ? self->last_ts : now;
    return 0;
}

/* Pass 2: write recs[first:n] until done or a file boundary needs Python (`need`); publish what
 * was written. Returns the index of the first record not placed, or -1 with an exception. */
static Py_ssize_t write_some(Appender *self, Py_ssize_t first, Py_ssize_t n, long long ts, PyObject *results,
                             PyObject **one) {
    self->need = NEED_NONE;
    Py_CLEAR(self->need_cq);
    Py_CLEAR(self->need_topic);
    self->call++;
    int64_t pos = 0, wrote0 = 0;
    Py_ssize_t done = first;
    int failed = load_segment(self, &pos) < 0;
    int loaded = !failed;
    if (loaded) wrote0 = self->seg_start + pos;
    unsigned char *base = failed ? NULL : (unsigned char *)self->seg_view.buf;
    for (; !failed && done < n; done++) {
        Rec *rec = &self->recs[done];
        if (pos + rec->total + END_FILE_MIN_BLANK > self->seg_size) {
            self->need = NEED_ROLL;
            self->need_size = rec->total;
            break;
        }
        QueueSlot *q = queue_slot(self, rec->topic, rec->queue_id, pos, &wrote0);
        if (q == NULL) {
            failed = PyErr_Occurred() != NULL;
            break;
        }
        int64_t qoff = q->max_offset;
        int64_t rel = q->base == INT64_MIN ? -1 : qoff - q->base;
        if (rel < 0 || rel >= q->per_file || rel >= q->room) { /* the entry first: blocks, file */
            self->need = NEED_CQ_FILE;
            Py_INCREF(q->cq);
            Py_XSETREF(self->need_cq, q->cq);
            self->need_qoff = qoff;
            break;
        }
        if (pos + rec->total + END_FILE_MIN_BLANK > self->seg_allocated) {
            self->need = NEED_ALLOCATE; /* blocks for the record (and a blank marker after it) */
            self->need_size = pos + rec->total + END_FILE_MIN_BLANK;
            break;
        }
        int64_t phys = self->seg_start + pos;
        write_record(self, base + pos, rec, qoff, phys, ts);
        unsigned char *entry = (unsigned char *)q->view.buf + rel * CQ_ENTRY_SIZE;
        put_be64(entry + CQ_OFF_PHYS, (uint64_t)phys);
        put_be32(entry + CQ_OFF_SIZE, (uint32_t)rec->total);
        put_be64(entry + CQ_OFF_TAGS, (uint64_t)rec->tags_code);
        q->max_offset = qoff + 1;
        pos += rec->total;
        self->messages++;
        self->appended_bytes += rec->total;
        if (pending_add(self, rec, phys, ts) < 0) {
            failed = 1;
            done++;
            break;
        }
        if (self->columnar) {
            if (grow((void **)&self->cols, &self->cols_cap, self->cols_len + 3, sizeof(int64_t)) < 0) {
                failed = 1;
                done++;
                break;
            }
            int64_t *row = self->cols + self->cols_len;
            row[0] = qoff;
            row[1] = phys;
            row[2] = (int64_t)rec->total;
            self->cols_len += 3;
            continue;
        }
        PyObject *result = make_result(self, qoff, phys, rec->total, ts);
        if (result == NULL) {
            failed = 1;
            done++;
            break;
        }
        if (one != NULL) {
            *one = result;
        } else {
            int rc = PyList_Append(results, result);
            Py_DECREF(result);
            if (rc < 0) {
                failed = 1;
                done++;
                break;
            }
        }
    }
    if (done > first) self->last_ts = ts;
    /* what was written is published even when something failed after it: the records are whole */
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    if (failed) PyErr_Fetch(&type, &value, &tb);
    if (loaded && publish(self, pos, wrote0) < 0) {
        if (failed) {
            PyErr_Clear(); /* the first error is the one to report */
        } else {
            failed = 1;
            PyErr_Fetch(&type, &value, &tb);
        }
    }
    if (self->need == NEED_ROLL) drop_segment(self);    /* Python rolls to the next segment */
    if (self->need == NEED_CQ_FILE) drop_queues(self);  /* and switches queue files */
    if (failed) {
        PyErr_Restore(type, value, tb);
        return -1;
    }
    return done;
}

/* Encode items[start:count], then place them until done or a boundary; returns the index of
 * the first request not placed, or -1. Results go to `results` (a list) or, for one, *one. */
static Py_ssize_t place(Appender *self, PyObject *const *items, Py_ssize_t count, Py_ssize_t start,
                        PyObject *results, PyObject **one) {
    self->need = NEED_NONE;
    if (start >= count) return count;
    Py_ssize_t n = count - start;
    long long ts;
    if (encode_all(self, items, count, start) < 0) return -1;
    Py_ssize_t done = stamp(self, &ts) < 0 ? -1 : write_some(self, 0, n, ts, results, one);
    clear_recs(self, n);
    return done < 0 ? -1 : start + done;
}

static PyObject *Appender_put(Appender *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "put(requests, start, results)");
        return NULL;
    }
    if (!PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "results must be a list");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred()) return NULL;
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Appender.put re-entered (appends must hold the store's put lock)");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "requests must be a sequence");
    if (seq == NULL) return NULL;
    self->busy = 1;
    self->busy_thread = PyThread_get_thread_ident();
    Py_ssize_t next = place(self, PySequence_Fast_ITEMS(seq), PySequence_Fast_GET_SIZE(seq), start < 0 ? 0 : start,
                            args[2], NULL);
    self->busy = 0;
    Py_DECREF(seq);
    if (next < 0) return NULL;
    return PyLong_FromSsize_t(next);
}

static PyObject *Appender_append_one(Appender *self, PyObject *request) {
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Appender.append_one re-entered (appends must hold the store's put lock)");
        return NULL;
    }
    PyObject *one = NULL;
    self->busy = 1;
    self->busy_thread = PyThread_get_thread_ident();
    Py_ssize_t next = place(self, &request, 1, 0, NULL, &one);
    self->busy = 0;
    if (next < 0) return NULL;
    if (one == NULL) Py_RETURN_NONE;
    return one;
}

/* -- the store's append, up to the flush ------------------------------------------------------ */

static PyObject *Appender_bind(Appender *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"lock", "retention", "check_writable", "provide", "make_room", "drain", "index_batch",
                             "closed_message", NULL};
    PyObject *lock, *retention, *check_writable, *provide, *make_room, *drain, *closed_message;
    Py_ssize_t index_batch;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOOnU", kwlist, &lock, &retention, &check_writable, &provide,
                                     &make_room, &drain, &index_batch, &closed_message))
        return NULL;
    PyObject *acquire = PyObject_GetAttrString(lock, "acquire");
    if (acquire == NULL) return NULL;
    PyObject *release = PyObject_GetAttrString(lock, "release");
    if (release == NULL) {
        Py_DECREF(acquire);
        return NULL;
    }
    Py_XSETREF(self->lock_acquire, acquire);
    Py_XSETREF(self->lock_release, release);
    Py_XSETREF(self->retention, Py_NewRef(retention));
    Py_XSETREF(self->check_writable, Py_NewRef(check_writable));
    Py_XSETREF(self->provide, Py_NewRef(provide));
    Py_XSETREF(self->make_room, Py_NewRef(make_room));
    Py_XSETREF(self->drain, Py_NewRef(drain));
    Py_XSETREF(self->closed_message, Py_NewRef(closed_message));
    self->index_batch = index_batch;
    self->next_check = 0.0;
    Py_RETURN_NONE;
}

static int refuse_closed(Appender *self) {
    PyErr_SetObject(self->store_error, self->closed_message);
    return -1;
}

/* The store's write gate: closed, or (sampled at most every disk check interval) a full disk. */
static int gate(Appender *self) {
    if (self->lock_acquire == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Appender.bind() was not called");
        return -1;
    }
    if (self->closed) return refuse_closed(self);
    PyObject *full = PyObject_GetAttr(self->retention, S_full);
    if (full == NULL) return -1;
    int is_full = PyObject_IsTrue(full);
    Py_DECREF(full);
    if (is_full < 0) return -1;
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t); /* time.monotonic()'s clock */
    double now = (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
    if (is_full || now >= self->next_check) {
        PyObject *r = PyObject_CallNoArgs(self->check_writable);
        if (r == NULL) return -1;
        Py_DECREF(r);
        PyObject *next = PyObject_GetAttr(self->retention, S_next_check);
        if (next == NULL) return -1;
        self->next_check = PyFloat_AsDouble(next);
        Py_DECREF(next);
        if (self->next_check == -1.0 && PyErr_Occurred()) return -1;
    }
    return 0;
}

static int call_noargs(PyObject *fn) {
    PyObject *r = PyObject_CallNoArgs(fn);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

/* Release the put lock, keeping any pending exception. */
static int unlock(Appender *self) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    int rc = call_noargs(self->lock_release);
    if (type != NULL) {
        if (rc < 0) PyErr_Clear();
        PyErr_Restore(type, value, tb);
        return -1;
    }
    return rc;
}

#define MAX_PROVISIONS 64 /* file boundaries one request can cross; more: no progress */

/* Under the lock: encode all requests once, then write them, calling provide() at each file
 * boundary; 0 or -1. */
static int place_all(Appender *self, PyObject *const *items, Py_ssize_t count, PyObject *results, PyObject **one) {
    if (self->closed) return refuse_closed(self);
    self->busy = 1;
    self->busy_thread = PyThread_get_thread_ident();
    int rc = encode_all(self, items, count, 0);
    self->busy = 0;
    if (rc < 0) return -1;
    if (count > 1) { /* a batch: every block it will write into first, so a full disk refuses all of it */
        PyObject *sizes = PyList_New(count);
        for (Py_ssize_t i = 0; sizes != NULL && i < count; i++) {
            PyObject *size = PyLong_FromSsize_t(self->recs[i].total);
            if (size == NULL) Py_CLEAR(sizes);
            else PyList_SET_ITEM(sizes, i, size);
        }
        PyObject *counts = sizes == NULL ? NULL : PyDict_New(); /* (topic, queue id) -> records */
        for (Py_ssize_t i = 0, run = 1; counts != NULL && i < count; i++, run++) {
            const Rec *r = &self->recs[i]; /* one dict update per run of records on one queue */
            if (i + 1 < count && r[1].topic == r->topic && r[1].queue_id == r->queue_id) continue;
            PyObject *qid = PyLong_FromLong(r->queue_id);
            PyObject *key = qid == NULL ? NULL : PyTuple_Pack(2, r->topic, qid);
            Py_XDECREF(qid);
            PyObject *had = key == NULL ? NULL : PyDict_GetItemWithError(counts, key);
            long before = had == NULL ? 0 : PyLong_AsLong(had);
            PyObject *now = key == NULL || PyErr_Occurred() ? NULL : PyLong_FromLong(before + (long)run);
            if (now == NULL || PyDict_SetItem(counts, key, now) < 0) Py_CLEAR(counts);
            Py_XDECREF(now);
            Py_XDECREF(key);
            run = 0;
        }
        PyObject *r = counts == NULL ? NULL : PyObject_CallFunctionObjArgs(self->make_room, counts, sizes, NULL);
        Py_XDECREF(counts);
        Py_XDECREF(sizes);
        if (r == NULL) {
            clear_recs(self, count);
            return -1;
        }
        Py_DECREF(r);
    }
    long long ts;
    Py_ssize_t done = 0;
    int stalls = 0;
    rc = stamp(self, &ts);
    while (rc == 0) {
        self->busy = 1;
        self->busy_thread = PyThread_get_thread_ident();
        Py_ssize_t next = write_some(self, done, count, ts, results, one);
        self->busy = 0;
        if (next < 0 || next >= count) {
            rc = next < 0 ? -1 : 0;
            break;
        }
        stalls = next > done ? 0 : stalls + 1;
        if (stalls > MAX_PROVISIONS) {
            PyErr_Format(self->store_error, "store_mmap append kernel makes no progress (need=%d); please report this",
                         self->need);
            rc = -1;
            break;
        }
        done = next;
        /* Python crosses the boundary; the encoded records wait (they hold their own references) */
        PyObject *r = PyObject_CallOneArg(self->provide, (PyObject *)self);
        if (r == NULL) {
            rc = -1;
            break;
        }
        Py_DECREF(r);
    }
    clear_recs(self, count);
    return rc;
}

static PyObject *Appender_append(Appender *self, PyObject *request) {
    /* busy set by another thread means it holds the put lock and let go of the GIL in a callback:
     * this thread waits for the lock below. Only the same thread coming back is a re-entry. */
    if (self->busy && self->busy_thread == PyThread_get_thread_ident()) {
        PyErr_SetString(PyExc_RuntimeError, "Appender.append re-entered from a callback");
        return NULL;
    }
    if (gate(self) < 0 || call_noargs(self->lock_acquire) < 0) return NULL;
    PyObject *one = NULL;
    int rc = place_all(self, &request, 1, NULL, &one);
    if (unlock(self) < 0 || rc < 0) {
        Py_XDECREF(one);
        return NULL;
    }
    if (self->pending_count >= self->index_batch && call_noargs(self->drain) < 0) {
        Py_DECREF(one);
        return NULL;
    }
    return one;
}

/* append_batch and append_columns: the store's batch append up to the flush; `results` gets one
 * AppendResult per record, or (columnar: `results` NULL) *rows the rows and *ts the store time,
 * taken under the put lock (a callback after it may let another thread append). */
static int batch(Appender *self, PyObject *requests, PyObject *results, PyObject **rows, long long *ts,
                 const char *name) {
    /* busy set by another thread means it holds the put lock and let go of the GIL in a callback:
     * this thread waits for the lock below. Only the same thread coming back is a re-entry. */
    if (self->busy && self->busy_thread == PyThread_get_thread_ident()) {
        PyErr_Format(PyExc_RuntimeError, "Appender.%s re-entered from a callback", name);
        return -1;
    }
    PyObject *seq = PySequence_Fast(requests, "requests must be a sequence of AppendRequest");
    if (seq == NULL) return -1;
    if (PySequence_Fast_GET_SIZE(seq) == 0) {
        Py_DECREF(seq);
        if (rows != NULL) {
            *ts = self->last_ts;
            *rows = PyBytes_FromStringAndSize(NULL, 0);
            return *rows == NULL ? -1 : 0;
        }
        return 0;
    }
    if (gate(self) < 0 || call_noargs(self->lock_acquire) < 0) {
        Py_DECREF(seq);
        return -1;
    }
    self->columnar = rows != NULL;
    self->cols_len = 0;
    int rc = place_all(self, PySequence_Fast_ITEMS(seq), PySequence_Fast_GET_SIZE(seq), results, NULL);
    self->columnar = 0;
    Py_DECREF(seq);
    if (rc == 0 && rows != NULL) {
        *ts = self->last_ts;
        *rows = PyBytes_FromStringAndSize((const char *)self->cols, self->cols_len * (Py_ssize_t)sizeof(int64_t));
        if (*rows == NULL) rc = -1;
    }
    self->cols_len = 0;
    if (unlock(self) < 0 || rc < 0) {
        if (rows != NULL) Py_CLEAR(*rows);
        return -1;
    }
    if (self->pending_count >= self->index_batch && call_noargs(self->drain) < 0) {
        if (rows != NULL) Py_CLEAR(*rows);
        return -1;
    }
    return 0;
}

static PyObject *Appender_append_batch(Appender *self, PyObject *requests) {
    PyObject *results = PyList_New(0);
    if (results == NULL) return NULL;
    if (batch(self, requests, results, NULL, NULL, "append_batch") < 0) {
        Py_DECREF(results);
        return NULL;
    }
    return results;
}

static PyObject *Appender_append_columns(Appender *self, PyObject *requests) {
    PyObject *rows = NULL;
    long long ts = 0;
    if (batch(self, requests, NULL, &rows, &ts, "append_columns") < 0) return NULL;
    return Py_BuildValue("(NL)", rows, ts);
}

/* -- the direct append (see _directappend.h) ------------------------------------------------ */

/* Appender.append_columns's work for n >= 1 requests given by their fields (see
 * _directappend.h); 0 (not taken) while `direct` is off - checked again under the put lock,
 * which the store holds when it turns `direct` off (a log listener set while this call waited). */
static int direct_append_many(PyObject *context, Py_ssize_t n, PyObject *const *fields, int64_t *rows, int64_t *ts) {
    Appender *self = (Appender *)context;
    if (!self->direct) return 0;
    if (self->busy && self->busy_thread == PyThread_get_thread_ident()) {
        PyErr_SetString(PyExc_RuntimeError, "Appender's direct append re-entered from a callback");
        return -1;
    }
    PyObject **items = PyMem_Calloc((size_t)(n > 0 ? n : 1), sizeof(PyObject *)); /* NULL: read direct_fields */
    if (items == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int rc = gate(self) < 0 || call_noargs(self->lock_acquire) < 0 ? -1 : 1;
    if (rc == 1 && !self->direct) rc = unlock(self) < 0 ? -1 : 0;
    if (rc == 1) {
        self->direct_fields = fields;
        self->columnar = 1;
        self->cols_len = 0;
        rc = place_all(self, items, n, NULL, NULL) < 0 ? -1 : 1;
        self->columnar = 0;
        self->direct_fields = self->direct_at = NULL;
        if (rc == 1 && self->cols_len != 3 * n) {
            PyErr_SetString(self->store_error, "store_mmap direct append placed fewer records; please report this");
            rc = -1;
        }
        if (rc == 1) {
            memcpy(rows, self->cols, (size_t)(3 * n) * sizeof(int64_t));
            *ts = self->last_ts;
        }
        self->cols_len = 0;
        if (unlock(self) < 0) rc = -1;
        if (rc == 1 && self->pending_count >= self->index_batch && call_noargs(self->drain) < 0) rc = -1;
    }
    PyMem_Free(items);
    return rc;
}

/* One request: append_many's work, the numbers as _directappend.h says, and the message id. */
static int direct_append(PyObject *context, PyObject *const *fields, int64_t out[4], PyObject **msg_id) {
    int64_t ts;
    int rc = direct_append_many(context, 1, fields, out, &ts);
    if (rc <= 0) return rc;
    out[3] = ts;
    *msg_id = make_msg_id((Appender *)context, out[1]);
    return *msg_id == NULL ? -1 : 1;
}

static void direct_capsule_free(PyObject *capsule) {
    DirectAppend *api = PyCapsule_GetPointer(capsule, PLUGMQ_DIRECT_APPEND);
    if (api == NULL) return;
    Py_XDECREF(api->context);
    PyMem_Free(api);
}

static PyObject *Appender_direct_capsule(Appender *self, PyObject *Py_UNUSED(ignored)) {
    DirectAppend *api = PyMem_Malloc(sizeof(DirectAppend));
    if (api == NULL) return PyErr_NoMemory();
    api->version = PLUGMQ_DIRECT_APPEND_VERSION;
    api->context = Py_NewRef((PyObject *)self);
    api->append = direct_append;
    api->append_many = direct_append_many;
    memcpy(api->id_prefix, self->id_prefix, sizeof api->id_prefix);
    PyObject *capsule = PyCapsule_New(api, PLUGMQ_DIRECT_APPEND, direct_capsule_free);
    if (capsule == NULL) {
        Py_DECREF(api->context);
        PyMem_Free(api);
    }
    return capsule;
}

static PyObject *Appender_release(Appender *self, PyObject *Py_UNUSED(ignored)) {
    drop_segment(self);
    drop_queues(self);
    Py_RETURN_NONE;
}

static PyObject *Appender_take_pending(Appender *self, PyObject *Py_UNUSED(ignored)) {
    PyObject *out = PyBytes_FromStringAndSize((const char *)self->pending,
                                              (Py_ssize_t)(self->pending_count * 3 * (Py_ssize_t)sizeof(int64_t)));
    if (out == NULL) return NULL;
    self->pending_count = 0;
    return out;
}

static int Appender_traverse(Appender *self, visitproc visit, void *arg) {
    Py_VISIT(self->topics);
    Py_VISIT(self->learn_topic);
    Py_VISIT(self->hosts);
    Py_VISIT(self->host_bytes);
    Py_VISIT(self->queues);
    Py_VISIT(self->commit_log);
    Py_VISIT(self->now_ms);
    Py_VISIT(self->check_body_size);
    Py_VISIT(self->need_cq);
    Py_VISIT(self->need_topic);
    Py_VISIT(self->validation_error);
    Py_VISIT(self->lock_acquire);
    Py_VISIT(self->lock_release);
    Py_VISIT(self->retention);
    Py_VISIT(self->check_writable);
    Py_VISIT(self->provide);
    Py_VISIT(self->make_room);
    Py_VISIT(self->drain);
    Py_VISIT(self->store_error);
    Py_VISIT(self->request_type);
    Py_VISIT(self->result_type);
    Py_VISIT(self->put_ok);
    Py_VISIT(self->last_topic);
    Py_VISIT(self->last_topic_info);
    Py_VISIT(self->last_host);
    Py_VISIT(self->last_host_packed);
    Py_VISIT(self->seg);
    for (int i = 0; i < self->nslots; i++) {
        Py_VISIT(self->slots[i].topic);
        Py_VISIT(self->slots[i].cq);
        Py_VISIT(self->slots[i].file);
    }
    return 0;
}

static int Appender_clear(Appender *self) {
    Py_CLEAR(self->topics);
    Py_CLEAR(self->learn_topic);
    Py_CLEAR(self->hosts);
    Py_CLEAR(self->host_bytes);
    Py_CLEAR(self->queues);
    Py_CLEAR(self->commit_log);
    Py_CLEAR(self->now_ms);
    Py_CLEAR(self->check_body_size);
    Py_CLEAR(self->validation_error);
    Py_CLEAR(self->lock_acquire);
    Py_CLEAR(self->lock_release);
    Py_CLEAR(self->retention);
    Py_CLEAR(self->check_writable);
    Py_CLEAR(self->provide);
    Py_CLEAR(self->make_room);
    Py_CLEAR(self->drain);
    Py_CLEAR(self->closed_message);
    Py_CLEAR(self->store_error);
    Py_CLEAR(self->request_type);
    Py_CLEAR(self->result_type);
    Py_CLEAR(self->put_ok);
    for (int i = 0; i < RQ_FIELDS; i++) Py_CLEAR(self->request_get[i]);
    for (int i = 0; i < RS_FIELDS; i++) Py_CLEAR(self->result_set[i]);
    Py_CLEAR(self->keys_name);
    Py_CLEAR(self->uniq_name);
    Py_CLEAR(self->born_host_name);
    Py_CLEAR(self->need_cq);
    Py_CLEAR(self->need_topic);
    Py_CLEAR(self->last_topic);
    Py_CLEAR(self->last_topic_info);
    Py_CLEAR(self->last_host);
    Py_CLEAR(self->last_host_packed);
    drop_segment(self);
    drop_queues(self);
    return 0;
}

static void Appender_dealloc(Appender *self) {
    PyObject_GC_UnTrack(self);
    Appender_clear(self);
    PyMem_Free(self->scratch);
    PyMem_Free(self->recs);
    PyMem_Free(self->hashes);
    PyMem_Free(self->pending);
    PyMem_Free(self->cols);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Appender_init(Appender *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"store_host",     "id_prefix",     "topics",        "learn_topic",  "hosts",
                             "host_bytes",     "queues",        "commit_log",    "now_ms",       "check_body_size",
                             "validation_error", "store_error", "request_type",  "result_type",  "put_ok",
                             "keys_name",      "uniq_name",     "born_host_name", "max_body",    "max_record",
                             "segment_size",   "index_unique",  "last_ts",       NULL};
    Py_buffer host;
    const char *prefix;
    Py_ssize_t prefix_len;
    PyObject *topics, *learn_topic, *hosts, *host_bytes, *queues, *commit_log, *now_ms, *check_body_size,
        *validation_error, *store_error, *request_type, *result_type, *put_ok, *keys_name, *uniq_name,
        *born_host_name;
    long long max_body, max_record, segment_size, last_ts;
    int index_unique;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "y*s#O!OO!OO!OOOOOO!O!OUUULLLpL", kwlist, &host, &prefix,
                                     &prefix_len, &PyDict_Type, &topics, &learn_topic, &PyDict_Type, &hosts,
                                     &host_bytes, &PyDict_Type, &queues, &commit_log, &now_ms, &check_body_size,
                                     &validation_error, &store_error, &PyType_Type, &request_type, &PyType_Type,
                                     &result_type, &put_ok, &keys_name, &uniq_name, &born_host_name, &max_body,
                                     &max_record, &segment_size, &index_unique, &last_ts))
        return -1;
    if (host.len != 8 || prefix_len != 16) {
        PyBuffer_Release(&host);
        PyErr_SetString(PyExc_ValueError, "store_host must be 8 bytes and id_prefix 16 characters");
        return -1;
    }
    memcpy(self->store_host, host.buf, 8);
    PyBuffer_Release(&host);
    memcpy(self->id_prefix, prefix, 16);
    Appender_clear(self);
#define KEEP(field) self->field = Py_NewRef(field)
    KEEP(topics);
    KEEP(learn_topic);
    KEEP(hosts);
    KEEP(host_bytes);
    KEEP(queues);
    KEEP(commit_log);
    KEEP(now_ms);
    KEEP(check_body_size);
    KEEP(validation_error);
    KEEP(store_error);
    KEEP(request_type);
    KEEP(result_type);
    KEEP(put_ok);
    KEEP(keys_name);
    KEEP(uniq_name);
    KEEP(born_host_name);
#undef KEEP
    for (int i = 0; i < RQ_FIELDS; i++) {
        PyObject *d = PyObject_GetAttrString(request_type, request_fields[i]);
        if (d == NULL) return -1;
        self->request_off[i] = slot_offset(d);
        if (Py_TYPE(d) == &PyMemberDescr_Type && Py_TYPE(d)->tp_descr_get != NULL) {
            self->request_get[i] = d;
        } else {
            Py_DECREF(d); /* not a slot: read it as an attribute */
        }
    }
    for (int i = 0; i < RS_FIELDS; i++) {
        PyObject *d = PyObject_GetAttrString(result_type, result_fields[i]);
        if (d == NULL) return -1;
        if (Py_TYPE(d) != &PyMemberDescr_Type || Py_TYPE(d)->tp_descr_set == NULL) {
            Py_DECREF(d);
            PyErr_Format(PyExc_TypeError, "result_type.%s must be a slot", result_fields[i]);
            return -1;
        }
        self->result_set[i] = d;
        self->result_off[i] = slot_offset(d);
    }
    self->max_body = max_body;
    self->max_record = max_record;
    self->segment_size = segment_size;
    self->index_unique = index_unique;
    self->last_ts = last_ts;
    self->system_clock = now_ms == Py_None;
    return 0;
}

static PyObject *Appender_get_need_cq(Appender *self, void *closure) {
    return Py_NewRef(self->need_cq ? self->need_cq : Py_None);
}
static PyObject *Appender_get_need_topic(Appender *self, void *closure) {
    return Py_NewRef(self->need_topic ? self->need_topic : Py_None);
}

static PyGetSetDef Appender_getset[] = {
    {"need_cq", (getter)Appender_get_need_cq, NULL, "the consume queue that needs a file for need_qoff", NULL},
    {"need_topic", (getter)Appender_get_need_topic, NULL, "the topic of the queue to create", NULL},
    {NULL}};

static PyMemberDef Appender_members[] = {
    {"last_ts", T_LONGLONG, offsetof(Appender, last_ts), 0, "the newest store timestamp given out"},
    {"messages", T_LONGLONG, offsetof(Appender, messages), READONLY, "records appended"},
    {"appended_bytes", T_LONGLONG, offsetof(Appender, appended_bytes), READONLY, "record bytes appended"},
    {"pending_count", T_PYSSIZET, offsetof(Appender, pending_count), READONLY, "index entries waiting"},
    {"closed", T_BOOL, offsetof(Appender, closed), 0, "set when the store closes: appends are refused"},
    {"direct", T_BOOL, offsetof(Appender, direct), 0,
     "whether the direct append is taken (set by the store, under its put lock: its publish step is empty)"},
    {"need", T_INT, offsetof(Appender, need), READONLY, "why the last call stopped early (NEED_*)"},
    {"need_size", T_LONGLONG, offsetof(Appender, need_size), READONLY,
     "record size for NEED_ROLL; for NEED_ALLOCATE the segment bytes that need blocks"},
    {"need_qoff", T_LONGLONG, offsetof(Appender, need_qoff), READONLY, "queue offset for NEED_CQ_FILE"},
    {"need_qid", T_LONGLONG, offsetof(Appender, need_qid), READONLY, "queue id for NEED_QUEUE"},
    {NULL}};

static PyMethodDef Appender_methods[] = {
    {"put", (PyCFunction)(void (*)(void))Appender_put, METH_FASTCALL,
     "put(requests, start, results) -> index of the first request not placed"},
    {"append_one", (PyCFunction)Appender_append_one, METH_O, "append_one(request) -> AppendResult | None"},
    {"append", (PyCFunction)Appender_append, METH_O,
     "append(request) -> AppendResult: the store's append up to the flush (gate, lock, files, index)"},
    {"append_batch", (PyCFunction)Appender_append_batch, METH_O,
     "append_batch(requests) -> list[AppendResult]: the same for a batch"},
    {"append_columns", (PyCFunction)Appender_append_columns, METH_O,
     "append_columns(requests) -> (bytes of native int64 (queue offset, commit-log offset, size) triples, "
     "store timestamp): append_batch without building AppendResults"},
    {"bind", (PyCFunction)(void (*)(void))Appender_bind, METH_VARARGS | METH_KEYWORDS,
     "bind(lock, retention, check_writable, provide, make_room, drain, index_batch, closed_message)"},
    {"direct_capsule", (PyCFunction)Appender_direct_capsule, METH_NOARGS,
     "direct_capsule() -> PyCapsule of the direct append (see plugmq/kit/_directappend.h)"},
    {"release", (PyCFunction)Appender_release, METH_NOARGS,
     "release() drops the buffers kept between calls (call before closing the store's files)"},
    {"take_pending", (PyCFunction)Appender_take_pending, METH_NOARGS,
     "take_pending() -> bytes of native int64 (hash, offset, store ts) triples"},
    {NULL}};

static PyTypeObject AppenderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "plugmq.plugins.store_mmap._appender.Appender",
    .tp_basicsize = sizeof(Appender),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The compiled append kernel of store_mmap (see the module docstring).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Appender_init,
    .tp_dealloc = (destructor)Appender_dealloc,
    .tp_traverse = (traverseproc)Appender_traverse,
    .tp_clear = (inquiry)Appender_clear,
    .tp_methods = Appender_methods,
    .tp_members = Appender_members,
    .tp_getset = Appender_getset,
};

static PyMethodDef module_methods[] = {{NULL}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_appender",
                                        "store_mmap's compiled append kernel", -1, module_methods};

PyMODINIT_FUNC PyInit__appender(void) {
    hwcrc32_select();
    PyObject *probe_dict = PyDict_New();
    if (probe_dict == NULL) return NULL;
    PyObject *probe = PyDictProxy_New(probe_dict);
    if (probe == NULL) {
        Py_DECREF(probe_dict);
        return NULL;
    }
    proxy_layout_ok = Py_TYPE(probe)->tp_basicsize == (Py_ssize_t)sizeof(proxy_layout) &&
                      ((proxy_layout *)probe)->mapping == probe_dict;
    Py_DECREF(probe);
    Py_DECREF(probe_dict);
#define INTERN(var, text)                                \
    if ((var = PyUnicode_InternFromString(text)) == NULL) \
        return NULL;
    INTERN(S_allocated, "allocated");
    INTERN(S_room, "room");
    INTERN(S_full, "full");
    INTERN(S_next_check, "next_check");
    INTERN(S_cur, "cur");
    INTERN(S_wrote, "wrote");
    INTERN(S_start, "start");
    INTERN(S_size, "size");
    INTERN(S_mm, "mm");
    INTERN(S_max_offset, "max_offset");
    INTERN(S_cq_cur, "_cur");
    INTERN(S_cq_base, "_cur_base");
    INTERN(S_per_file, "per_file");
    INTERN(S_topic_kw, "topic");
#undef INTERN
    if (PyType_Ready(&AppenderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Appender", (PyObject *)&AppenderType) < 0 ||
        PyModule_AddIntConstant(m, "NEED_NONE", NEED_NONE) < 0 || PyModule_AddIntConstant(m, "NEED_ROLL", NEED_ROLL) < 0 ||
        PyModule_AddIntConstant(m, "NEED_CQ_FILE", NEED_CQ_FILE) < 0 ||
        PyModule_AddIntConstant(m, "NEED_QUEUE", NEED_QUEUE) < 0 ||
        PyModule_AddIntConstant(m, "NEED_ALLOCATE", NEED_ALLOCATE) < 0 ||
        PyModule_AddIntConstant(m, "LAYOUT_VERSION", LAYOUT_VERSION) < 0 ||
        PyModule_AddIntConstant(m, "PROXY_FAST_PATH", proxy_layout_ok) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
