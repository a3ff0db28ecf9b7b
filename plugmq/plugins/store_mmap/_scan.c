/* The compiled recovery scan of store_mmap: check commit-log records and consume-queue entries.
 *
 * Why C: opening a store after a crash checks every record written since the last checkpoint
 * (magic, sizes, offset, both CRCs) and hands each one to the consume queues and the key index;
 * after a clean stop it checks the newest segment. In Python that costs ~10 us per record
 * (decoding, two zlib calls, a Decoded object, the properties dict), about what a whole record
 * costs to write with the compiled append kernel, so recovery time grew with the send rate.
 * This walks the same bytes with the same rules without creating an object per record.
 * scan.py holds the same algorithm in Python: the reference, and the fallback when this module
 * was not built.
 *
 *   scan(buffer, pos, readable, seg_size, seg_start, limit, rows, keys, keys_name, uniq_name,
 *        topic_ids, topic_names) -> (stop, kind, count, last_ts, rows_bytes | None, keys_bytes | None)
 *     Checks the records of one segment from byte `pos` (a record boundary): it stops at the
 *     first record that is not sound (kind STOP_BAD), at the end-of-segment blank marker
 *     (STOP_BLANK) or at the first record starting at or past `limit` (STOP_LIMIT).
 *     `readable` bounds what is read (records end before it). With `rows` each sound record
 *     adds 7 native int64 (phys, total, queue id, queue offset, tags code, store timestamp,
 *     topic number; the topic's name is topic_names[number], topic_ids maps its bytes to the
 *     number and both grow when a new topic is met). `keys` 1 notes index entries for each
 *     white-space separated key of the KEYS property, 2 also for the unique id: native int64
 *     triples (RocketMQ index hash of "topic#key", phys, store timestamp), as the append kernel
 *     notes them.
 *   check_entries(entries, first_qoff, queue_id, log_end, segments) -> bytes
 *     One byte per 20-byte consume-queue entry of `entries`: 1 when the record it points at (in
 *     `segments`, (start, size, buffer) tuples sorted by start) has the record magic, the
 *     entry's size, this queue's id, the entry's queue offset, its own position and the entry's
 *     tag code, and ends before `log_end`; 0 otherwise.
 *   read_records(offsets, segments, stored_type, setters, born_host_name) -> list
 *     The StoredMessage of the record at each commit-log offset of `offsets`, in order, or None
 *     where store.read answers None: no segment of `segments` ((start, end, limit, buffer) tuples
 *     sorted by start; `limit` is the segment-relative end of what may be read) holds it, or the
 *     record there is not sound (the checks above: magic, sizes, offset, both CRCs, ASCII topic).
 *     The message is built as StoredMessage.trusted builds it: `stored_type` allocated and its
 *     slots set through `setters` (the 16 slot descriptors in STORED_FIELDS order of scan.py),
 *     the properties parsed into a dict wrapped read-only; a born host that is not IPv4 is
 *     popped from the property `born_host_name`.
 *   read_run(entries, first_qoff, queue_id, topic, segments, stored_type, setters, born_host_name)
 *       -> list | None
 *     The messages of a run of one queue's 20-byte consume-queue entries `entries` (queue offsets
 *     from `first_qoff`), built as read_records builds them, when each entry's record is sound and
 *     exactly what the entry says: the entry's size and tags code, queue `queue_id` at the
 *     entry's queue offset, topic `topic` (bytes). None as soon as one is not: the caller reads
 *     that stretch entry by entry (and repairs). A plain pull reads its run in this one call, no
 *     ConsumeQueueEntry built.
 *   queue_entries(entries, first_qoff, entry_type, setters) -> list
 *     A ConsumeQueueEntry per 20-byte consume-queue entry of `entries` (queue offsets from
 *     `first_qoff`), built through `setters` (the 4 slot descriptors in field order).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <structmember.h>
#include <string.h>

#include "../../kit/_hwcrc32.h" /* zlib's CRC-32, by ISA-L where it is installed */
#include "_layout.h"            /* offsets, magics and sizes: generated from layout.py */

#define ROW_FIELDS 7
#define TAIL_HEAD (TOPIC_LEN_SIZE + PROPS_LEN_SIZE) /* the tail's fixed part: topic and properties lengths */

/* zlib's CRC-32: the one zlib.crc32 computes, as the append kernel and the Python twin write it. */
static inline uint32_t crc32_update(uint32_t crc, const unsigned char *p, size_t n) { return hwcrc32(crc, p, n); }

enum { STOP_BAD = 0, STOP_BLANK = 1, STOP_LIMIT = 2 };

static inline uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}
static inline uint64_t be64(const unsigned char *p) { return ((uint64_t)be32(p) << 32) | be32(p + 4); }
static inline uint16_t be16(const unsigned char *p) { return (uint16_t)(((unsigned)p[0] << 8) | p[1]); }

/* A growing array of int64, released with PyMem_Free. */
typedef struct {
    int64_t *items;
    Py_ssize_t len, cap;
} Int64s;

