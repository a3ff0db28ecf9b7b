/* Compiled bulk codec of AppendRequests (see plugmq/kit/requestcodec.py): the delay plugins'
 * stored requests decoded, and the put path's Messages encoded (`encode`, at the end).
 *
 * Why C: a burst of due messages is written back by decoding every stored record into an
 * AppendRequest. In Python that costs ~5 us per record (CRC, unpack, text split, a dict, the
 * request object), more than the store's own append of the same message, so a 500k burst spent
 * most of its time decoding. This walks a whole read buffer with one call and builds the
 * requests directly (as AppendRequest.trusted does: the record was validated when it was
 * scheduled and is CRC-checked here).
 *
 *   decode(buffer, positions, sizes, layout, drop, cls, setters) -> (requests, extras)
 *     For every record at positions[i] of `buffer`, sizes[i] bytes long: check it as `layout`
 *     says (magic, stored length, CRC-32 of a range, optional trailer and payload mark) and build
 *     an AppendRequest (`cls`, its slot descriptors `setters` in field order) without the
 *     properties named in `drop`. requests[i] is None for a record that fails any check or does
 *     not fit the layout (an older format): the caller decodes that one with its Python decoder,
 *     which decides. `extras` holds len(layout's extra fields) integers per record (0 for None).
 *
 *   layout = (big_endian, magic_at, magic, length_at, length_minus, crc_at, crc_from, crc_back,
 *             tail, mark_at, mark, queue_at, tags_at, born_at, reconsume_at, sys_flag_at, ptx_at,
 *             text_len_at, body_len_at, text_at, extras)
 *     Offsets are from the record's start. The stored length at length_at equals size -
 *     length_minus; the CRC at crc_at covers [crc_from, size - crc_back); with tail the last 8
 *     bytes repeat (size, magic); with mark_at >= 0 that byte equals mark. queue, reconsume and
 *     sys flag are int32, tags, born and prepared offset int64, the lengths uint32; body_len_at
 *     < 0 means the body runs from the text's end to size - crc_back. The text is
 *     "topic\x01born host\x01key\x01value..." in UTF-8. extras is a tuple of (offset, width)
 *     pairs, width 4 or 8, signed.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <zlib.h>

#include "_directappend.h"        /* a store's direct append (DirectAppending) */
#include "_messageinit.h"         /* Message's compiled __init__ */
#include "_requestcodec_layout.h" /* the shapes it is built for: generated from requestcodec.py */

#define FIELDS REQUEST_FIELDS /* AppendRequest's fields */

typedef struct {
    int big;
    Py_ssize_t magic_at;
    uint32_t magic;
    Py_ssize_t length_at, length_minus, crc_at, crc_from, crc_back;
    int tail;
    Py_ssize_t mark_at;
    unsigned mark;
    Py_ssize_t queue_at, tags_at, born_at, reconsume_at, sys_flag_at, ptx_at, text_len_at, body_len_at, text_at;
    Py_ssize_t n_extras;
    Py_ssize_t extra_at[MAX_EXTRAS];
    int extra_width[MAX_EXTRAS];
} Layout;

static inline uint32_t rd32(const unsigned char *p, int big) {
    if (big) return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
    return ((uint32_t)p[3] << 24) | ((uint32_t)p[2] << 16) | ((uint32_t)p[1] << 8) | (uint32_t)p[0];
}

static inline uint64_t rd64(const unsigned char *p, int big) {
    return big ? ((uint64_t)rd32(p, 1) << 32) | rd32(p + 4, 1) : ((uint64_t)rd32(p + 4, 0) << 32) | rd32(p, 0);
}

static int parse_layout(PyObject *t, Layout *l) {
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != LAYOUT_ITEMS) {
        PyErr_Format(PyExc_TypeError, "layout must be a tuple of %d items", LAYOUT_ITEMS);
        return -1;
    }
    Py_ssize_t v[LAYOUT_ITEMS - 1];
    for (int i = 0; i < LAYOUT_ITEMS - 1; i++) {
        v[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, i));
        if (v[i] == -1 && PyErr_Occurred()) return -1;
    }
    l->big = (int)v[0];
    l->magic_at = v[1];
    l->magic = (uint32_t)v[2];
    l->length_at = v[3];
    l->length_minus = v[4];
    l->crc_at = v[5];
    l->crc_from = v[6];
    l->crc_back = v[7];
    l->tail = (int)v[8];
    l->mark_at = v[9];
    l->mark = (unsigned)v[10];
    l->queue_at = v[11];
    l->tags_at = v[12];
    l->born_at = v[13];
    l->reconsume_at = v[14];
    l->sys_flag_at = v[15];
    l->ptx_at = v[16];
    l->text_len_at = v[17];
    l->body_len_at = v[18];
    l->text_at = v[19];
    PyObject *extras = PyTuple_GET_ITEM(t, LAYOUT_ITEMS - 1);
    if (!PyTuple_Check(extras) || PyTuple_GET_SIZE(extras) > MAX_EXTRAS) {
        PyErr_Format(PyExc_TypeError, "layout extras must be a tuple of at most %d (offset, width) pairs", MAX_EXTRAS);
        return -1;
    }
    l->n_extras = PyTuple_GET_SIZE(extras);
    for (Py_ssize_t i = 0; i < l->n_extras; i++) {
        PyObject *pair = PyTuple_GET_ITEM(extras, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "layout extras must be (offset, width) pairs");
            return -1;
        }
        l->extra_at[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 0));
        l->extra_width[i] = (int)PyLong_AsLong(PyTuple_GET_ITEM(pair, 1));
        if (PyErr_Occurred()) return -1;
        if (l->extra_width[i] != 4 && l->extra_width[i] != 8) {
            PyErr_SetString(PyExc_ValueError, "layout extra width must be 4 or 8");
            return -1;
        }
    }
    return 0;
}

/* The largest offset + width of a fixed field: a record shorter than this cannot be read. */
static Py_ssize_t fixed_end(const Layout *l) {
    Py_ssize_t end = l->text_at;
    Py_ssize_t at4[] = {l->magic_at, l->length_at, l->crc_at, l->queue_at, l->reconsume_at, l->sys_flag_at,
                        l->text_len_at, l->body_len_at};
    Py_ssize_t at8[] = {l->tags_at, l->born_at, l->ptx_at};
    for (size_t i = 0; i < sizeof(at4) / sizeof(at4[0]); i++)
        if (at4[i] + 4 > end) end = at4[i] + 4;
    for (size_t i = 0; i < sizeof(at8) / sizeof(at8[0]); i++)
        if (at8[i] + 8 > end) end = at8[i] + 8;
    for (Py_ssize_t i = 0; i < l->n_extras; i++)
        if (l->extra_at[i] + l->extra_width[i] > end) end = l->extra_at[i] + l->extra_width[i];
    if (l->mark_at >= 0 && l->mark_at + 1 > end) end = l->mark_at + 1;
    if (l->crc_from > end) end = l->crc_from;
    return end;
}

typedef struct {
    const char *utf8;
    Py_ssize_t len;
} Key;

/* The properties of text[0:n) after topic and host (pairs separated by \x01), minus `drop`.
 * Returns a new dict, or NULL with no exception set when the text is malformed. */
