"""The binder's pure rules: what a part decides, from objects and the clock alone (no API
client, no view), so each is tested on hand-made objects."""