static int push(Int64s *a, int64_t v) {
    if (a->len == a->cap) {
        Py_ssize_t cap = a->cap ? a->cap * 2 : 4096;
        int64_t *p = PyMem_Realloc(a->items, (size_t)cap * sizeof(int64_t));
        if (p == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        a->items = p;
        a->cap = cap;
    }
    a->items[a->len++] = v;
    return 0;
}

static PyObject *to_bytes(const Int64s *a) {
    return PyBytes_FromStringAndSize((const char *)a->items, a->len * (Py_ssize_t)sizeof(int64_t));
}

/* -- one record -------------------------------------------------------------------------------- */

/* record.decode's checks for the record at p (avail readable bytes) that must sit at `phys`.
 * Returns its total size, or 0 when it is not sound. */
static int64_t sound_record(const unsigned char *p, int64_t avail, int64_t phys) {
    if (avail < MIN_RECORD) return 0;
    int64_t total = (int32_t)be32(p + OFF_TOTAL);
    if (be32(p + OFF_MAGIC) != MESSAGE_MAGIC || total < MIN_RECORD || total > avail || (int64_t)be64(p + OFF_PHYS) != phys)
        return 0;
    int64_t body_len = (int32_t)be32(p + OFF_BODY_LEN);
    int64_t tail_at = HEADER_SIZE + body_len;
    if (body_len < 0 || tail_at + TAIL_HEAD > total || (int32_t)be32(p + OFF_QUEUE_ID) < 0 ||
        (int64_t)be64(p + OFF_QUEUE_OFFSET) < 0)
        return 0;
    const unsigned char *tail = p + tail_at;
    int64_t tail_len = total - tail_at;
    unsigned topic_len = tail[0];
    if (TAIL_HEAD + (int64_t)topic_len > tail_len) return 0;
    if (TAIL_HEAD + (int64_t)topic_len + be16(tail + TOPIC_LEN_SIZE + topic_len) != tail_len) return 0;
    uint32_t crc = crc32_update(crc32_update(0, tail, (size_t)tail_len), p + RECORD_CRC_FROM, HEADER_SIZE - RECORD_CRC_FROM);
    if (crc != be32(p + OFF_RECORD_CRC)) return 0;
    if (crc32_update(0, p + HEADER_SIZE, (size_t)body_len) != be32(p + OFF_BODY_CRC)) return 0;
    for (unsigned i = 0; i < topic_len; i++)
        if (tail[TOPIC_LEN_SIZE + i] & 0x80) return 0; /* topics are ASCII */
    return total;
}

/* -- index keys -------------------------------------------------------------------------------- */

/* The next code point of UTF-8 text (lone surrogates pass, as Python's "surrogatepass");
 * -1 for bytes that are not UTF-8. */
static int32_t next_code_point(const unsigned char **pp, const unsigned char *end) {
    const unsigned char *p = *pp;
    unsigned b = p[0];
    int32_t c;
    int n;
    unsigned lo = 0x80, hi = 0xBF;
    if (b < 0x80) {
        *pp = p + 1;
        return (int32_t)b;
    } else if (b >= 0xC2 && b <= 0xDF) {
        n = 1;
        c = b & 0x1F;
    } else if (b >= 0xE0 && b <= 0xEF) {
        n = 2;
        c = b & 0x0F;
        if (b == 0xE0) lo = 0xA0;
    } else if (b >= 0xF0 && b <= 0xF4) {
        n = 3;
        c = b & 0x07;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
    } else {
        return -1;
    }
    if (end - p <= n) return -1;
    for (int i = 1; i <= n; i++) {
        unsigned x = p[i];
        if (x < (i == 1 ? lo : 0x80) || x > (i == 1 ? hi : 0xBF)) return -1;
        c = (c << 6) | (int32_t)(x & 0x3F);
    }
    *pp = p + n + 1;
    return c;
}

static inline uint32_t java_step(uint32_t h, int32_t c) {
    if (c > 0xFFFF) {
        c -= 0x10000;
        h = 31u * h + (0xD800u + ((uint32_t)c >> 10));
        return 31u * h + (0xDC00u + ((uint32_t)c & 0x3FF));
    }
    return 31u * h + (uint32_t)c;
}

static int64_t index_hash(uint32_t h) {
    /* RocketMQ: abs(key.hashCode()), with Integer.MIN_VALUE (whose abs stays negative) as 0 */
    int32_t s = (int32_t)h;
    if (s == INT32_MIN) return 0;
    return s < 0 ? -(int64_t)s : (int64_t)s;
}

/* The code points of a property value; 0 on success, -1 when it is not UTF-8. */
static int decode_value(const unsigned char *p, const unsigned char *end, int32_t *out, Py_ssize_t *count) {
    Py_ssize_t n = 0;
    while (p < end) {
        int32_t c = next_code_point(&p, end);
        if (c < 0) return -1;
        out[n++] = c;
    }
    *count = n;
    return 0;
}

/* One property item "name\x01value\x02" (the value is empty without \x01). */
typedef struct {
    const unsigned char *name, *name_end, *value, *value_end;
} PropItem;

/* The next non-empty item of the properties at *pp (up to end): 1 and the item, 0 at the end. */
static int next_property(const unsigned char **pp, const unsigned char *end, PropItem *item) {
    while (*pp < end) {
        const unsigned char *start = *pp, *item_end = memchr(start, 0x02, (size_t)(end - start));
        if (item_end == NULL) item_end = end;
        *pp = item_end + 1;
        if (item_end > start) {
            const unsigned char *sep = memchr(start, 0x01, (size_t)(item_end - start));
            item->name = start;
            item->name_end = sep ? sep : item_end;
            item->value = sep ? sep + 1 : item_end;
            item->value_end = item_end;
            return 1;
        }
    }
    return 0;
}

/* Index entries of one record: the keys of KEYS (split on white space, as str.split()), then
 * the unique id. A value that is not UTF-8 adds nothing (the Python twin skips it alike). */
static int note_keys(Int64s *keys, int mode, const unsigned char *topic, unsigned topic_len,
                     const unsigned char *props, int64_t props_len, const char *keys_name, Py_ssize_t keys_len,
                     const char *uniq_name, Py_ssize_t uniq_len, int64_t phys, int64_t ts, int32_t **scratch,
                     Py_ssize_t *scratch_cap) {
    const unsigned char *keys_v = NULL, *keys_e = NULL, *uniq_v = NULL, *uniq_e = NULL;
    const unsigned char *p = props, *end = props + props_len;
    PropItem item;
    while (next_property(&p, end, &item)) { /* the last of a name wins, as in a dict */
        Py_ssize_t name_len = item.name_end - item.name;
        if (name_len == keys_len && memcmp(item.name, keys_name, (size_t)keys_len) == 0) {
            keys_v = item.value;
            keys_e = item.value_end;
        } else if (mode >= 2 && name_len == uniq_len && memcmp(item.name, uniq_name, (size_t)uniq_len) == 0) {
            uniq_v = item.value;
            uniq_e = item.value_end;
        }
    }
    if (keys_v == NULL && uniq_v == NULL) return 0;
    uint32_t th = 0;
    for (unsigned i = 0; i < topic_len; i++) th = 31u * th + topic[i];
    th = 31u * th + '#';
    Py_ssize_t need = (keys_e ? keys_e - keys_v : 0) + (uniq_e ? uniq_e - uniq_v : 0) + 1;
    if (need > *scratch_cap) {
        int32_t *s = PyMem_Realloc(*scratch, (size_t)need * sizeof(int32_t));
        if (s == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        *scratch = s;
        *scratch_cap = need;
    }
    int32_t *cps = *scratch;
    Py_ssize_t n;
    if (keys_v != NULL && decode_value(keys_v, keys_e, cps, &n) == 0) {
        Py_ssize_t i = 0;
        while (i < n) {
            while (i < n && Py_UNICODE_ISSPACE((Py_UCS4)cps[i])) i++;
            if (i >= n) break;
            uint32_t h = th;
            while (i < n && !Py_UNICODE_ISSPACE((Py_UCS4)cps[i])) h = java_step(h, cps[i++]);
            if (push(keys, index_hash(h)) < 0 || push(keys, phys) < 0 || push(keys, ts) < 0) return -1;
        }
    }
    if (uniq_v != NULL && uniq_e > uniq_v && decode_value(uniq_v, uniq_e, cps, &n) == 0) {
        uint32_t h = th;
        for (Py_ssize_t i = 0; i < n; i++) h = java_step(h, cps[i]);
        if (push(keys, index_hash(h)) < 0 || push(keys, phys) < 0 || push(keys, ts) < 0) return -1;
    }
    return 0;
}

/* -- scan ----------------------------------------------------------------------------------------- */

/* The number of a topic (its bytes at p), adding it to topic_ids / topic_names when new. */
static int64_t topic_number(PyObject *ids, PyObject *names, const unsigned char *p, unsigned len) {
    PyObject *key = PyBytes_FromStringAndSize((const char *)p, len);
    if (key == NULL) return -1;
    PyObject *found = PyDict_GetItemWithError(ids, key);
    int64_t number;
    if (found != NULL) {
        number = PyLong_AsLongLong(found);
    } else if (PyErr_Occurred()) {
        number = -1;
    } else {
        number = PyList_GET_SIZE(names);
        PyObject *name = PyUnicode_DecodeASCII((const char *)p, len, "strict");
        PyObject *value = name ? PyLong_FromLongLong(number) : NULL;
        if (value == NULL || PyDict_SetItem(ids, key, value) < 0 || PyList_Append(names, name) < 0) number = -1;
        Py_XDECREF(value);
        Py_XDECREF(name);
    }
    Py_DECREF(key);
    return number;
}

static PyObject *py_scan(PyObject *module, PyObject *args) {
    Py_buffer view;
    long long pos, readable, seg_size, seg_start, limit;
    int want_rows, keys_mode;
    const char *keys_name, *uniq_name;
    Py_ssize_t keys_len, uniq_len;
    PyObject *topic_ids, *topic_names;
    if (!PyArg_ParseTuple(args, "y*LLLLLpiy#y#O!O!", &view, &pos, &readable, &seg_size, &seg_start, &limit,
                          &want_rows, &keys_mode, &keys_name, &keys_len, &uniq_name, &uniq_len, &PyDict_Type,
                          &topic_ids, &PyList_Type, &topic_names))
        return NULL;
    const unsigned char *buf = view.buf;
    int64_t len = view.len;
    if (readable > len) readable = len;
    Int64s rows = {0}, keys = {0};
    int32_t *scratch = NULL;
    Py_ssize_t scratch_cap = 0;
    int64_t count = 0, last_ts = -1;
    int kind = STOP_BAD;
    /* the last topic met, to skip the dictionary while records keep to one topic */
    const unsigned char *last_topic = NULL;
    unsigned last_topic_len = 0;
    int64_t last_topic_number = -1;
    int failed = 0;
    while (1) {
        if (pos >= limit) {
            kind = STOP_LIMIT;
            break;
        }
        if (pos >= 0 && pos + BLANK_SIZE <= seg_size && pos + BLANK_SIZE <= readable + END_FILE_MIN_BLANK &&
            pos + BLANK_SIZE <= len) {
            if (be32(buf + pos + OFF_MAGIC) == BLANK_MAGIC && (int64_t)(int32_t)be32(buf + pos + OFF_TOTAL) == seg_size - pos) {
                kind = STOP_BLANK;
                break;
            }
        }
        if (pos < 0) break;
        const unsigned char *p = buf + pos;
        int64_t total = sound_record(p, readable - pos, seg_start + pos);
        if (total == 0) break;
        int64_t phys = seg_start + pos;
        int64_t ts = (int64_t)be64(p + OFF_STORE_TS);
        const unsigned char *tail = p + HEADER_SIZE + (int32_t)be32(p + OFF_BODY_LEN);
        unsigned topic_len = tail[0];
        if (want_rows) {
            if (last_topic == NULL || topic_len != last_topic_len ||
                memcmp(tail + TOPIC_LEN_SIZE, last_topic, topic_len) != 0) {
                last_topic_number = topic_number(topic_ids, topic_names, tail + TOPIC_LEN_SIZE, topic_len);
                if (last_topic_number < 0) {
                    failed = 1;
                    break;
                }
                last_topic = tail + TOPIC_LEN_SIZE;
                last_topic_len = topic_len;
            }
            if (push(&rows, phys) < 0 || push(&rows, total) < 0 || push(&rows, (int32_t)be32(p + OFF_QUEUE_ID)) < 0 ||
                push(&rows, (int64_t)be64(p + OFF_QUEUE_OFFSET)) < 0 || push(&rows, (int64_t)be64(p + OFF_TAGS_CODE)) < 0 ||
                push(&rows, ts) < 0 || push(&rows, last_topic_number) < 0) {
                failed = 1;
                break;
            }
        }
        if (keys_mode > 0) {
            const unsigned char *props = tail + TAIL_HEAD + topic_len;
            if (note_keys(&keys, keys_mode, tail + TOPIC_LEN_SIZE, topic_len, props, be16(tail + TOPIC_LEN_SIZE + topic_len), keys_name,
                          keys_len, uniq_name, uniq_len, phys, ts, &scratch, &scratch_cap) < 0) {
                failed = 1;
                break;
            }
        }
        count++;
        last_ts = ts;
        pos += total;
    }
    PyBuffer_Release(&view);
    PyMem_Free(scratch);
    PyObject *result = NULL;
    if (!failed) {
        PyObject *rows_b = want_rows ? to_bytes(&rows) : Py_NewRef(Py_None);
        PyObject *keys_b = rows_b && keys_mode > 0 ? to_bytes(&keys) : (rows_b ? Py_NewRef(Py_None) : NULL);
        if (rows_b && keys_b) result = Py_BuildValue("(LiLLOO)", pos, kind, count, last_ts, rows_b, keys_b);
        Py_XDECREF(rows_b);
        Py_XDECREF(keys_b);
    }
    PyMem_Free(rows.items);
    PyMem_Free(keys.items);
    return result;
}

/* -- consume-queue entries ------------------------------------------------------------------------ */

/* A mapped segment handed in by Python: its log offsets [start, end) and the segment-relative
 * `limit` of what may be read (clipped to the buffer). */
typedef struct {
    int64_t start, end, limit;
    Py_buffer view;
} Segment;

/* The segments of `seq` (sorted by start): (start, limit, buffer) items, or (start, end, limit,
 * buffer) ones `with_end`. Returns the array (PyMem_Free it after release_segments) and the
 * number of buffers taken in *got, or NULL with an error set (*got still says what to release). */
static Segment *take_segments(PyObject *seq, int with_end, Py_ssize_t *got) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Segment *segs = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Segment));
    *got = 0;
    if (segs == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (; *got < n; (*got)++) {
        Segment *g = &segs[*got];
        PyObject *item = PySequence_Fast_GET_ITEM(seq, *got);
        long long start, end = 0, limit;
        PyObject *buffer;
        int parsed = with_end ? PyArg_ParseTuple(item, "LLLO", &start, &end, &limit, &buffer)
                              : PyArg_ParseTuple(item, "LLO", &start, &limit, &buffer);
        if (!parsed || PyObject_GetBuffer(buffer, &g->view, PyBUF_SIMPLE) < 0) return segs;
        g->start = start;
        g->end = with_end ? end : start + limit;
        g->limit = limit < g->view.len ? limit : g->view.len;
        if (*got > 0 && start < segs[*got - 1].start) {
            (*got)++;
            PyErr_SetString(PyExc_ValueError, "segments must be sorted by start");
            return segs;
        }
    }
    return segs;
}