static PyObject *split_text(const char *text, Py_ssize_t n, const Key *drop, int n_drop, PyObject **topic,
                            PyObject **host) {
    const char *end = text + n;
    const char *part = text;
    Py_ssize_t index = 0;
    PyObject *props = PyDict_New();
    PyObject *key = NULL;
    int skip = 0;
    if (props == NULL) return NULL;
    *topic = *host = NULL;
    for (;;) {
        const char *sep = memchr(part, 1, (size_t)(end - part));
        const char *stop = sep ? sep : end;
        Py_ssize_t len = stop - part;
        if (index >= 2 && index % 2 == 0) { /* a key */
            skip = 0;
            for (int d = 0; d < n_drop; d++)
                if (drop[d].len == len && memcmp(drop[d].utf8, part, (size_t)len) == 0) skip = 1;
        }
        if (index < 2 || !skip) {
            PyObject *s = PyUnicode_DecodeUTF8(part, len, NULL);
            if (s == NULL) goto bad;
            if (index == 0)
                *topic = s;
            else if (index == 1)
                *host = s;
            else if (index % 2 == 0)
                key = s;
            else {
                int rc = PyDict_SetItem(props, key, s);
                Py_DECREF(s);
                Py_CLEAR(key);
                if (rc < 0) goto bad;
            }
        }
        index++;
        if (sep == NULL) break;
        part = sep + 1;
    }
    if (index % 2 != 0) goto bad; /* an odd number of fields */
    return props;
bad:
    PyErr_Clear();
    Py_XDECREF(key);
    Py_CLEAR(*topic);
    Py_CLEAR(*host);
    Py_DECREF(props);
    return NULL;
}

/* One record: a new AppendRequest, Py_None (new reference) when it does not pass, or NULL on a
 * real error (memory). */
static PyObject *decode_one(const unsigned char *rec, Py_ssize_t size, const Layout *l, Py_ssize_t min_size,
                            const Key *drop, int n_drop, PyTypeObject *cls, PyObject **setters, int64_t *extras) {
    int big = l->big;
    if (size < min_size || size - l->crc_back < l->text_at) Py_RETURN_NONE;
    if (rd32(rec + l->magic_at, big) != l->magic) Py_RETURN_NONE;
    if ((Py_ssize_t)rd32(rec + l->length_at, big) != size - l->length_minus) Py_RETURN_NONE;
    if (l->tail) {
        if (size < l->crc_from + 8) Py_RETURN_NONE;
        if ((Py_ssize_t)rd32(rec + size - 8, big) != size || rd32(rec + size - 4, big) != l->magic) Py_RETURN_NONE;
    }
    if (l->mark_at >= 0 && rec[l->mark_at] != l->mark) Py_RETURN_NONE;
    Py_ssize_t crc_end = size - l->crc_back;
    if (crc_end < l->crc_from) Py_RETURN_NONE;
    uint32_t crc = (uint32_t)crc32(0L, rec + l->crc_from, (uInt)(crc_end - l->crc_from));
    if (crc != rd32(rec + l->crc_at, big)) Py_RETURN_NONE;
    Py_ssize_t text_len = (Py_ssize_t)rd32(rec + l->text_len_at, big);
    Py_ssize_t body_at = l->text_at + text_len;
    if (text_len > crc_end - l->text_at) Py_RETURN_NONE;
    Py_ssize_t body_len = l->body_len_at >= 0 ? (Py_ssize_t)rd32(rec + l->body_len_at, big) : crc_end - body_at;
    if (body_len > crc_end - body_at) Py_RETURN_NONE;

    PyObject *topic, *host;
    PyObject *props = split_text((const char *)rec + l->text_at, text_len, drop, n_drop, &topic, &host);
    if (props == NULL) Py_RETURN_NONE;
    PyObject *values[FIELDS] = {0};
    values[0] = topic;
    values[1] = PyLong_FromLong((int32_t)rd32(rec + l->queue_at, big));
    values[2] = PyBytes_FromStringAndSize((const char *)rec + body_at, body_len);
    values[3] = PyDictProxy_New(props);
    Py_DECREF(props);
    values[4] = PyLong_FromLongLong((int64_t)rd64(rec + l->tags_at, big));
    values[5] = PyLong_FromLongLong((int64_t)rd64(rec + l->born_at, big));
    values[6] = host;
    values[7] = PyLong_FromLong((int32_t)rd32(rec + l->reconsume_at, big));
    values[8] = PyLong_FromLong((int32_t)rd32(rec + l->sys_flag_at, big));
    values[9] = PyLong_FromLongLong((int64_t)rd64(rec + l->ptx_at, big));
    PyObject *request = NULL;
    for (int i = 0; i < FIELDS; i++)
        if (values[i] == NULL) goto done;
    request = cls->tp_alloc(cls, 0);
    if (request == NULL) goto done;
    for (int i = 0; i < FIELDS; i++) {
        if (Py_TYPE(setters[i])->tp_descr_set(setters[i], request, values[i]) < 0) {
            Py_CLEAR(request);
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < l->n_extras; i++)
        extras[i] = l->extra_width[i] == 8 ? (int64_t)rd64(rec + l->extra_at[i], big)
                                           : (int64_t)(int32_t)rd32(rec + l->extra_at[i], big);
done:
    for (int i = 0; i < FIELDS; i++) Py_XDECREF(values[i]);
    return request;
}

static PyObject *py_decode(PyObject *self, PyObject *args) {
    Py_buffer buf;
    PyObject *positions, *sizes, *layout_obj, *drop_obj, *cls, *setters_obj;
    if (!PyArg_ParseTuple(args, "y*OOOOOO", &buf, &positions, &sizes, &layout_obj, &drop_obj, &cls, &setters_obj))
        return NULL;
    PyObject *pos_fast = NULL, *size_fast = NULL, *drop_fast = NULL, *setters_fast = NULL, *requests = NULL,
             *extras = NULL, *result = NULL;
    Layout l;
    memset(&l, 0, sizeof l);
    Key drop[MAX_DROP];
    PyObject *setters[FIELDS];
    if (parse_layout(layout_obj, &l) < 0) goto out;
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "cls must be a type");
        goto out;
    }
    pos_fast = PySequence_Fast(positions, "positions must be a sequence");
    size_fast = PySequence_Fast(sizes, "sizes must be a sequence");
    drop_fast = PySequence_Fast(drop_obj, "drop must be a sequence of str");
    setters_fast = PySequence_Fast(setters_obj, "setters must be a sequence");
    if (!pos_fast || !size_fast || !drop_fast || !setters_fast) goto out;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(pos_fast);
    if (PySequence_Fast_GET_SIZE(size_fast) != n) {
        PyErr_SetString(PyExc_ValueError, "positions and sizes differ in length");
        goto out;
    }
    int n_drop = (int)PySequence_Fast_GET_SIZE(drop_fast);
    if (n_drop > MAX_DROP) {
        PyErr_Format(PyExc_ValueError, "at most %d properties can be dropped", MAX_DROP);
        goto out;
    }
    for (int i = 0; i < n_drop; i++) {
        drop[i].utf8 = PyUnicode_AsUTF8AndSize(PySequence_Fast_GET_ITEM(drop_fast, i), &drop[i].len);
        if (drop[i].utf8 == NULL) goto out;
    }
    if (PySequence_Fast_GET_SIZE(setters_fast) != FIELDS) {
        PyErr_Format(PyExc_ValueError, "setters must hold AppendRequest's %d slot descriptors", FIELDS);
        goto out;
    }
    for (int i = 0; i < FIELDS; i++) {
        setters[i] = PySequence_Fast_GET_ITEM(setters_fast, i);
        if (Py_TYPE(setters[i])->tp_descr_set == NULL) {
            PyErr_SetString(PyExc_TypeError, "setters must be data descriptors (slots)");
            goto out;
        }
    }
    Py_ssize_t min_size = fixed_end(&l);
    requests = PyList_New(n);
    extras = PyList_New(n * l.n_extras);
    if (!requests || !extras) goto out;
    const unsigned char *base = (const unsigned char *)buf.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t pos = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(pos_fast, i));
        Py_ssize_t size = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(size_fast, i));
        if ((pos == -1 || size == -1) && PyErr_Occurred()) goto out;
        int64_t values[MAX_EXTRAS] = {0};
        PyObject *request;
        if (pos < 0 || size < 0 || pos > buf.len || size > buf.len - pos) {
            request = Py_NewRef(Py_None);
        } else {
            request = decode_one(base + pos, size, &l, min_size, drop, n_drop, (PyTypeObject *)cls, setters, values);
            if (request == NULL) goto out;
        }
        PyList_SET_ITEM(requests, i, request);
        for (Py_ssize_t k = 0; k < l.n_extras; k++) {
            PyObject *v = PyLong_FromLongLong(values[k]);
            if (v == NULL) goto out;
            PyList_SET_ITEM(extras, i * l.n_extras + k, v);
        }
    }
    result = PyTuple_Pack(2, requests, extras);
