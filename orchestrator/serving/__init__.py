"""Read aliases: the views readers query, their routing, and the switches between versions."""