static void release_segments(Segment *segs, Py_ssize_t got) {
    for (Py_ssize_t i = 0; i < got && segs != NULL; i++)
        if (segs[i].view.obj != NULL) PyBuffer_Release(&segs[i].view);
    PyMem_Free(segs);
}

/* The index of the last segment starting at or before phys; -1 when none does. */
static Py_ssize_t segment_at(const Segment *segs, Py_ssize_t n, int64_t phys) {
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (segs[mid].start <= phys) lo = mid + 1;
        else hi = mid;
    }
    return lo - 1;
}

static PyObject *py_check_entries(PyObject *module, PyObject *args) {
    Py_buffer entries;
    long long first_qoff, log_end;
    int queue_id;
    PyObject *segments_arg;
    if (!PyArg_ParseTuple(args, "y*LiLO", &entries, &first_qoff, &queue_id, &log_end, &segments_arg)) return NULL;
    PyObject *seq = PySequence_Fast(segments_arg, "segments must be a sequence of (start, size, buffer)");
    if (seq == NULL) {
        PyBuffer_Release(&entries);
        return NULL;
    }
    Py_ssize_t nseg = PySequence_Fast_GET_SIZE(seq), got = 0;
    Segment *segs = take_segments(seq, 0, &got);
    PyObject *result = NULL;
    if (segs == NULL || PyErr_Occurred()) goto done;
    Py_ssize_t count = entries.len / CQ_ENTRY_SIZE;
    result = PyBytes_FromStringAndSize(NULL, count);
    if (result == NULL) goto done;
    unsigned char *ok = (unsigned char *)PyBytes_AS_STRING(result);
    const unsigned char *e = entries.buf;
    for (Py_ssize_t i = 0; i < count; i++, e += CQ_ENTRY_SIZE) {
        int64_t phys = (int64_t)be64(e + CQ_OFF_PHYS), tags = (int64_t)be64(e + CQ_OFF_TAGS);
        int64_t size = (int32_t)be32(e + CQ_OFF_SIZE);
        ok[i] = 0;
        if (size < HEADER_SIZE || phys < 0 || phys + size > log_end) continue;
        Py_ssize_t at = segment_at(segs, nseg, phys);
        if (at < 0) continue;
        const Segment *s = &segs[at];
        int64_t rel = phys - s->start;
        if (rel + size > s->limit) continue;
        const unsigned char *r = (const unsigned char *)s->view.buf + rel;
        ok[i] = be32(r + OFF_MAGIC) == MESSAGE_MAGIC && (int64_t)(int32_t)be32(r + OFF_TOTAL) == size &&
                (int32_t)be32(r + OFF_QUEUE_ID) == queue_id && (int64_t)be64(r + OFF_QUEUE_OFFSET) == first_qoff + i &&
                (int64_t)be64(r + OFF_PHYS) == phys && (int64_t)be64(r + OFF_TAGS_CODE) == tags;
    }
done:
    release_segments(segs, got);
    Py_DECREF(seq);
    PyBuffer_Release(&entries);
    if (PyErr_Occurred()) Py_CLEAR(result);
    return result;
}

