"""Event formats other than JSON: the schema registry's framing, Avro (pure: no driver)."""