out:
    PyBuffer_Release(&buf);
    Py_XDECREF(pos_fast);
    Py_XDECREF(size_fast);
    Py_XDECREF(drop_fast);
    Py_XDECREF(setters_fast);
    Py_XDECREF(requests);
    Py_XDECREF(extras);
    return result;
}

/* ------------------------------------------------------------------ the put path's encoder
 *
 *   encode(messages, queue_id, born_ms, extras, max_size, born_host, reconsume_times, uniq_prefix,
 *          uniq_next, context) -> (requests, total) | None
 *     The AppendRequests of a batch of Messages of one topic for queue `queue_id` (what
 *     plugmq.kit.requestcodec.encode_messages_py, its Python twin, builds): per message a new dict
 *     of its properties plus TAGS, KEYS (joined by spaces), the message group, the priority, then
 *     `extras[i]` (a dict or None; `extras` None: none at all) and a unique id when the
 *     properties still have none (`uniq_prefix` + 16 upper-case hex digits of uniq_next() mod
 *     2**64, the format of plugmq.core.message.new_unique_id). `total` is the bodies' length.
 *     None (no exception) when the batch is not one the fast path takes - empty, not a list, an
 *     item not a Message, an extra not a dict, topics that differ, a delayed message, extras of another length,
 *     bodies over `max_size` - so the caller's checks raise the error that names it.
 *   context = (message type, its 9 slot descriptors, AppendRequest, its 10 slot descriptors,
 *              (TAGS, KEYS, SHARDING_KEY, PRIORITY, UNIQ_KEY), tags_code)
 */

#define MESSAGE_FIELDS 9
enum { M_TOPIC, M_BODY, M_TAGS, M_KEYS, M_PROPS, M_LEVEL, M_AT, M_GROUP, M_PRIORITY };
enum { P_TAGS, P_KEYS, P_SHARDING, P_PRIORITY, P_UNIQ, P_COUNT };

typedef struct {
    PyTypeObject *message_cls, *request_cls;
    PyObject *getters[MESSAGE_FIELDS];
    PyObject *setters[FIELDS];
    PyObject *names[P_COUNT];
    PyObject *tags_code;
} Context;

static int parse_context(PyObject *t, Context *c) {
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 6) {
        PyErr_SetString(PyExc_TypeError, "context must be a tuple of 6 items");
        return -1;
    }
    PyObject *mcls = PyTuple_GET_ITEM(t, 0), *getters = PyTuple_GET_ITEM(t, 1), *rcls = PyTuple_GET_ITEM(t, 2),
             *setters = PyTuple_GET_ITEM(t, 3), *names = PyTuple_GET_ITEM(t, 4);
    if (!PyType_Check(mcls) || !PyType_Check(rcls)) {
        PyErr_SetString(PyExc_TypeError, "context's classes must be types");
        return -1;
    }
    if (!PyTuple_Check(getters) || PyTuple_GET_SIZE(getters) != MESSAGE_FIELDS || !PyTuple_Check(setters) ||
        PyTuple_GET_SIZE(setters) != FIELDS || !PyTuple_Check(names) || PyTuple_GET_SIZE(names) != P_COUNT) {
        PyErr_Format(PyExc_ValueError, "context must hold Message's %d and AppendRequest's %d slot descriptors "
                     "and %d property names", MESSAGE_FIELDS, FIELDS, P_COUNT);
        return -1;
    }
    c->message_cls = (PyTypeObject *)mcls;
    c->request_cls = (PyTypeObject *)rcls;
    for (int i = 0; i < MESSAGE_FIELDS; i++) {
        c->getters[i] = PyTuple_GET_ITEM(getters, i);
        if (Py_TYPE(c->getters[i])->tp_descr_get == NULL) {
            PyErr_SetString(PyExc_TypeError, "Message's getters must be descriptors");
            return -1;
        }
    }
    for (int i = 0; i < FIELDS; i++) {
        c->setters[i] = PyTuple_GET_ITEM(setters, i);
        if (Py_TYPE(c->setters[i])->tp_descr_set == NULL) {
            PyErr_SetString(PyExc_TypeError, "AppendRequest's setters must be data descriptors (slots)");
            return -1;
        }
    }
    for (int i = 0; i < P_COUNT; i++) {
        c->names[i] = PyTuple_GET_ITEM(names, i);
        if (!PyUnicode_CheckExact(c->names[i])) {
            PyErr_SetString(PyExc_TypeError, "property names must be str");
            return -1;
        }
    }
    c->tags_code = PyTuple_GET_ITEM(t, 5);
    return 0;
}

/* Message field `i` of `m` (a new reference). */
static inline PyObject *field(const Context *c, PyObject *m, int i) {
    return Py_TYPE(c->getters[i])->tp_descr_get(c->getters[i], m, (PyObject *)c->message_cls);
}