/* -- bulk reads ------------------------------------------------------------------------------------ */

#define STORED_FIELDS 16

/* "a.b.c.d:port" of 8 stored bytes (IPv4 address, int32 port), as record.host_text writes it. */
static PyObject *host_text(const unsigned char *raw) {
    return PyUnicode_FromFormat("%u.%u.%u.%u:%d", raw[0], raw[1], raw[2], raw[3], (int)(int32_t)be32(raw + 4));
}

/* Property names met lately, their strings reused (hash computed once): records repeat a few
 * names. Module-wide, under the GIL; nothing in here runs Python code between a lookup and its use. */
#define NAME_CACHE 8
#define NAME_CACHE_BYTES 64
static struct {
    unsigned char raw[NAME_CACHE_BYTES];
    Py_ssize_t len;
    PyObject *text;
} name_cache[NAME_CACHE];
static unsigned name_cache_next;

/* The str of the property name at p (len bytes, UTF-8 "surrogatepass"), a new reference. */
static PyObject *property_name(const unsigned char *p, Py_ssize_t len) {
    if (len > NAME_CACHE_BYTES) return PyUnicode_DecodeUTF8((const char *)p, len, "surrogatepass");
    for (unsigned i = 0; i < NAME_CACHE; i++)
        if (name_cache[i].text != NULL && name_cache[i].len == len && memcmp(name_cache[i].raw, p, (size_t)len) == 0)
            return Py_NewRef(name_cache[i].text);
    PyObject *text = PyUnicode_DecodeUTF8((const char *)p, len, "surrogatepass");
    if (text == NULL) return NULL;
    unsigned slot = name_cache_next++ % NAME_CACHE;
    memcpy(name_cache[slot].raw, p, (size_t)len);
    name_cache[slot].len = len;
    Py_XSETREF(name_cache[slot].text, Py_NewRef(text));
    return text;
}

