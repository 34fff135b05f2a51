"""Event formats besides JSON: the schema registry's framing, Avro and Protobuf (pure: no
driver library)."""