/* `prefix` + `value` as 16 upper-case hex digits (new_unique_id's format); a new reference. */
static PyObject *unique_id(PyObject *prefix, unsigned long long value) {
    static const char digits[] = "0123456789ABCDEF";
    if (!PyUnicode_IS_ASCII(prefix)) {
        char hex[17];
        snprintf(hex, sizeof hex, "%016llX", value);
        return PyUnicode_FromFormat("%U%s", prefix, hex);
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(prefix);
    PyObject *id = PyUnicode_New(n + 16, 127);
    if (id == NULL) return NULL;
    Py_UCS1 *out = PyUnicode_1BYTE_DATA(id);
    memcpy(out, PyUnicode_1BYTE_DATA(prefix), (size_t)n);
    for (int i = 15; i >= 0; i--) {
        out[n + i] = (Py_UCS1)digits[value & 15];
        value >>= 4;
    }
    return id;
}

/* The properties of one message as the twin's request_properties makes them; NULL on error. */
static PyObject *message_properties(const Context *c, PyObject **f, PyObject *extra, PyObject *uniq_prefix,
                                    PyObject *uniq_next) {
    PyObject *props = PyDict_New();
    if (props == NULL) return NULL;
    Py_ssize_t n_user = PyObject_Length(f[M_PROPS]);
    if (n_user < 0) goto bad;
    if (n_user > 0 && PyDict_Merge(props, f[M_PROPS], 1) < 0) goto bad;
    if (f[M_TAGS] != Py_None && PyDict_SetItem(props, c->names[P_TAGS], f[M_TAGS]) < 0) goto bad;
    int has_keys = PyObject_IsTrue(f[M_KEYS]);
    if (has_keys < 0) goto bad;
    if (has_keys) {
        PyObject *space = PyUnicode_FromString(" ");
        PyObject *joined = space ? PyUnicode_Join(space, f[M_KEYS]) : NULL;
        Py_XDECREF(space);
        if (joined == NULL) goto bad;
        int rc = PyDict_SetItem(props, c->names[P_KEYS], joined);
        Py_DECREF(joined);
        if (rc < 0) goto bad;
    }
    if (f[M_GROUP] != Py_None && PyDict_SetItem(props, c->names[P_SHARDING], f[M_GROUP]) < 0) goto bad;
    if (f[M_PRIORITY] != Py_None) {
        PyObject *text = PyObject_Str(f[M_PRIORITY]);
        if (text == NULL) goto bad;
        int rc = PyDict_SetItem(props, c->names[P_PRIORITY], text);
        Py_DECREF(text);
        if (rc < 0) goto bad;
    }
    if (extra != Py_None) {
        int has_extra = PyObject_IsTrue(extra);
        if (has_extra < 0 || (has_extra && PyDict_Merge(props, extra, 1) < 0)) goto bad;
    }
    int has_uniq = PyDict_Contains(props, c->names[P_UNIQ]);
    if (has_uniq < 0) goto bad;
    if (!has_uniq) {
        PyObject *count = PyObject_CallNoArgs(uniq_next);
        if (count == NULL) goto bad;
        unsigned long long value = PyLong_AsUnsignedLongLongMask(count);
        Py_DECREF(count);
        if (value == (unsigned long long)-1 && PyErr_Occurred()) goto bad;
        PyObject *id = unique_id(uniq_prefix, value);
        if (id == NULL) goto bad;
        int rc = PyDict_SetItem(props, c->names[P_UNIQ], id);
        Py_DECREF(id);
        if (rc < 0) goto bad;
    }
    return props;
bad:
    Py_DECREF(props);
    return NULL;
}

/* Whether the batch passes the checks the fast path leaves to the caller (0: no, 1: yes, -1: error);
 * `total` gets the bodies' length. `messages` and `extras` (unless None) are tuples: snapshots of
 * the caller's lists, which Python code run from here (a key's __eq__) cannot shrink. */
static int batch_fits(const Context *c, PyObject *messages, PyObject *extras, Py_ssize_t max_size,
                      Py_ssize_t *total) {
    Py_ssize_t n = PyTuple_GET_SIZE(messages);
    if (n == 0) return 0;
    if (extras != Py_None) {
        if (PyTuple_GET_SIZE(extras) != n) return 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *extra = PyTuple_GET_ITEM(extras, i);
            if (extra != Py_None && !PyDict_Check(extra)) return 0; /* other mappings: the twin's update() */
        }
    }
    PyObject *topic = NULL;
    *total = 0;
    int fits = 1;
    for (Py_ssize_t i = 0; i < n && fits; i++) {
        PyObject *m = PyTuple_GET_ITEM(messages, i);
        if (Py_TYPE(m) != c->message_cls) {
            fits = 0;
            break;
        }
        PyObject *t = field(c, m, M_TOPIC), *body = field(c, m, M_BODY), *level = field(c, m, M_LEVEL),
                 *at = field(c, m, M_AT);
        if (!t || !body || !level || !at) {
            fits = -1;
        } else if (!PyUnicode_CheckExact(t) || !PyBytes_CheckExact(body) || level != Py_None || at != Py_None) {
            fits = 0;
        } else if (topic == NULL) {
            topic = Py_NewRef(t);
        } else if (t != topic) {
            int same = PyUnicode_Compare(t, topic) == 0;
            if (PyErr_Occurred()) fits = -1; else if (!same) fits = 0;
        }
        if (fits == 1) *total += PyBytes_GET_SIZE(body);
        Py_XDECREF(t);
        Py_XDECREF(body);
        Py_XDECREF(level);
        Py_XDECREF(at);
    }
    Py_XDECREF(topic);
    if (fits == 1 && *total > max_size) fits = 0;
    return fits;
}

static PyObject *py_encode(PyObject *self, PyObject *args) {
    PyObject *messages, *queue_id, *born_ms, *extras, *born_host, *reconsume, *uniq_prefix, *uniq_next, *context;
    Py_ssize_t max_size;
    if (!PyArg_ParseTuple(args, "OOOOnOOUOO", &messages, &queue_id, &born_ms, &extras, &max_size, &born_host,
                          &reconsume, &uniq_prefix, &uniq_next, &context))
        return NULL;
    Context c;
    if (parse_context(context, &c) < 0) return NULL;
    if (!PyList_Check(messages) || (extras != Py_None && !PyList_Check(extras))) Py_RETURN_NONE;
    PyObject *requests = NULL, *zero = NULL, *last_tags = NULL, *last_code = NULL, *result = NULL;
    PyObject *batch = PyList_AsTuple(messages);
    PyObject *extra_of = extras == Py_None ? Py_NewRef(Py_None) : PyList_AsTuple(extras);
    if (batch == NULL || extra_of == NULL) goto out;
    Py_ssize_t total = 0;
    int fits = batch_fits(&c, batch, extra_of, max_size, &total);
    if (fits < 0) goto out;
    if (!fits) {
        result = Py_NewRef(Py_None);
        goto out;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(batch);
    requests = PyList_New(n);
    zero = PyLong_FromLong(0);
    if (requests == NULL || zero == NULL) goto out;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *m = PyTuple_GET_ITEM(batch, i);
        PyObject *f[MESSAGE_FIELDS] = {0};
        PyObject *props = NULL, *request = NULL;
        int ok = 0;
        for (int k = 0; k < MESSAGE_FIELDS; k++)
            if ((f[k] = field(&c, m, k)) == NULL) goto one_done;
        if (f[M_TAGS] == Py_None) {
            Py_XSETREF(last_code, Py_NewRef(zero));
            Py_XSETREF(last_tags, Py_NewRef(Py_None));
        } else if (f[M_TAGS] != last_tags) {
            PyObject *code = PyObject_CallOneArg(c.tags_code, f[M_TAGS]);
            if (code == NULL) goto one_done;
            Py_XSETREF(last_code, code);
            Py_XSETREF(last_tags, Py_NewRef(f[M_TAGS]));
        }
        PyObject *extra = extra_of == Py_None ? Py_None : PyTuple_GET_ITEM(extra_of, i);
        props = message_properties(&c, f, extra, uniq_prefix, uniq_next);
        if (props == NULL) goto one_done;
        PyObject *proxy = PyDictProxy_New(props);
        if (proxy == NULL) goto one_done;
        PyObject *values[FIELDS] = {f[M_TOPIC], queue_id, f[M_BODY], proxy, last_code, born_ms,
                                    born_host, reconsume, zero, zero};
        request = c.request_cls->tp_alloc(c.request_cls, 0);
        if (request != NULL) {
            ok = 1;
            for (int k = 0; k < FIELDS && ok; k++)
                if (Py_TYPE(c.setters[k])->tp_descr_set(c.setters[k], request, values[k]) < 0) ok = 0;
        }
        Py_DECREF(proxy);
    one_done:
        for (int k = 0; k < MESSAGE_FIELDS; k++) Py_XDECREF(f[k]);
        Py_XDECREF(props);
        if (!ok) {
            Py_XDECREF(request);
            goto out;
        }
        PyList_SET_ITEM(requests, i, request);
    }
    result = Py_BuildValue("(On)", requests, total);
out:
    Py_XDECREF(batch);
    Py_XDECREF(extra_of);
    Py_XDECREF(requests);
    Py_XDECREF(zero);
    Py_XDECREF(last_tags);
    Py_XDECREF(last_code);
    return result;
}

