"""The binder: claims bound when ordered, kept through stops, moved and rebound."""
