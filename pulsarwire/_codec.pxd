# What other Cython modules (pulsarwire.broker._staging) read of the codec at C level: a
# SendFrame's fields without attribute lookups, a stored entry's message count and a receipt.
cimport cython


@cython.final
cdef class SendFrame:
    cdef readonly object producer_id
    cdef readonly object sequence_id
    cdef readonly object num_messages
    cdef readonly object highest_sequence_id
    cdef readonly bint is_chunk
    cdef readonly object publish_time
    cdef readonly object deliver_at_time
    cdef readonly object chunk_id
    cdef readonly object metadata_and_payload
    cdef readonly object checksum
    cdef readonly Py_ssize_t size
    cdef readonly object num_messages_in_batch  # from the metadata; None: not a batch
    cdef readonly int compression


cdef object _count_entry_batch(entry, long count)
cdef bytes _send_receipt(producer_id, sequence_id, highest_sequence_id, ledger_id, entry_id)