/* ------------------------------------------------------------------ the plain single put
 *
 *   put_one(message, queue_id, born_ms, extra, plan) -> SendResult | None
 *     Broker.put's common case in one call (born_ms None: plan's now_ms(), or with none the wall clock) (plugmq.kit.requestcodec.put_one_py is its twin): the
 *     request of `message` for queue `queue_id` as encode() builds it, stored by plan's `append`
 *     (the store's append), the SendResult built from what the store answered, the traffic
 *     counters updated and the arrivals woken. None, with nothing done, when it is not that case
 *     - not a plain Message, delayed, with a priority, a body over the limit, a queue id not an int
 *     in range, an extra not a dict - so the caller's general path decides (and raises what is
 *     wrong). An error of the store's append propagates, nothing counted.
 *   plan = (context, max_size, born_host, append, queues, result_getters, send_result_cls,
 *           send_result_slots, put_ok, send_ok, flush_timeout, counters, wake, unique_ids, now_ms,
 *           direct, watchers)
 *     context as encode()'s; queues: the topic's MessageQueues; result_getters: AppendResult's
 *     status, msg_id and queue_offset slot descriptors; send_result_slots: SendResult's 6 slot
 *     descriptors in field order; counters = (normal [count, bytes], fifo [count, bytes],
 *     latency [bucket counts..., seconds sum], edges (float seconds, ascending)); unique_ids() ->
 *     (prefix, next): plugmq.core.message.unique_id_state, asked per put (a forked child has its own);
 *     now_ms: the broker clock's now_ms, or None for the wall clock (SystemClock's, read here);
 *     direct: the store's direct append (a PyCapsule, see _directappend.h) or None: when it takes
 *     the call no AppendRequest or AppendResult is built; when it declines, `append` stores;
 *     watchers: a tuple of lists, changed in place only, all empty while wake() has nothing to do
 *     (then it is not called), or None: wake() is always called.
 */

enum { PL_CONTEXT, PL_MAX_SIZE, PL_HOST, PL_APPEND, PL_QUEUES, PL_GETTERS, PL_SR_CLS, PL_SR_SLOTS, PL_PUT_OK,
       PL_SEND_OK, PL_FLUSH_TIMEOUT, PL_COUNTERS, PL_WAKE, PL_UNIQ, PL_NOW, PL_DIRECT, PL_WATCHERS, PL_ITEMS };
_Static_assert(PL_ITEMS == PUT_PLAN_ITEMS, "put_plan's tuple, as requestcodec.CONSTANTS says");
#define SEND_RESULT_FIELDS 6

/* list[i] += delta (ints); 0 or -1. Nothing between the read and the write runs Python code, so
 * under the GIL the update is atomic: threads share these counters without a lock. */
static int add_int(PyObject *list, Py_ssize_t i, long long delta) {
    PyObject *old = PyList_GET_ITEM(list, i);
    long long value = PyLong_AsLongLong(old);
    if (value == -1 && PyErr_Occurred()) return -1;
    PyObject *now = PyLong_FromLongLong(value + delta);
    if (now == NULL) return -1;
    PyList_SetItem(list, i, now); /* steals `now`, releases `old` */
    return 0;
}

/* Count one stored message of `body_len` bytes whose append took `seconds` (as Traffic.sent). */
static int count_sent(PyObject *counters, int fifo, Py_ssize_t body_len, double seconds) {
    PyObject *entry = PyTuple_GET_ITEM(counters, fifo ? 1 : 0), *latency = PyTuple_GET_ITEM(counters, 2),
             *edges = PyTuple_GET_ITEM(counters, 3);
    Py_ssize_t n_edges = PyTuple_GET_SIZE(edges);
    if (!PyList_Check(entry) || PyList_GET_SIZE(entry) != 2 || !PyList_Check(latency) ||
        PyList_GET_SIZE(latency) != n_edges + 2) {
        PyErr_SetString(PyExc_TypeError, "put_one: counters must be ([count, bytes], [count, bytes], "
                        "[buckets..., sum], edges)");
        return -1;
    }
    Py_ssize_t lo = 0, hi = n_edges; /* bisect_left(edges, seconds) */
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        double edge = PyFloat_AsDouble(PyTuple_GET_ITEM(edges, mid));
        if (edge == -1.0 && PyErr_Occurred()) return -1;
        if (edge < seconds) lo = mid + 1; else hi = mid;
    }
    if (add_int(entry, 0, 1) < 0 || add_int(entry, 1, body_len) < 0 || add_int(latency, lo, 1) < 0) return -1;
    double sum = PyFloat_AsDouble(PyList_GET_ITEM(latency, n_edges + 1));
    if (sum == -1.0 && PyErr_Occurred()) return -1;
    PyObject *now = PyFloat_FromDouble(sum + seconds);
    if (now == NULL) return -1;
    PyList_SetItem(latency, n_edges + 1, now);
    return 0;
}

static double monotonic_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t); /* time.perf_counter()'s clock on Linux */
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A SendResult of the given fields (its region None), filled through the plan's slots. */
static PyObject *new_send_result(PyObject *plan, PyObject *status, PyObject *msg_id, PyObject *unique,
                                 PyObject *queue, PyObject *queue_offset) {
    PyObject *slots = PyTuple_GET_ITEM(plan, PL_SR_SLOTS), *cls = PyTuple_GET_ITEM(plan, PL_SR_CLS);
    if (!PyTuple_Check(slots) || PyTuple_GET_SIZE(slots) != SEND_RESULT_FIELDS || !PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "put_one: plan's SendResult descriptors are not as expected");
        return NULL;
    }
    PyObject *values[SEND_RESULT_FIELDS] = {status, msg_id, unique, queue, queue_offset, Py_None};
    PyObject *result = ((PyTypeObject *)cls)->tp_alloc((PyTypeObject *)cls, 0);
    for (int i = 0; result != NULL && i < SEND_RESULT_FIELDS; i++) {
        PyObject *slot = PyTuple_GET_ITEM(slots, i);
        if (Py_TYPE(slot)->tp_descr_set == NULL || Py_TYPE(slot)->tp_descr_set(slot, result, values[i]) < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "put_one: SendResult's slots must be data descriptors");
            Py_CLEAR(result);
        }
    }
    return result;
}

/* The SendResult of a stored request: its unique id, the store's msg id and queue offset. */
static PyObject *send_result(PyObject *plan, PyObject *stored, PyObject *unique, PyObject *queue) {
    PyObject *getters = PyTuple_GET_ITEM(plan, PL_GETTERS);
    if (!PyTuple_Check(getters) || PyTuple_GET_SIZE(getters) != 3) {
        PyErr_SetString(PyExc_TypeError, "put_one: plan's result descriptors are not as expected");
        return NULL;
    }
    PyObject *got[3] = {0};
    PyObject *result = NULL;
    for (int i = 0; i < 3; i++) {
        PyObject *d = PyTuple_GET_ITEM(getters, i);
        if (Py_TYPE(d)->tp_descr_get == NULL) {
            PyErr_SetString(PyExc_TypeError, "put_one: AppendResult's getters must be descriptors");
            goto out;
        }
        if ((got[i] = Py_TYPE(d)->tp_descr_get(d, stored, (PyObject *)Py_TYPE(stored))) == NULL) goto out;
    }
    PyObject *status = got[0] == PyTuple_GET_ITEM(plan, PL_PUT_OK) ? PyTuple_GET_ITEM(plan, PL_SEND_OK)
                                                                  : PyTuple_GET_ITEM(plan, PL_FLUSH_TIMEOUT);
    result = new_send_result(plan, status, got[1], unique, queue, got[2]);
out:
    for (int i = 0; i < 3; i++) Py_XDECREF(got[i]);
    return result;
}

/* ``sent`` (a new SendResult, or NULL with an error set) once the plan's wake-up ran: the
 * consumers waiting for arrivals hear of the stored message; NULL if either failed. */
