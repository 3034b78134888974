"""The Prometheus metrics: updated from events, and rendered at scrape time."""
