"""The columns the source gives: Spark's schema of a read, and the same as an Arrow schema."""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from pyspark.sql.types import (
    ArrayType, BinaryType, IntegerType, LongType, MapType, StringType, StructField, StructType, TimestampType,
)

if TYPE_CHECKING:
    import pyarrow as pa

SCHEMA = StructType([
    StructField("value", BinaryType()),
    StructField("__key", StringType()),
    StructField("__topic", StringType()),
    StructField("__messageId", BinaryType()),
    StructField("__publishTime", TimestampType()),
    StructField("__eventTime", TimestampType()),
    StructField("__messageProperties", MapType(StringType(), StringType())),
    StructField("__ledgerId", LongType()),
    StructField("__entryId", LongType()),
    StructField("__batchIndex", IntegerType()),
    StructField("__partition", IntegerType()),
])

# includeHeaders: the message properties as the Kafka source's headers column
HEADERS = StructField("headers", ArrayType(StructType([StructField("key", StringType()),
                                                      StructField("value", BinaryType())])))

@functools.cache
def _arrow_schema() -> pa.Schema:
    """SCHEMA as an Arrow schema (built once: pyarrow is imported when first asked)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    return to_arrow_schema(SCHEMA, timezone="UTC")