static PyObject *woken_with(PyObject *plan, PyObject *sent) {
    if (sent == NULL) return NULL;
    PyObject *watchers = PyTuple_GET_ITEM(plan, PL_WATCHERS);
    if (PyTuple_Check(watchers)) { /* nobody to wake: no call (a bad item: call, and let wake() decide) */
        Py_ssize_t n = PyTuple_GET_SIZE(watchers), k = 0;
        while (k < n && PyList_Check(PyTuple_GET_ITEM(watchers, k)) && PyList_GET_SIZE(PyTuple_GET_ITEM(watchers, k)) == 0)
            k++;
        if (k == n) return sent;
    }
    PyObject *woken = PyObject_CallNoArgs(PyTuple_GET_ITEM(plan, PL_WAKE));
    if (woken == NULL) {
        Py_DECREF(sent);
        return NULL;
    }
    Py_DECREF(woken);
    return sent;
}

/* The direct append of a capsule (see _directappend.h); NULL with an error when it is not one. */
static DirectAppend *direct_of(PyObject *capsule) {
    DirectAppend *api = PyCapsule_GetPointer(capsule, PLUGMQ_DIRECT_APPEND);
    if (api != NULL && api->version != PLUGMQ_DIRECT_APPEND_VERSION) {
        PyErr_Format(PyExc_TypeError, "direct append version %d, expected %d (rebuild the kernels)", api->version,
                     PLUGMQ_DIRECT_APPEND_VERSION);
        return NULL;
    }
    return api;
}

/* Store `fields` by the plan's direct append and answer the SendResult: a new reference, Py_None
 * (new) when the store declined (nothing done), NULL on error. Counts and wakes as put_one. */
static PyObject *put_direct(PyObject *plan, PyObject *const *fields, PyObject *unique, PyObject *queue, int fifo) {
    DirectAppend *api = direct_of(PyTuple_GET_ITEM(plan, PL_DIRECT));
    if (api == NULL) return NULL;
    int64_t at[4];
    PyObject *msg_id = NULL;
    double started = monotonic_s();
    int taken = api->append(api->context, fields, at, &msg_id);
    if (taken <= 0) return taken < 0 ? NULL : Py_NewRef(Py_None);
    double seconds = monotonic_s() - started;
    PyObject *sent = NULL, *qoff = PyLong_FromLongLong(at[0]);
    if (qoff != NULL && count_sent(PyTuple_GET_ITEM(plan, PL_COUNTERS), fifo, PyBytes_GET_SIZE(fields[DA_BODY]),
                                   seconds) == 0)
        sent = new_send_result(plan, PyTuple_GET_ITEM(plan, PL_SEND_OK), msg_id, unique, queue, qoff);
    Py_XDECREF(qoff);
    Py_DECREF(msg_id);
    return woken_with(plan, sent);
}

/* parse_context of the context every plan shares (one per process), parsed once: the cache keeps
 * a reference to the tuple, so the borrowed descriptors it points at stay alive. */
static int cached_context(PyObject *context, Context *c) {
    static PyObject *parsed_from = NULL;
    static Context parsed;
    if (context == parsed_from) {
        *c = parsed;
        return 0;
    }
    if (parse_context(context, c) < 0) return -1; /* a bad context leaves the cache as it was */
    parsed = *c;
    Py_XSETREF(parsed_from, Py_NewRef(context));
    return 0;
}

/* The checks that send a message to the general path: 1 plain, 0 not, -1 error. */
static int plain_message(const Context *c, PyObject **f, PyObject *extra, Py_ssize_t max_size) {
    if (!PyUnicode_CheckExact(f[M_TOPIC]) || !PyBytes_CheckExact(f[M_BODY])) return 0;
    if (f[M_LEVEL] != Py_None || f[M_AT] != Py_None || f[M_PRIORITY] != Py_None) return 0;
    if (PyBytes_GET_SIZE(f[M_BODY]) > max_size) return 0;
    if (extra != Py_None && !PyDict_CheckExact(extra)) return 0;
    return 1;
}

static PyObject *py_put_one(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyTuple_Check(args[4]) || PyTuple_GET_SIZE(args[4]) != PL_ITEMS) {
        PyErr_Format(PyExc_TypeError, "put_one(message, queue_id, born_ms, extra, plan: tuple of %d)", PL_ITEMS);
        return NULL;
    }
    PyObject *message = args[0], *queue_id = args[1], *born_ms = args[2], *extra = args[3], *plan = args[4];
    Context c;
    if (cached_context(PyTuple_GET_ITEM(plan, PL_CONTEXT), &c) < 0) return NULL;
    Py_ssize_t max_size = PyLong_AsSsize_t(PyTuple_GET_ITEM(plan, PL_MAX_SIZE));
    if (max_size == -1 && PyErr_Occurred()) return NULL;
    PyObject *queues = PyTuple_GET_ITEM(plan, PL_QUEUES), *counters = PyTuple_GET_ITEM(plan, PL_COUNTERS);
    if (!PyTuple_Check(queues) || !PyTuple_Check(counters) || PyTuple_GET_SIZE(counters) != 4 ||
        !PyTuple_Check(PyTuple_GET_ITEM(counters, 3))) {
        PyErr_SetString(PyExc_TypeError, "put_one: plan's queues and counters must be tuples");
        return NULL;
    }
    if (Py_TYPE(message) != c.message_cls || !PyLong_CheckExact(queue_id)) Py_RETURN_NONE;
    Py_ssize_t qid = PyLong_AsSsize_t(queue_id);
    if (qid == -1 && PyErr_Occurred()) {
        PyErr_Clear(); /* out of range: the general path names it */
        Py_RETURN_NONE;
    }
    if (qid < 0 || qid >= PyTuple_GET_SIZE(queues)) Py_RETURN_NONE;
    PyObject *f[MESSAGE_FIELDS] = {0};
    PyObject *props = NULL, *request = NULL, *code = NULL, *stored = NULL, *result = NULL, *zero = NULL, *born = NULL,
             *uniq = NULL;
    for (int k = 0; k < MESSAGE_FIELDS; k++)
        if ((f[k] = field(&c, message, k)) == NULL) goto out;
    int plain = plain_message(&c, f, extra, max_size);
    if (plain <= 0) {
        if (plain == 0) result = Py_NewRef(Py_None);
        goto out;
    }
    zero = PyLong_FromLong(0);
    code = f[M_TAGS] == Py_None ? Py_NewRef(zero) : PyObject_CallOneArg(c.tags_code, f[M_TAGS]);
    if (zero == NULL || code == NULL) goto out;
    if (born_ms == Py_None && PyTuple_GET_ITEM(plan, PL_NOW) != Py_None) {
        born = PyObject_CallNoArgs(PyTuple_GET_ITEM(plan, PL_NOW));
    } else if (born_ms == Py_None) { /* now on the wall clock, as time.time_ns() // 1_000_000 */
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        born = PyLong_FromLongLong((long long)t.tv_sec * 1000 + t.tv_nsec / 1000000);
    } else {
        born = Py_NewRef(born_ms);
    }
    if (born == NULL) goto out;
    uniq = PyObject_CallNoArgs(PyTuple_GET_ITEM(plan, PL_UNIQ));
    if (uniq == NULL) goto out;
    if (!PyTuple_Check(uniq) || PyTuple_GET_SIZE(uniq) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(uniq, 0))) {
        PyErr_SetString(PyExc_TypeError, "put_one: unique_ids() must return (prefix: str, next)");
        goto out;
    }
    props = message_properties(&c, f, extra, PyTuple_GET_ITEM(uniq, 0), PyTuple_GET_ITEM(uniq, 1));
    if (props == NULL) goto out;
    PyObject *unique = PyDict_GetItemWithError(props, c.names[P_UNIQ]); /* borrowed: props keeps it */
    if (unique == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_KeyError, "put_one: no unique id");
        goto out;
    }
    int fifo = PyDict_Contains(props, c.names[P_SHARDING]);
    if (fifo < 0) goto out;
    if (PyTuple_GET_ITEM(plan, PL_DIRECT) != Py_None) { /* the store's direct append, when it takes it */
        PyObject *fields[DA_FIELDS] = {f[M_TOPIC], queue_id, f[M_BODY], props, code, born,
                                       PyTuple_GET_ITEM(plan, PL_HOST), zero, zero, zero};
        PyObject *sent = put_direct(plan, fields, unique, PyTuple_GET_ITEM(queues, qid), fifo);
        if (sent == NULL) goto out;
        if (sent != Py_None) {
            result = sent;
            goto out;
        }
        Py_DECREF(sent); /* declined: the store's append, which publishes */
    }
    PyObject *proxy = PyDictProxy_New(props);
    if (proxy == NULL) goto out;
    PyObject *values[FIELDS] = {f[M_TOPIC], queue_id, f[M_BODY], proxy, code, born,
                                PyTuple_GET_ITEM(plan, PL_HOST), zero, zero, zero};
    request = c.request_cls->tp_alloc(c.request_cls, 0);
    for (int k = 0; request != NULL && k < FIELDS; k++)
        if (Py_TYPE(c.setters[k])->tp_descr_set(c.setters[k], request, values[k]) < 0) Py_CLEAR(request);
    Py_DECREF(proxy);
    if (request == NULL) goto out;
    double started = monotonic_s();
    stored = PyObject_CallOneArg(PyTuple_GET_ITEM(plan, PL_APPEND), request);
    if (stored == NULL) goto out;
    double seconds = monotonic_s() - started;
    if (count_sent(counters, fifo, PyBytes_GET_SIZE(f[M_BODY]), seconds) < 0) goto out;
    result = woken_with(plan, send_result(plan, stored, unique, PyTuple_GET_ITEM(queues, qid)));