/* record.parse_properties: items "key\x01value\x02", the last of a name wins. The separators are
 * ASCII, so splitting the bytes before decoding each part equals decoding first, errors included. */
static PyObject *parse_properties(const unsigned char *p, int64_t len) {
    PyObject *props = PyDict_New();
    if (props == NULL) return NULL;
    const unsigned char *end = p + len;
    PropItem item;
    while (next_property(&p, end, &item)) {
        PyObject *k = property_name(item.name, item.name_end - item.name);
        PyObject *v = k ? PyUnicode_DecodeUTF8((const char *)item.value, item.value_end - item.value, "surrogatepass")
                        : NULL;
        int failed = v == NULL || PyDict_SetItem(props, k, v) < 0;
        Py_XDECREF(k);
        Py_XDECREF(v);
        if (failed) {
            Py_DECREF(props);
            return NULL;
        }
    }
    return props;
}

/* Strings met in the previous record, reused while records keep to them (from call to call:
 * module-wide, under the GIL). */
typedef struct {
    unsigned char topic[MAX_TOPIC_BYTES], born[8], store[8];
    unsigned topic_len;
    PyObject *topic_s, *born_s, *store_s;
} Recent;
static Recent recent_strings;

static PyObject *recent_str(PyObject **slot, unsigned char *key, unsigned *key_len, const unsigned char *raw,
                            unsigned len, int is_host) {
    if (*slot == NULL || (key_len && *key_len != len) || memcmp(key, raw, len) != 0) {
        PyObject *s = is_host ? host_text(raw) : PyUnicode_DecodeASCII((const char *)raw, len, "strict");
        if (s == NULL) return NULL;
        Py_XSETREF(*slot, s);
        memcpy(key, raw, len);
        if (key_len) *key_len = len;
    }
    return Py_NewRef(*slot);
}

