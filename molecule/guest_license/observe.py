"""What the guest_license scenario looks at after the token unit ran (molecule only), as
one JSON document: the unit's state and what its last run logged, the token directory,
gridd.conf, the nvidia-gridd stand-in's starts, and whether the licence disk is still
mounted. One command per look keeps the scenario quick on a busy machine."""
import glob
import json
import os
import subprocess
import sys

UNIT = "cozystack-gpu-guest-license.service"
TOKEN_DIR = "/run/nvidia-licence"
GRIDD_CONF = "/etc/nvidia/gridd.conf"
GRIDD_LOG = "/var/lib/stand-in/gridd.log"
MOUNT_DIRS = "/run/cozystack-gpu-licence-disk.*"


def run(*argv):
    """A command's standard output."""
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def read_lines(path):
    """A file's lines, or none when it is absent."""
    try:
        with open(path, encoding="utf-8") as text:
            return text.read().splitlines()
    except FileNotFoundError:
        return []


def unit_state():
    """ActiveState, Result and InvocationID of the token unit."""
    properties = run("systemctl", "show", "--property=ActiveState,Result,InvocationID", UNIT)
    return dict(line.split("=", 1) for line in properties.splitlines() if "=" in line)


def tokens():
    """The token directory's entries with mode and content; its file system type."""
    entries = {}
    if os.path.isdir(TOKEN_DIR):
        for name in sorted(os.listdir(TOKEN_DIR)):
            path = os.path.join(TOKEN_DIR, name)
            with open(path, encoding="utf-8") as token:
                entries[name] = {"mode": oct(os.stat(path).st_mode & 0o7777), "content": token.read()}
    fs_type = run("stat", "--file-system", "--format=%T", TOKEN_DIR).strip() if entries else ""
    return entries, fs_type


def disk_mounted():
    """Whether a licence disk mount point is still in the mount table."""
    return any("cozystack-gpu-licence-disk" in line for line in read_lines("/proc/self/mountinfo"))


def main():
    """Print the observation."""
    unit = unit_state()
    log = run("journalctl", "--no-pager", "--output=cat", "_SYSTEMD_INVOCATION_ID=" + unit["InvocationID"])
    entries, fs_type = tokens()
    observation = {
        "unit": unit,
        "log": log.splitlines(),
        "tokens": entries,
        "token_fs": fs_type,
        "conf": read_lines(GRIDD_CONF),
        "gridd_starts": [json.loads(line) for line in read_lines(GRIDD_LOG)],
        "disk_mounted": disk_mounted(),
        "mount_dirs": glob.glob(MOUNT_DIRS),
    }
    json.dump(observation, sys.stdout, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