out:
    for (int k = 0; k < MESSAGE_FIELDS; k++) Py_XDECREF(f[k]);
    Py_XDECREF(props);
    Py_XDECREF(request);
    Py_XDECREF(code);
    Py_XDECREF(stored);
    Py_XDECREF(zero);
    Py_XDECREF(born);
    Py_XDECREF(uniq);
    return result;
}

/* ------------------------------------------------------------------ the plain batch put
 *
 *   put_batch(messages, queue_id, born_ms, extras, max_size, born_host, uniq_prefix, uniq_next, context,
 *             direct, append_columns, admit, columns) -> (results, unique_ids, total) | None
 *     Broker.put_batch's common case in one call (plugmq.kit.requestcodec.put_batch_py is its
 *     twin): the batch checked and encoded as encode() does it (None, nothing done, where encode()
 *     answers None or a message has a priority), then admit(count, total) (the caller's checks:
 *     raising stops it before anything is stored), then stored by `direct`'s append_many (the
 *     store's direct append, see _directappend.h) with no AppendRequest built - results =
 *     columns(rows, id_prefix, store_ts) - or, when `direct` is None or declines, by
 *     append_columns(requests) (the store's, which publishes). unique_ids: each message's.
 */
_Static_assert(DA_FIELDS == FIELDS, "a direct append's fields are AppendRequest's, in its order");

static int batch_has_priority(const Context *c, PyObject *batch) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(batch); i++) {
        PyObject *priority = field(c, PyTuple_GET_ITEM(batch, i), M_PRIORITY);
        if (priority == NULL) return -1;
        int has = priority != Py_None;
        Py_DECREF(priority);
        if (has) return 1;
    }
    return 0;
}

/* The AppendRequests of n field rows (properties as read-only views): the store's fallback. */
static PyObject *requests_of(const Context *c, PyObject *const *fields, Py_ssize_t n) {
    PyObject *requests = PyList_New(n);
    for (Py_ssize_t i = 0; requests != NULL && i < n; i++) {
        PyObject *values[FIELDS];
        memcpy(values, fields + i * DA_FIELDS, sizeof values);
        PyObject *proxy = PyDictProxy_New(values[DA_PROPERTIES]);
        PyObject *request = proxy == NULL ? NULL : c->request_cls->tp_alloc(c->request_cls, 0);
        values[DA_PROPERTIES] = proxy;
        for (int k = 0; request != NULL && k < FIELDS; k++)
            if (Py_TYPE(c->setters[k])->tp_descr_set(c->setters[k], request, values[k]) < 0) Py_CLEAR(request);
        Py_XDECREF(proxy);
        if (request == NULL) Py_CLEAR(requests);
        else PyList_SET_ITEM(requests, i, request);
    }
    return requests;
}

/* Fill n rows of fields (new references) and the unique ids of the batch; 0 or -1. */
static int batch_fields(const Context *c, PyObject *batch, PyObject *extra_of, PyObject *const *shared,
                        PyObject *uniq_prefix, PyObject *uniq_next, PyObject **fields, PyObject *ids) {
    PyObject *last_tags = NULL, *last_code = NULL;
    int rc = 0;
    for (Py_ssize_t i = 0; rc == 0 && i < PyTuple_GET_SIZE(batch); i++) {
        PyObject *f[MESSAGE_FIELDS] = {0};
        PyObject **row = fields + i * DA_FIELDS;
        for (int k = 0; k < MESSAGE_FIELDS && rc == 0; k++)
            if ((f[k] = field(c, PyTuple_GET_ITEM(batch, i), k)) == NULL) rc = -1;
        if (rc == 0 && f[M_TAGS] != last_tags) { /* one tag code per run of the same tags */
            PyObject *code = f[M_TAGS] == Py_None ? Py_NewRef(shared[DA_RECONSUME]) : PyObject_CallOneArg(c->tags_code, f[M_TAGS]);
            if (code == NULL) rc = -1;
            else {
                Py_XSETREF(last_code, code);
                Py_XSETREF(last_tags, Py_NewRef(f[M_TAGS]));
            }
        }
        PyObject *extra = extra_of == Py_None ? Py_None : PyTuple_GET_ITEM(extra_of, i);
        PyObject *props = rc < 0 ? NULL : message_properties(c, f, extra, uniq_prefix, uniq_next);
        PyObject *unique = props == NULL ? NULL : PyDict_GetItemWithError(props, c->names[P_UNIQ]);
        if (unique == NULL) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_KeyError, "put_batch: no unique id");
            Py_XDECREF(props);
            rc = -1;
        } else {
            PyList_SET_ITEM(ids, i, Py_NewRef(unique));
            for (int k = 0; k < DA_FIELDS; k++) row[k] = Py_NewRef(shared[k]); /* queue, born, host, zeros */
            Py_SETREF(row[DA_TOPIC], Py_NewRef(f[M_TOPIC]));
            Py_SETREF(row[DA_BODY], Py_NewRef(f[M_BODY]));
            Py_SETREF(row[DA_PROPERTIES], props);
            Py_SETREF(row[DA_TAGS_CODE], Py_NewRef(last_code));
        }
        for (int k = 0; k < MESSAGE_FIELDS; k++) Py_XDECREF(f[k]);
    }
    Py_XDECREF(last_tags);
    Py_XDECREF(last_code);
    return rc;
}

/* Store the rows: the direct append where it takes them, else the store's append_columns. */
static PyObject *store_rows(const Context *c, PyObject *direct, PyObject *append_columns, PyObject *columns,
                            PyObject **fields, Py_ssize_t n) {
    if (direct != Py_None) {
        DirectAppend *api = direct_of(direct);
        if (api == NULL) return NULL;
        PyObject *rows = PyBytes_FromStringAndSize(NULL, n * 3 * (Py_ssize_t)sizeof(int64_t));
        if (rows == NULL) return NULL;
        int64_t ts = 0;
        int taken = api->append_many(api->context, n, fields, (int64_t *)PyBytes_AS_STRING(rows), &ts);
        PyObject *results = NULL;
        if (taken > 0) {
            PyObject *prefix = PyUnicode_DecodeASCII(api->id_prefix, sizeof api->id_prefix, NULL);
            if (prefix != NULL) results = PyObject_CallFunction(columns, "OOL", rows, prefix, (long long)ts);
            Py_XDECREF(prefix);
        }
        Py_DECREF(rows);
        if (taken != 0) return results; /* stored, or an error */
    }
    PyObject *requests = requests_of(c, fields, n);
    if (requests == NULL) return NULL;
    PyObject *results = PyObject_CallOneArg(append_columns, requests);
    Py_DECREF(requests);
    return results;
}

