"""What runs in a Spark driver: the driver's loop, its query, batch commits, heartbeats and
retries. The read path is in read/, starting drivers in launch/."""