#define MAX_SLOTS 16

/* How to set the slots of a type's fresh instances: through the descriptors handed in, or, when
 * each is a writable object slot (T_OBJECT_EX member) of that type, straight at its offset: what
 * the descriptor's setter does on a fresh instance, without a call per slot. */
typedef struct {
    PyTypeObject *type;
    PyObject *const *setters;
    Py_ssize_t offsets[MAX_SLOTS];
    int n, direct;
} SlotPlan;

/* The plan for `type` with the slot descriptors of `setters_arg` (a tuple of n data
 * descriptors); 0, or -1 with an error set. */
static int slot_plan(SlotPlan *plan, PyTypeObject *type, PyObject *setters_arg, int n) {
    if (PyTuple_GET_SIZE(setters_arg) != n || n > MAX_SLOTS) {
        PyErr_Format(PyExc_ValueError, "setters must hold %d slot descriptors", n);
        return -1;
    }
    plan->type = type;
    plan->setters = &PyTuple_GET_ITEM(setters_arg, 0);
    plan->n = n;
    plan->direct = 1;
    for (int i = 0; i < n; i++) {
        PyObject *setter = plan->setters[i];
        if (Py_TYPE(setter)->tp_descr_set == NULL) {
            PyErr_SetString(PyExc_TypeError, "setters must be data descriptors (the type's slots)");
            return -1;
        }
        if (Py_IS_TYPE(setter, &PyMemberDescr_Type)) {
            PyMemberDef *member = ((PyMemberDescrObject *)setter)->d_member;
            if (member->type == T_OBJECT_EX && !(member->flags & READONLY) &&
                PyType_IsSubtype(type, PyDescr_TYPE(setter))) {
                plan->offsets[i] = member->offset;
                continue;
            }
        }
        plan->direct = 0;
    }
    return 0;
}

/* A fresh instance of the plan's type with its slots set to `values` (new references, all
 * consumed: as the trusted constructors do, no validators), or NULL with an error set; a NULL
 * value (a failed conversion) fails it. */
static PyObject *slotted(const SlotPlan *plan, PyObject **values) {
    PyObject *object = NULL;
    int n = plan->n, i;
    for (i = 0; i < n; i++)
        if (values[i] == NULL) goto done;
    object = plan->type->tp_alloc(plan->type, 0);
    if (object == NULL) goto done;
    if (plan->direct) {
        for (i = 0; i < n; i++) {
            PyObject **slot = (PyObject **)((char *)object + plan->offsets[i]);
            Py_XSETREF(*slot, values[i]);
            values[i] = NULL;
        }
        return object;
    }
    for (i = 0; i < n; i++)
        if (Py_TYPE(plan->setters[i])->tp_descr_set(plan->setters[i], object, values[i]) < 0) {
            Py_CLEAR(object);
            break;
        }
done:
    for (i = 0; i < n; i++) Py_CLEAR(values[i]);
    return object;
}

/* The StoredMessage of the sound record at p (whose total size is `total`), or NULL with an error set. */
static PyObject *stored_message(const unsigned char *p, int64_t total, int64_t phys, const SlotPlan *plan,
                                PyObject *born_name, Recent *recent) {
    int64_t body_len = (int32_t)be32(p + OFF_BODY_LEN);
    const unsigned char *tail = p + HEADER_SIZE + body_len;
    unsigned topic_len = tail[0];
    const unsigned char *props_at = tail + TAIL_HEAD + topic_len;
    PyObject *values[STORED_FIELDS] = {NULL};
    PyObject *message = NULL, *props = parse_properties(props_at, be16(tail + TOPIC_LEN_SIZE + topic_len));
    if (props == NULL) return NULL;
    PyObject *born = NULL;
    if ((int32_t)be32(p + OFF_FLAG) & FLAG_BORN_HOST_IN_PROPS) {
        born = PyDict_GetItemWithError(props, born_name);
        if (born != NULL) {
            Py_INCREF(born);
            if (PyDict_DelItem(props, born_name) < 0) goto done;
        } else if (PyErr_Occurred()) {
            goto done;
        } else {
            born = PyUnicode_FromString("0.0.0.0:0");
        }
    } else {
        born = recent_str(&recent->born_s, recent->born, NULL, p + OFF_BORN_HOST, 8, 1);
    }
    values[0] = recent_str(&recent->topic_s, recent->topic, &recent->topic_len, tail + TOPIC_LEN_SIZE, topic_len, 0);
    values[1] = PyLong_FromLong((int32_t)be32(p + OFF_QUEUE_ID));
    values[2] = PyBytes_FromStringAndSize((const char *)p + HEADER_SIZE, body_len);
    values[3] = PyDictProxy_New(props);
    values[4] = PyLong_FromLongLong((int64_t)be64(p + OFF_QUEUE_OFFSET));
    values[5] = PyLong_FromLongLong(phys);
    values[6] = PyLong_FromLongLong(total);
    values[7] = PyLong_FromLongLong((int64_t)be64(p + OFF_TAGS_CODE));
    values[8] = PyLong_FromLongLong((int64_t)be64(p + OFF_BORN_TS));
    values[9] = PyLong_FromLongLong((int64_t)be64(p + OFF_STORE_TS));
    values[10] = born;
    born = NULL;
    values[11] = recent_str(&recent->store_s, recent->store, NULL, p + OFF_STORE_HOST, 8, 1);
    values[12] = PyLong_FromLong((int32_t)be32(p + OFF_RECONSUME));
    values[13] = PyLong_FromLong((int32_t)be32(p + OFF_SYS_FLAG));
    values[14] = PyLong_FromLongLong((int64_t)be64(p + OFF_PREPARED));
    values[15] = PyLong_FromUnsignedLong(be32(p + OFF_BODY_CRC));
    message = slotted(plan, values);
done:
    for (int i = 0; i < STORED_FIELDS; i++) Py_XDECREF(values[i]);
    Py_XDECREF(born);
    Py_DECREF(props);
    return message;
}

