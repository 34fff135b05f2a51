"""The Kafka adapter: admin calls, readers, producers, consumer groups and the endpoint
(security settings) that every client shares."""
