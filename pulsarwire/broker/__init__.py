"""The embedded broker, in layers whose imports point one way:

    storage  ->  metafile  ->  topic, subscription (domain)  ->  core  ->  pulsar, v1 (front ends)  ->  server

`storage` keeps logs on disk; `metafile` writes and checks the small metadata
files; `topic` and `subscription` hold topics, subscriptions and dispatch, reaching consumers and producers only through `ConsumerLink` and
`ProducerLink`; `core` is the topic registry, naming, deduplication and group
commit; each front end speaks one protocol; `server.Broker` starts the listeners.
"""
