# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Cython twin of pulsarwire.client._receiving_py: a consumer's per-message work between the
event loop and its callers, for runs of messages (same API, same behaviour; and the messages
it makes are left out of the garbage collector's tracking, see make_untracked)."""
from cpython.object cimport PyObject, PyTypeObject
from cpython.tuple cimport PyTuple_CheckExact

from types import MemberDescriptorType

IMPLEMENTATION = "cython"

cdef extern from "Python.h":
    ctypedef struct PyMemberDef:
        int type
        Py_ssize_t offset
    ctypedef struct PyMemberDescrObject:
        PyMemberDef *d_member
    object PyType_GenericAlloc(PyTypeObject *cls, Py_ssize_t nitems)
    void PyObject_GC_UnTrack(void *op)
    void Py_INCREF(object o)

cdef int _T_OBJECT_EX = 16  # structmember.h: a __slots__ entry
cdef dict _slot_offsets = {}  # class -> the offsets of its __slots__, in order


cdef tuple _offsets_of(cls, shared):
    """Where each of cls's __slots__ lies in its objects: only a class of __slots__ alone, on
    object, whose objects PyType_GenericAlloc makes (as object.__new__ does for it)."""
    offsets = _slot_offsets.get(cls)
    if offsets is None:
        names = cls.__dict__.get("__slots__")
        if cls.__bases__ != (object,) or not isinstance(names, tuple) or not names \
                or "__init__" not in cls.__dict__ or cls.__new__ is not object.__new__:
            raise TypeError(f"make_untracked: {cls!r} is not a class of __slots__ alone")
        found = []
        for name in names:
            descriptor = cls.__dict__.get(name)
            if type(descriptor) is not MemberDescriptorType or \
                    (<PyMemberDescrObject*>descriptor).d_member.type != _T_OBJECT_EX:
                raise TypeError(f"make_untracked: {cls!r}.{name} is not a __slots__ entry")
            found.append((<PyMemberDescrObject*>descriptor).d_member.offset)
        offsets = tuple(found)
        _slot_offsets[cls] = offsets
    if shared is not None and len(<tuple>offsets) < 2:
        raise TypeError(f"make_untracked: {cls!r} has no slot for the shared value")
    return offsets


cdef inline void _set_slot(object obj, Py_ssize_t offset, object value):
    Py_INCREF(value)  # the slot is NULL: the object is new
    (<PyObject**>((<char*><PyObject*>obj) + offset))[0] = <PyObject*>value


cdef object _made(cls, tuple offsets, item, shared):
    """One object of cls, untracked: its slots item, shared (when not None), then None."""
    cdef Py_ssize_t k, first_none = 1
    obj = PyType_GenericAlloc(<PyTypeObject*>cls, 0)
    PyObject_GC_UnTrack(<PyObject*>obj)
    _set_slot(obj, offsets[0], item)
    if shared is not None:
        _set_slot(obj, offsets[1], shared)
        first_none = 2
    for k in range(first_none, len(offsets)):
        _set_slot(obj, offsets[k], None)
    return obj


def make_untracked(cls, list items, shared=None):
    """`[cls(item, shared) for item in items]` (`cls(item)` when shared is None), each object
    left out of the garbage collector's tracking. cls is a class of `__slots__` alone whose
    `__init__` sets them in order: to item, shared (when given), then None; here they are set
    directly, without the call (a quarter of a consumer's time went to making these objects).

    For the objects made per received message (pulsarwire.Message, the official surface's
    wrapper): a tracked object per message set off a young-generation collection every few
    hundred messages, 10-20 % of a consumer's time. Only objects through which no reference
    cycle can run may be made here (a collection would never free such a cycle): the consumer
    drops what refers back to its messages when it closes.
    """
    cdef tuple offsets = _offsets_of(cls, shared)
    cdef Py_ssize_t i
    cdef list made = [None] * len(items)
    for i in range(len(items)):
        made[i] = _made(cls, offsets, items[i], shared)
    return made


def make_one_untracked(cls, item):
    """`make_untracked(cls, [item])[0]`."""
    return _made(cls, _offsets_of(cls, None), item, None)


def take_messages(items, Py_ssize_t count, Py_ssize_t max_bytes, Py_ssize_t size, bint have):
    """See the pure twin."""
    cdef list out = []
    cdef Py_ssize_t length
    popleft = items.popleft
    while len(out) < count:
        try:
            message = popleft()
        except IndexError:
            break
        if max_bytes > 0:
            length = message._single.payload_size
            if (out or have) and size + length > max_bytes:
                items.appendleft(message)
                return out, size, True
            size += length
        out.append(message)
    return out, size, False


def count_taken(list taken):
    """See the pure twin."""
    cdef list runs = []
    cdef Py_ssize_t count = 0
    owner = None
    last = None
    for message in taken:
        this = message._ack_unit.owner
        if this is not owner:
            if count:
                runs.append((owner, count, last))
            owner = this
            count = 0
        count += 1
        last = message
    if count:
        runs.append((owner, count, last))
    return runs


def fold_acks(items):
    """See the pure twin."""
    cdef list out = []
    cdef Py_ssize_t first = -2, last = -2, index
    unit = None
    popleft = items.popleft
    while True:
        try:
            item = popleft()
        except IndexError:
            break
        if PyTuple_CheckExact(item):
            if unit is not None:
                out.append((unit, first, last))
                unit = None
            out.append(item)
            continue
        this = item._ack_unit
        index = item._single.batch_index
        if this is unit and first >= 0 and index == last + 1:
            last = index
            continue
        if unit is not None:
            out.append((unit, first, last))
        unit = this
        first = index
        last = index
    if unit is not None:
        out.append((unit, first, last))
    return out
