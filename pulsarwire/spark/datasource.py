"""The data source Spark registers: format `pulsarwire`, its source and its sink."""
from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import BinaryType, StructType

from .connect import _run, _with_client
from .errors import PulsarSparkError
from .options import SinkOptions, SourceOptions, _options, sink_options, source_options
from .sink import PulsarBatchWriter, PulsarStreamWriter, _check_sink_schema
from .source import PulsarBatchReader, PulsarStreamReader, select_columns, source_schema, with_value_type

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

class PulsarDataSource(DataSource):
    """Format `pulsarwire` (`pulsar` is taken by other connectors)."""

    @classmethod
    def name(cls) -> str:
        return "pulsarwire"

    def schema(self) -> StructType:
        # called at load() for reads: check every option there (batch or stream is known later),
        # and read the topics' schema for the value's type
        return source_schema(with_value_type(source_options(_options(self.options), streaming=None)))

    def reader(self, schema: StructType) -> PulsarBatchReader:
        return PulsarBatchReader(self._source(schema, streaming=False))

    def streamReader(self, schema: StructType) -> PulsarStreamReader:
        return PulsarStreamReader(self._source(schema, streaming=True))

    def _source(self, schema: StructType | None, streaming: bool) -> SourceOptions:
        opts = with_value_type(source_options(_options(self.options), streaming=streaming))
        return opts if schema is None else select_columns(opts, schema)

    def writer(self, schema: StructType, overwrite: bool) -> PulsarBatchWriter:
        opts, fields = self._sink(schema, overwrite)
        if opts.exactly_once:
            raise PulsarSparkError("option 'exactlyOnce' is for streaming writes (a batch write has no "
                                   "micro-batch to replay)")
        return PulsarBatchWriter(opts, fields)

    def streamWriter(self, schema: StructType, overwrite: bool) -> PulsarStreamWriter:
        return PulsarStreamWriter(*self._sink(schema, overwrite))

    def _sink(self, schema: StructType, overwrite: bool) -> tuple[SinkOptions, dict[str, str]]:
        if overwrite:
            raise PulsarSparkError("mode 'overwrite' cannot be honoured: a Pulsar topic is append-only "
                                   "(use mode 'append')")
        opts = sink_options(_options(self.options))
        typed = False
        topic = opts.topic
        if topic is not None and "value" in schema.fieldNames() \
                and not isinstance(schema["value"].dataType, BinaryType):
            typed = _run(_with_client(opts.client, lambda client: client.get_schema_info(topic))) is not None
        return opts, _check_sink_schema(schema, opts.topic is not None, typed)


def register(spark: SparkSession) -> None:
    """spark.dataSource.register(PulsarDataSource), spelled shorter."""
    spark.dataSource.register(PulsarDataSource)


