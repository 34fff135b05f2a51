"""The catalog in PostgreSQL: numbered migrations, connections, one module per table family."""
