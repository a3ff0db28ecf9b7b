/* Message's compiled __init__ (plugmq.core.message.install_message_init): the common case in C.
 *
 * Why: a Message is built on every send, and on Python 3.11 a Python __init__ alone (its frame,
 * nine parameters) costs ~3x an object allocation: Message("T", body) took ~680 ns of a ~2.8 us
 * Broker.put. This one takes the common case - a topic already validated, a bytes body, at most
 * a known tag, nothing else set - and fills the slots directly. Every other call (another type,
 * a new name, keys, properties, a delay, a group, a priority, a wrong argument) goes to the
 * checked Python __init__ unchanged, which validates, raises and learns new names exactly as
 * before: the two build the same Message from the same arguments.
 *
 *   message_init(cls, slots, known_topics, known_tags, empty_props, checked) -> method descriptor
 *     slots: Message's nine slot descriptors in field order (topic, body, tags, keys, properties,
 *     delay_level, deliver_at_ms, message_group, priority); known_topics / known_tags: the sets
 *     of names the checked __init__ has validated (read, never written here); empty_props: the
 *     shared empty properties; checked: the Python __init__ every other call goes to.
 */
#ifndef PLUGMQ_MESSAGEINIT_H
#define PLUGMQ_MESSAGEINIT_H

#include <Python.h>

enum { MI_TOPIC, MI_BODY, MI_TAGS, MI_KEYS, MI_PROPERTIES, MI_DELAY_LEVEL, MI_DELIVER_AT, MI_GROUP, MI_PRIORITY,
       MI_FIELDS };

static const char *const mi_field_names[MI_FIELDS] = {"topic", "body", "tags", "keys", "properties", "delay_level",
                                                      "deliver_at_ms", "message_group", "priority"};

/* Set once by message_init (a later call replaces them): strong references. */
static PyObject *mi_slots, *mi_known_topics, *mi_known_tags, *mi_empty_props, *mi_checked, *mi_empty_tuple;
static PyObject *mi_names[MI_FIELDS]; /* interned parameter names */

/* A value the checked __init__ turns into "nothing": keys or properties left out. */
static int mi_empty(PyObject *v) {
    return v == Py_None || (PyTuple_CheckExact(v) && PyTuple_GET_SIZE(v) == 0) ||
           (PyList_CheckExact(v) && PyList_GET_SIZE(v) == 0) || (PyDict_CheckExact(v) && PyDict_GET_SIZE(v) == 0) ||
           (PyUnicode_CheckExact(v) && PyUnicode_GET_LENGTH(v) == 0);
}

static int mi_known(PyObject *set, PyObject *name) {
    return PyUnicode_CheckExact(name) && PySet_Contains(set, name) == 1;
}

/* The arguments in field order (NULL: not given); 0 when they do not map one to one. */
static int mi_gather(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **v) {
    if (nargs > MI_FIELDS) return 0;
    for (Py_ssize_t i = 0; i < nargs; i++) v[i] = args[i];
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        int at = -1;
        for (int i = 0; i < MI_FIELDS && at < 0; i++)
            if (name == mi_names[i]) at = i; /* keyword names arrive interned */
        if (at < 0 || v[at] != NULL) return 0;
        v[at] = args[nargs + k];
    }
    return v[MI_TOPIC] != NULL && v[MI_BODY] != NULL;
}

