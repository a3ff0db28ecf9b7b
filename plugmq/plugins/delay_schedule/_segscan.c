/* delay_schedule's compiled segment scan (see schedule_log.py, ScheduleLog._scan_rows).
 *
 * Why C: loading a segment into the hashed wheel walks every schedule record (magic, size,
 * trailer, CRC-32 of header and payload). In Python that cost ~6 us a record, so a segment of a
 * 500k burst took seconds to load - longer than the load-ahead the bench gives it. The Python
 * loop in schedule_log.py is the reference and the fallback when this module was not built.
 *
 *   scan(buffer, pos, number, base) -> (end, rows)
 *     Walks the records from byte `pos` of `buffer` (whose first byte is at `base` in the segment) while each is whole and sound (magic, size
 *     between the header + trailer and 64 MiB, trailer (size, magic), CRC-32 of [12, size - 8))
 *     and its index equals `number`, `number` + 1, ... `end` is where the walk stopped; `rows`
 *     holds 8 integers per record: position (base + its place in buffer), size, seq, schedule time, source,
 *     index, delay level, store timestamp.
 *
 *   encode_dispatch(kind, seqs) -> bytes
 *     dispatch_log.encode_dispatch: one 16-byte record per sequence (kind, 3 pad, CRC-32 of kind
 *     and the big-endian sequence, the sequence); a burst writes two per message (I, then D).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>

#include "_segscan_layout.h" /* offsets, magics and sizes: generated from layout.py */

#define ROW 8

static inline uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}
static inline int64_t be64(const unsigned char *p) { return (int64_t)(((uint64_t)be32(p) << 32) | be32(p + 4)); }

static PyObject *py_scan(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t pos, number, segment_base;
    if (!PyArg_ParseTuple(args, "y*nnn", &buf, &pos, &number, &segment_base)) return NULL;
    PyObject *rows = PyList_New(0);
    if (rows == NULL) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    const unsigned char *base = (const unsigned char *)buf.buf;
    Py_ssize_t len = buf.len;
    while (pos >= 0 && len - pos >= SCH_HEAD_SIZE) {
        const unsigned char *p = base + pos;
        uint32_t size = be32(p + SCH_OFF_SIZE);
        if (be32(p + SCH_OFF_MAGIC) != SCH_MAGIC || size < SCH_HEAD_SIZE + SCH_TAIL_SIZE || size > SCH_MAX_RECORD ||
            (Py_ssize_t)size > len - pos)
            break;
        const unsigned char *tail = p + size - SCH_TAIL_SIZE;
        if (be32(tail + SCH_TAIL_OFF_SIZE) != size || be32(tail + SCH_TAIL_OFF_MAGIC) != SCH_MAGIC) break;
        if ((uint32_t)crc32(0L, p + SCH_CRC_FROM, (uInt)(size - SCH_CRC_FROM - SCH_TAIL_SIZE)) != be32(p + SCH_OFF_CRC))
            break;
        if ((Py_ssize_t)be32(p + SCH_OFF_INDEX) != number) break;
        int64_t row[ROW] = {segment_base + pos,           size,
                            be64(p + SCH_OFF_SEQ),        be64(p + SCH_OFF_SCHEDULE_TIME),
                            be64(p + SCH_OFF_SOURCE),     be32(p + SCH_OFF_INDEX),
                            (int32_t)be32(p + SCH_OFF_DELAY_LEVEL), be64(p + SCH_OFF_STORE_TS)};
        for (int i = 0; i < ROW; i++) {
            PyObject *v = PyLong_FromLongLong(row[i]);
            if (v == NULL || PyList_Append(rows, v) < 0) {
                Py_XDECREF(v);
                Py_DECREF(rows);
                PyBuffer_Release(&buf);
                return NULL;
            }
            Py_DECREF(v);
        }
        pos += size;
        number++;
    }
    PyBuffer_Release(&buf);
    PyObject *result = Py_BuildValue("(nN)", pos, rows);
    return result;
}

static void put_be64(unsigned char *p, uint64_t v) {
    for (int i = 7; i >= 0; i--) {
        p[i] = (unsigned char)(v & 0xFF);
        v >>= 8;
    }
}

static PyObject *py_encode_dispatch(PyObject *self, PyObject *args) {
    int kind;
    PyObject *seqs;
    if (!PyArg_ParseTuple(args, "iO", &kind, &seqs)) return NULL;
    if (kind < 0 || kind > 255) {
        PyErr_SetString(PyExc_ValueError, "kind must be a byte");
        return NULL;
    }
    PyObject *fast = PySequence_Fast(seqs, "seqs must be a sequence of int");
    if (fast == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * DISPATCH_SIZE);
    if (out == NULL) {
        Py_DECREF(fast);
        return NULL;
    }
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    memset(p, 0, (size_t)(n * DISPATCH_SIZE));
    for (Py_ssize_t i = 0; i < n; i++, p += DISPATCH_SIZE) {
        long long seq = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
        if (seq == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            Py_DECREF(out);
            return NULL;
        }
        unsigned char part[DISPATCH_CRC_PART_SIZE]; /* kind, then the big-endian sequence */
        part[0] = (unsigned char)kind;
        put_be64(part + 1, (uint64_t)seq);
        uint32_t crc = (uint32_t)crc32(0L, part, DISPATCH_CRC_PART_SIZE);
        p[DISPATCH_OFF_KIND] = (unsigned char)kind;
        p[DISPATCH_OFF_CRC] = (unsigned char)(crc >> 24);
        p[DISPATCH_OFF_CRC + 1] = (unsigned char)(crc >> 16);
        p[DISPATCH_OFF_CRC + 2] = (unsigned char)(crc >> 8);
        p[DISPATCH_OFF_CRC + 3] = (unsigned char)crc;
        put_be64(p + DISPATCH_OFF_SEQ, (uint64_t)seq);
    }
    Py_DECREF(fast);
    return out;
}

static PyMethodDef methods[] = {
    {"scan", py_scan, METH_VARARGS, "scan(buffer, pos, number, base) -> (end, rows)"},
    {"encode_dispatch", py_encode_dispatch, METH_VARARGS, "encode_dispatch(kind, seqs) -> bytes"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_segscan", "delay_schedule's compiled segment scan",
                                        -1, methods};

PyMODINIT_FUNC PyInit__segscan(void) {
    PyObject *m = PyModule_Create(&module_def);
    if (m != NULL && PyModule_AddIntConstant(m, "LAYOUT_VERSION", LAYOUT_VERSION) < 0) Py_CLEAR(m);
    return m;
}
