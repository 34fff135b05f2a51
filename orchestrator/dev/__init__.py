"""The embedded stack of `kappa dev up`: PostgreSQL, the broker, the ack proxy, the archiver
and a Spark cluster, as processes of this host."""
