/* Compiled bulk decoder of the delay plugins' stored requests (see plugmq/kit/requestcodec.py).
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
#include <string.h>
#include <zlib.h>

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

static PyMethodDef methods[] = {
    {"decode", py_decode, METH_VARARGS,
     "decode(buffer, positions, sizes, layout, drop, cls, setters) -> (requests, extras)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_requestcodec",
                                        "bulk decoder of the delay plugins' stored requests", -1, methods};

PyMODINIT_FUNC PyInit__requestcodec(void) {
    PyObject *m = PyModule_Create(&module_def);
    if (m != NULL && PyModule_AddIntConstant(m, "LAYOUT_VERSION", LAYOUT_VERSION) < 0) Py_CLEAR(m);
    return m;
}
