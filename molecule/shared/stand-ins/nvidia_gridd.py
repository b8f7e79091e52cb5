"""Test stand-in for NVIDIA's licensing daemon nvidia-gridd (molecule only).

Each start reads gridd.conf as gridd would, then appends one JSON line to the log: the
settings, and the token files in the directory ClientConfigTokenPath names with their
content, so a test sees what gridd found when it started and how often it was started.
"""
import json
import os
import sys

CONF = os.environ.get("COZYSTACK_GPU_STAND_IN_GRIDD_CONF", "/etc/nvidia/gridd.conf")
LOG = os.environ.get("COZYSTACK_GPU_STAND_IN_GRIDD_LOG", "/var/lib/stand-in/gridd.log")


def read_settings(path):
    """gridd.conf's KEY=value lines, comments and blank lines left out."""
    settings = {}
    try:
        with open(path, encoding="utf-8") as conf:
            for line in conf:
                line = line.strip()
                if line and not line.startswith("#") and "=" in line:
                    key, value = line.split("=", 1)
                    settings.setdefault(key.strip(), value.strip())
    except FileNotFoundError:
        pass
    return settings


def read_tokens(directory):
    """The token files (*.tok) gridd would find in the directory, by name."""
    tokens = {}
    if directory and os.path.isdir(directory):
        for name in sorted(os.listdir(directory)):
            path = os.path.join(directory, name)
            if name.endswith(".tok") and os.path.isfile(path):
                with open(path, encoding="utf-8") as token:
                    tokens[name] = token.read()
    return tokens


def main():
    """Record one start."""
    settings = read_settings(CONF)
    record = {
        "invocation": os.environ.get("INVOCATION_ID", ""),
        "settings": settings,
        "tokens": read_tokens(settings.get("ClientConfigTokenPath", "")),
    }
    os.makedirs(os.path.dirname(LOG), exist_ok=True)
    with open(LOG, "a", encoding="utf-8") as log:
        log.write(json.dumps(record, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