/* The sound record at log offset `phys` of the n segments (as CommitLog.read finds it) and its
 * total size in *total, or NULL. *last is the segment tried first (runs of records mostly sit in
 * one segment), updated. */
static const unsigned char *record_at(const Segment *segs, Py_ssize_t n, Py_ssize_t *last, int64_t phys,
                                      int64_t *total) {
    *total = 0;
    if (n == 0 || phys < 0) return NULL;
    if (!(segs[*last].start <= phys && phys < segs[*last].end)) {
        Py_ssize_t at = segment_at(segs, n, phys);
        *last = at > 0 ? at : 0;
    }
    const Segment *s = &segs[*last];
    int64_t pos = phys - s->start;
    if (pos < 0 || phys >= s->end || pos >= s->limit) return NULL;
    const unsigned char *p = (const unsigned char *)s->view.buf + pos;
    *total = sound_record(p, s->limit - pos, phys);
    return *total > 0 ? p : NULL;
}

static PyObject *py_read_records(PyObject *module, PyObject *args) {
    PyObject *offsets_arg, *segments_arg, *setters_arg, *born_name;
    PyTypeObject *type;
    if (!PyArg_ParseTuple(args, "OOO!O!U", &offsets_arg, &segments_arg, &PyType_Type, &type, &PyTuple_Type,
                          &setters_arg, &born_name))
        return NULL;
    SlotPlan plan;
    if (slot_plan(&plan, type, setters_arg, STORED_FIELDS) < 0) return NULL;
    PyObject *offsets = PySequence_Fast(offsets_arg, "offsets must be a sequence of int");
    if (offsets == NULL) return NULL;
    PyObject *seq = PySequence_Fast(segments_arg, "segments must be a sequence of (start, end, limit, buffer)");
    if (seq == NULL) {
        Py_DECREF(offsets);
        return NULL;
    }
    Py_ssize_t nseg = PySequence_Fast_GET_SIZE(seq), got = 0;
    Segment *segs = take_segments(seq, 1, &got);
    PyObject *result = NULL;
    if (segs == NULL || PyErr_Occurred()) goto done;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(offsets);
    result = PyList_New(count);
    if (result == NULL) goto done;
    Py_ssize_t last = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        long long phys = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(offsets, i));
        if (phys == -1 && PyErr_Occurred()) goto done;
        int64_t total;
        const unsigned char *p = record_at(segs, nseg, &last, phys, &total);
        PyObject *message = p ? stored_message(p, total, phys, &plan, born_name, &recent_strings) : Py_NewRef(Py_None);
        if (message == NULL) goto done;
        PyList_SET_ITEM(result, i, message);
    }
done:
    release_segments(segs, got);
    Py_DECREF(seq);
    Py_DECREF(offsets);
    if (PyErr_Occurred()) Py_CLEAR(result);
    return result;
}

/* read_run: the messages of a run of one queue's consume-queue entries, or None at the first
 * entry whose record is not exactly what the entry says (see the module docstring). */
