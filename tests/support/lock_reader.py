"""The reader's side of the hidden-states lock protocol as the design states it (docs/design/
extract-hidden-states.md, 1.2), written from that description: the tests' own lock-aware reader
(the installed clients' readers are exercised by tests/unit/test_hidden_states_shims.py where a
cell has them)."""

from __future__ import annotations

import fcntl
import os
import time


def contract_reader_wait(lock_path: str, timeout: float = 10.0, poll_interval: float = 0.1) -> None:
    """Try an exclusive non-blocking flock on ``lock_path`` every ``poll_interval`` seconds until
    ``timeout`` (TimeoutError), then delete the lock file."""
    deadline = time.monotonic() + timeout
    fd = os.open(lock_path, os.O_RDWR)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"lock {lock_path} still held after {timeout} s") from None
                time.sleep(poll_interval)
    finally:
        os.close(fd)
    os.remove(lock_path)