static PyObject *py_put_batch(PyObject *self, PyObject *args) {
    PyObject *messages, *queue_id, *born_ms, *extras, *born_host, *uniq_prefix, *uniq_next, *context, *direct,
        *append_columns, *admit, *columns;
    Py_ssize_t max_size;
    if (!PyArg_ParseTuple(args, "OOOOnOUOOOOOO", &messages, &queue_id, &born_ms, &extras, &max_size, &born_host,
                          &uniq_prefix, &uniq_next, &context, &direct, &append_columns, &admit, &columns))
        return NULL;
    Context c;
    if (cached_context(context, &c) < 0) return NULL;
    if (!PyList_Check(messages) || (extras != Py_None && !PyList_Check(extras))) Py_RETURN_NONE;
    PyObject *result = NULL, *ids = NULL, *zero = NULL, *results = NULL, **fields = NULL;
    Py_ssize_t n = 0, total = 0;
    PyObject *batch = PyList_AsTuple(messages);
    PyObject *extra_of = extras == Py_None ? Py_NewRef(Py_None) : PyList_AsTuple(extras);
    if (batch == NULL || extra_of == NULL) goto out;
    int fits = batch_fits(&c, batch, extra_of, max_size, &total);
    if (fits == 1) fits = batch_has_priority(&c, batch) == 0 ? 1 : (PyErr_Occurred() ? -1 : 0);
    if (fits <= 0) {
        if (fits == 0) result = Py_NewRef(Py_None);
        goto out;
    }
    n = PyTuple_GET_SIZE(batch);
    zero = PyLong_FromLong(0);
    ids = PyList_New(n);
    fields = PyMem_Calloc((size_t)(n * DA_FIELDS), sizeof(PyObject *));
    if (zero == NULL || ids == NULL || fields == NULL) {
        if (fields == NULL) PyErr_NoMemory();
        goto out;
    }
    PyObject *shared[DA_FIELDS] = {Py_None, queue_id, Py_None, Py_None, Py_None, born_ms, born_host, zero, zero, zero};
    if (batch_fields(&c, batch, extra_of, shared, uniq_prefix, uniq_next, fields, ids) < 0) goto out;
    PyObject *admitted = PyObject_CallFunction(admit, "nn", n, total);
    if (admitted == NULL) goto out;
    Py_DECREF(admitted);
    results = store_rows(&c, direct, append_columns, columns, fields, n);
    if (results != NULL) result = Py_BuildValue("(OOn)", results, ids, total);
out:
    if (fields != NULL)
        for (Py_ssize_t i = 0; i < n * DA_FIELDS; i++) Py_XDECREF(fields[i]);
    PyMem_Free(fields);
    Py_XDECREF(batch);
    Py_XDECREF(extra_of);
    Py_XDECREF(ids);
    Py_XDECREF(zero);
    Py_XDECREF(results);
    return result;
}

/* ------------------------------------------------------------------ a direct append, called from Python
 *
 *   append_direct(capsule, fields) -> (queue_offset, commit_log_offset, size, store_ts, msg_id) | None
 *     Call a store's direct append (see _directappend.h) with an AppendRequest's 10 fields in
 *     field order (properties a dict): what put_one does, for tests and the storage conformance
 *     suite. None: the store declined (nothing done).
 */
static PyObject *py_append_direct(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyTuple_Check(args[1]) || PyTuple_GET_SIZE(args[1]) != DA_FIELDS) {
        PyErr_Format(PyExc_TypeError, "append_direct(capsule, fields: tuple of %d)", DA_FIELDS);
        return NULL;
    }
    DirectAppend *api = direct_of(args[0]);
    if (api == NULL) return NULL;
    int64_t at[4];
    PyObject *msg_id = NULL;
    int taken = api->append(api->context, &PyTuple_GET_ITEM(args[1], 0), at, &msg_id);
    if (taken <= 0) return taken < 0 ? NULL : Py_NewRef(Py_None);
    return Py_BuildValue("(LLLLN)", (long long)at[0], (long long)at[1], (long long)at[2], (long long)at[3], msg_id);
}

/* ------------------------------------------------------------------ slot filling
 *
 *   fill(slots, obj, *values) -> None
 *     Set each slot descriptor of the tuple `slots` on `obj` to the value in the same place (as
 *     `slots[i].__set__(obj, values[i])` does, one call instead of one per field): how a frozen
 *     value type's hand-written __init__ or trusted constructor fills its fields. TypeError when
 *     the counts differ or a slot is not a data descriptor; a setter's own error otherwise.
 *     Python twin: plugmq.core.message.fill_slots_py.
 */
static PyObject *py_fill(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 2 || !PyTuple_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "fill(slots, obj, *values): slots must be a tuple");
        return NULL;
    }
    PyObject *slots = args[0], *obj = args[1];
    Py_ssize_t n = PyTuple_GET_SIZE(slots);
    if (nargs - 2 != n) {
        PyErr_Format(PyExc_TypeError, "fill: %zd values for %zd slots", nargs - 2, n);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *slot = PyTuple_GET_ITEM(slots, i);
        descrsetfunc set = Py_TYPE(slot)->tp_descr_set;
        if (set == NULL) {
            PyErr_Format(PyExc_TypeError, "fill: slot %zd is not a data descriptor", i);
            return NULL;
        }
        if (set(slot, obj, args[i + 2]) < 0) return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode", py_decode, METH_VARARGS,
     "decode(buffer, positions, sizes, layout, drop, cls, setters) -> (requests, extras)"},
    {"fill", (PyCFunction)(void (*)(void))py_fill, METH_FASTCALL, "fill(slots, obj, *values) -> None"},
    {"message_init", py_message_init, METH_VARARGS,
     "message_init(cls, slots, known_topics, known_tags, empty_props, checked) -> Message.__init__"},
    {"put_batch", py_put_batch, METH_VARARGS,
     "put_batch(messages, queue_id, born_ms, extras, max_size, born_host, uniq_prefix, uniq_next, context, direct, "
     "append_columns, admit, columns) -> (results, unique_ids, total) | None"},
    {"append_direct", (PyCFunction)(void (*)(void))py_append_direct, METH_FASTCALL,
     "append_direct(capsule, fields) -> (queue_offset, commit_log_offset, size, store_ts, msg_id) | None"},
    {"put_one", (PyCFunction)(void (*)(void))py_put_one, METH_FASTCALL,
     "put_one(message, queue_id, born_ms, extra, plan) -> SendResult | None"},
    {"encode", py_encode, METH_VARARGS,
     "encode(messages, queue_id, born_ms, extras, max_size, born_host, reconsume_times, uniq_prefix, uniq_next, "
     "context) -> (requests, total) | None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_requestcodec",
                                        "bulk codec of AppendRequests: the delay plugins' stored ones, the put path's", -1, methods};

PyMODINIT_FUNC PyInit__requestcodec(void) {
    PyObject *m = PyModule_Create(&module_def);
    if (m != NULL && PyModule_AddIntConstant(m, "LAYOUT_VERSION", LAYOUT_VERSION) < 0) Py_CLEAR(m);
    return m;
}
