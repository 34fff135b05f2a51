"""Sample data and the demo: the pageview story, its profiles and its producer."""
