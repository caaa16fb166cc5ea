"""PySpark data source `pulsarwire`: topics to DataFrames and back, batch and streaming.

    from pulsarwire.spark import PulsarDataSource
    spark.dataSource.register(PulsarDataSource)
    df = (spark.read.format("pulsarwire").option("service.url", "pulsar://127.0.0.1:6650")
          .option("topic", "events").load())

One module per concern: options (every option checked), offsets (boundaries between messages),
positions (where they are on the broker), connect (clients on private event loops), columns and
arrow (the source's columns, built from the codec's), reader (one range on a task), source (the
driver's planning), sink, types (a topic's schema as Spark types), datasource (what Spark
registers). Only options cross to executors.
"""
from __future__ import annotations

from .arrow import message_id_topic
from .columns import HEADERS, SCHEMA
from .datasource import PulsarDataSource, register
from .errors import PulsarDataLossError, PulsarSparkError
from .offsets import Boundary, canonical
from .options import ClientSettings, SinkOptions, SourceOptions, sink_options, source_options
from .reader import RangeGroup, RangePartition
from .sink import PulsarBatchWriter, PulsarStreamWriter, SentMessage, WriteIdentity
from .source import PulsarBatchReader, PulsarStreamReader, source_schema, with_value_type

__all__ = ["PulsarDataSource", "register", "SCHEMA", "Boundary", "PulsarSparkError", "PulsarDataLossError",
           "message_id_topic"]