/* 1: filled; 0: not the common case (nothing set); -1: a slot's setter failed. */
static int mi_fill_common(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *v[MI_FIELDS] = {NULL};
    if (mi_slots == NULL || !mi_gather(args, nargs, kwnames, v)) return 0;
    if (!mi_known(mi_known_topics, v[MI_TOPIC]) || !PyBytes_CheckExact(v[MI_BODY])) return 0;
    PyObject *tags = v[MI_TAGS] == NULL ? Py_None : v[MI_TAGS];
    if (tags != Py_None && !mi_known(mi_known_tags, tags)) return 0;
    if ((v[MI_KEYS] != NULL && !mi_empty(v[MI_KEYS])) || (v[MI_PROPERTIES] != NULL && !mi_empty(v[MI_PROPERTIES])))
        return 0;
    for (int i = MI_DELAY_LEVEL; i < MI_FIELDS; i++)
        if (v[i] != NULL && v[i] != Py_None) return 0;
    PyObject *values[MI_FIELDS] = {v[MI_TOPIC], v[MI_BODY], tags, mi_empty_tuple, mi_empty_props,
                                   Py_None, Py_None, Py_None, Py_None};
    for (int i = 0; i < MI_FIELDS; i++) {
        PyObject *slot = PyTuple_GET_ITEM(mi_slots, i);
        if (Py_TYPE(slot)->tp_descr_set(slot, self, values[i]) < 0) return -1;
    }
    return 1;
}

static PyObject *mi_init(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    int rc = mi_fill_common(self, args, nargs, kwnames);
    if (rc < 0) return NULL;
    if (rc == 1) Py_RETURN_NONE;
    /* checked(self, *args, **kwargs): the arguments as they came, self put first */
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    PyObject **all = PyMem_Malloc((size_t)(1 + nargs + nkw) * sizeof(PyObject *));
    if (all == NULL) return PyErr_NoMemory();
    all[0] = self;
    for (Py_ssize_t i = 0; i < nargs + nkw; i++) all[1 + i] = args[i];
    PyObject *r = PyObject_Vectorcall(mi_checked, all, (size_t)(1 + nargs), kwnames);
    PyMem_Free(all);
    return r;
}

static PyMethodDef mi_init_def = {
    "__init__", (PyCFunction)(void (*)(void))mi_init, METH_FASTCALL | METH_KEYWORDS,
    "__init__($self, /, topic, body, tags=None, keys=(), properties=None, delay_level=None, deliver_at_ms=None, "
    "message_group=None, priority=None)\n--\n\n"
    "Build a Message (compiled: the common case here, every other through the checked __init__)."};

static PyObject *py_message_init(PyObject *module, PyObject *args) {
    PyObject *cls, *slots, *topics, *tags, *empty_props, *checked;
    if (!PyArg_ParseTuple(args, "O!O!O!O!OO:message_init", &PyType_Type, &cls, &PyTuple_Type, &slots, &PySet_Type,
                          &topics, &PySet_Type, &tags, &empty_props, &checked))
        return NULL;
    if (PyTuple_GET_SIZE(slots) != MI_FIELDS) {
        PyErr_Format(PyExc_TypeError, "message_init: %d slots expected, got %zd", MI_FIELDS, PyTuple_GET_SIZE(slots));
        return NULL;
    }
    for (int i = 0; i < MI_FIELDS; i++) {
        if (Py_TYPE(PyTuple_GET_ITEM(slots, i))->tp_descr_set == NULL) {
            PyErr_Format(PyExc_TypeError, "message_init: slot %d is not a data descriptor", i);
            return NULL;
        }
    }
    if (!PyCallable_Check(checked)) {
        PyErr_SetString(PyExc_TypeError, "message_init: checked must be the Python __init__");
        return NULL;
    }
    for (int i = 0; i < MI_FIELDS; i++) {
        if (mi_names[i] == NULL && (mi_names[i] = PyUnicode_InternFromString(mi_field_names[i])) == NULL) return NULL;
    }
    if (mi_empty_tuple == NULL && (mi_empty_tuple = PyTuple_New(0)) == NULL) return NULL;
    Py_XSETREF(mi_slots, Py_NewRef(slots));
    Py_XSETREF(mi_known_topics, Py_NewRef(topics));
    Py_XSETREF(mi_known_tags, Py_NewRef(tags));
    Py_XSETREF(mi_empty_props, Py_NewRef(empty_props));
    Py_XSETREF(mi_checked, Py_NewRef(checked));
    return PyDescr_NewMethod((PyTypeObject *)cls, &mi_init_def);
}

#endif /* PLUGMQ_MESSAGEINIT_H */