static PyObject *py_read_run(PyObject *module, PyObject *args) {
    Py_buffer entries;
    long long first_qoff;
    int queue_id;
    const char *topic;
    Py_ssize_t topic_len;
    PyObject *segments_arg, *setters_arg, *born_name;
    PyTypeObject *type;
    if (!PyArg_ParseTuple(args, "y*Liy#OO!O!U", &entries, &first_qoff, &queue_id, &topic, &topic_len, &segments_arg,
                          &PyType_Type, &type, &PyTuple_Type, &setters_arg, &born_name))
        return NULL;
    SlotPlan plan;
    PyObject *seq = NULL, *result = NULL;
    Segment *segs = NULL;
    Py_ssize_t nseg = 0, got = 0;
    if (slot_plan(&plan, type, setters_arg, STORED_FIELDS) < 0) goto done;
    seq = PySequence_Fast(segments_arg, "segments must be a sequence of (start, end, limit, buffer)");
    if (seq == NULL) goto done;
    nseg = PySequence_Fast_GET_SIZE(seq);
    segs = take_segments(seq, 1, &got);
    if (segs == NULL || PyErr_Occurred()) goto done;
    Py_ssize_t count = entries.len / CQ_ENTRY_SIZE;
    result = PyList_New(count);
    if (result == NULL) goto done;
    const unsigned char *e = entries.buf;
    Py_ssize_t last = 0;
    for (Py_ssize_t i = 0; i < count; i++, e += CQ_ENTRY_SIZE) {
        int64_t phys = (int64_t)be64(e + CQ_OFF_PHYS), size = (int32_t)be32(e + CQ_OFF_SIZE), total;
        const unsigned char *p = record_at(segs, nseg, &last, phys, &total);
        /* the entry's record: sound, its size, this queue at this queue offset, the entry's tags
         * code and the queue's topic; anything else is for the caller's entry-by-entry path */
        int exact = p != NULL && total == size && (int32_t)be32(p + OFF_QUEUE_ID) == queue_id &&
                    (int64_t)be64(p + OFF_QUEUE_OFFSET) == first_qoff + i &&
                    (int64_t)be64(p + OFF_TAGS_CODE) == (int64_t)be64(e + CQ_OFF_TAGS);
        if (exact) {
            const unsigned char *tail = p + HEADER_SIZE + (int32_t)be32(p + OFF_BODY_LEN);
            exact = tail[0] == topic_len && memcmp(tail + TOPIC_LEN_SIZE, topic, (size_t)topic_len) == 0;
        }
        if (!exact) {
            Py_SETREF(result, Py_NewRef(Py_None));
            goto done;
        }
        PyObject *message = stored_message(p, total, phys, &plan, born_name, &recent_strings);
        if (message == NULL) goto done;
        PyList_SET_ITEM(result, i, message);
    }
done:
    release_segments(segs, got);
    Py_XDECREF(seq);
    PyBuffer_Release(&entries);
    if (PyErr_Occurred()) Py_CLEAR(result);
    return result;
}

#define ENTRY_FIELDS 4

static PyObject *py_queue_entries(PyObject *module, PyObject *args) {
    Py_buffer entries;
    long long first_qoff;
    PyTypeObject *type;
    PyObject *setters_arg;
    if (!PyArg_ParseTuple(args, "y*LO!O!", &entries, &first_qoff, &PyType_Type, &type, &PyTuple_Type, &setters_arg))
        return NULL;
    PyObject *result = NULL;
    SlotPlan plan;
    if (slot_plan(&plan, type, setters_arg, ENTRY_FIELDS) < 0) goto done;
    Py_ssize_t count = entries.len / CQ_ENTRY_SIZE;
    result = PyList_New(count);
    if (result == NULL) goto done;
    const unsigned char *e = entries.buf;
    for (Py_ssize_t i = 0; i < count; i++, e += CQ_ENTRY_SIZE) {
        PyObject *values[ENTRY_FIELDS] = {
            PyLong_FromLongLong(first_qoff + i), PyLong_FromLongLong((int64_t)be64(e + CQ_OFF_PHYS)),
            PyLong_FromLong((int32_t)be32(e + CQ_OFF_SIZE)), PyLong_FromLongLong((int64_t)be64(e + CQ_OFF_TAGS))};
        PyObject *entry = slotted(&plan, values);
        if (entry == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, i, entry);
    }
done:
    PyBuffer_Release(&entries);
    return result;
}

/* crc32(data, value=0): zlib.crc32's answer, computed as the checks above compute it (tests prove
 * the two equal; CRC32 names the implementation). */
static PyObject *py_crc32(PyObject *module, PyObject *args) {
    Py_buffer data;
    unsigned long value = 0;
    if (!PyArg_ParseTuple(args, "y*|k", &data, &value)) return NULL;
    uint32_t crc = hwcrc32((uint32_t)value, data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(crc);
}

static PyMethodDef module_methods[] = {
    {"scan", py_scan, METH_VARARGS,
     "scan(buffer, pos, readable, seg_size, seg_start, limit, rows, keys, keys_name, uniq_name, topic_ids, "
     "topic_names) -> (stop, kind, count, last_ts, rows | None, keys | None)"},
    {"check_entries", py_check_entries, METH_VARARGS,
     "check_entries(entries, first_qoff, queue_id, log_end, segments) -> bytes (1 = sound entry)"},
    {"read_records", py_read_records, METH_VARARGS,
     "read_records(offsets, segments, stored_type, setters, born_host_name) -> list[StoredMessage | None]"},
    {"queue_entries", py_queue_entries, METH_VARARGS,
     "queue_entries(entries, first_qoff, entry_type, setters) -> list[ConsumeQueueEntry]"},
    {"read_run", py_read_run, METH_VARARGS,
     "read_run(entries, first_qoff, queue_id, topic, segments, stored_type, setters, born_host_name) -> "
     "list[StoredMessage] | None"},
    {"crc32", py_crc32, METH_VARARGS, "crc32(data, value=0) -> int: zlib.crc32's answer (CRC32 names who computes it)"},
    {NULL}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_scan", "store_mmap's compiled recovery scan", -1,
                                        module_methods};

PyMODINIT_FUNC PyInit__scan(void) {
    hwcrc32_select();
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    if (PyModule_AddStringConstant(m, "CRC32", hwcrc32_name()) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "STOP_BAD", STOP_BAD) < 0 || PyModule_AddIntConstant(m, "STOP_BLANK", STOP_BLANK) < 0 ||
        PyModule_AddIntConstant(m, "STOP_LIMIT", STOP_LIMIT) < 0 || PyModule_AddIntConstant(m, "ROW_FIELDS", ROW_FIELDS) < 0 ||
        PyModule_AddIntConstant(m, "LAYOUT_VERSION", LAYOUT_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
