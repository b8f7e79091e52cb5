"""The binder's parts: each keeps one concern (the gate, the usage records and reports,
attachments, waiting notes) and writes only through the handle the loop gives it."""
