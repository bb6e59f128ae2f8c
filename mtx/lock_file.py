"""A lock file with a heartbeat: the exclusive right of one process to write what it guards, on one machine or
across the machines of a cluster that share a filesystem.

Two commands writing the same thing do happen: SLURM requeues a job whose first incarnation still runs, or a
second terminal starts the same command. So such a command holds a lock file, whose subclass of `LockFile` says
in its own words what a second holder would spoil (mtx.train.run_lock: a run directory; mtx.decode.shards: a
shard's output):

    {"host": ..., "pid": ..., "started": ISO time, "token": random hex, "command": "mtx train ..."}

The file is created with O_CREAT | O_EXCL, which only one creator can win (on local filesystems and NFS v3 and
later). A holder that dies leaves the file behind, so a lock is *stale*, and taken over, when

- its host is this host and its pid is not running (or the pid is ours but the token is no lock this process
  holds: a container restarted with the same hostname and pid), or
- its heartbeat is older than `stale_after`: the holder refreshes the file's mtime every `heartbeat` seconds from
  a daemon thread, so only a dead holder (or one whose filesystem or clock is far off) lets it age. This is what
  frees a lock left on a shared filesystem by another machine, whose pids we cannot check. The mtime is compared
  with this machine's clock, so hosts must agree on the time to well within `stale_after` (NTP does), or
- it cannot be parsed and has not changed for a few seconds (its creator was killed between create and write),
  or
- it was written by an earlier run of the same job: SLURM's requeued job keeps its SLURM_JOB_ID and counts up
  SLURM_RESTART_COUNT (torchrun's restarts keep its run id and count up TORCHELASTIC_RESTART_COUNT). When the
  holder was killed without releasing the lock (a node failure, a pre-emption whose grace ran out), the requeued
  job, often on another host, finds a lock with a fresh heartbeat; it is stale at once, since the incarnation
  that wrote it is over. Without this, the requeue would refuse, exit 1, and SLURM, which does not retry a failed
  job, would end the chain of requeues.

A holder can lose its lock while alive: suspended long enough for its heartbeat to age (SLURM's
PreemptMode=SUSPEND, an NFS stall), it finds on waking that another command took the lock over. `lost` says so
(the heartbeat finds out within `heartbeat` seconds, `still_held` at once), and the holder then stops before its
next write rather than write beside the new holder.

Taking over writes our content to a temporary file beside the lock and renames it over the lock. Judging a lock
stale and replacing it must be one step, or two commands that find the same stale lock could each replace it and
each read back its own token; `<lock>.takeover`, created with O_EXCL for the moment of the takeover, makes it
one step, so one of them takes the lock and the other refuses.
"""


from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import threading
import time
from abc import ABC, abstractmethod
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from mtx.errors import MtxError
from mtx.files import atomic_write

TORN_GRACE = 5.0  # seconds an unparseable lock may be young: its creator is between O_EXCL and write
TAKEOVER_GRACE = 10.0  # a takeover file this old was left by a command killed during the takeover
RETRY_SLEEP = 0.05  # wait between tries while another command is taking over or writing its lock

# Tokens of the locks held in this process, by any LockFile instance: a lock naming our own host and pid is ours
# only if its token is here (otherwise a previous process had our pid, e.g. in a restarted container).
_HELD_TOKENS: set[str] = set()


class LockFile(ABC):
    """The exclusive right of one process to write what the lock file `path` guards, for as long as it heartbeats.

    Use as a context manager or call `acquire` / `release`. After `acquire`, `replaced_stale` is the record of the
    stale lock that was taken over (with a `stale_reason`), or None, so the caller can say so; `lost` becomes True
    if the heartbeat (or `still_held`) finds the lock gone or taken over by another holder. A subclass says, in
    `_refusal`, what the lock guards and what to do when another process holds it.
    """

    def __init__(self, path: str | Path, stale_after: float = 300.0, heartbeat: float = 30.0) -> None:
        if not 0 < heartbeat < stale_after:
            raise ValueError(f"{type(self).__name__} needs 0 < heartbeat < stale_after, got heartbeat={heartbeat}, "
                             f"stale_after={stale_after}: a live holder must refresh the lock before it goes stale")
        self.path = Path(path)
        self.stale_after = stale_after
        self.heartbeat = heartbeat
        self.token = ""
        self.replaced_stale: dict[str, Any] | None = None
        self.lost = False
        self._held = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- the public API -------------------------------------------------------------------------------------

    def acquire(self) -> None:
        """Take the lock, or raise MtxError naming the holder (host, pid, start, last heartbeat) if it is live."""
        if self._held:
            raise RuntimeError(f"{self.path} is already held by this {type(self).__name__}")
        self.token = secrets.token_hex(16)
        self.replaced_stale = None
        self.lost = False
        # Registered before the file exists, so another thread of this process never mistakes our fresh lock
        # for one left by an earlier process with our pid.
        _HELD_TOKENS.add(self.token)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._acquire(self._content())
        except OSError as e:
            _HELD_TOKENS.discard(self.token)
            raise MtxError(f"Cannot create the lock file {self.path} ({e.strerror or e}): check that "
                           f"{self.path.parent} is writable.") from None
        except BaseException:
            _HELD_TOKENS.discard(self.token)
            raise
        self._held = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="mtx-lock-heartbeat", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop the heartbeat and remove the lock, unless another holder has taken it over meanwhile."""
        if not self._held:
            return
        self._held = False
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        _HELD_TOKENS.discard(self.token)
        try:
            if _token_of(_read(self.path)) == self.token:
                self.path.unlink(missing_ok=True)
        except OSError:
            # release runs on the way out, often while an error propagates: never mask it. A lock left behind
            # goes stale by its dead pid or its heartbeat.
            pass

    def still_held(self) -> bool:
        """Whether the lock file still holds our token, read now (not at the last heartbeat): asked before each
        checkpoint write. A passing error of the filesystem counts as held; the next look decides."""
        if not self._held or self.lost:
            return False
        try:
            if _token_of(_read(self.path)) != self.token:
                self.lost = True
        except OSError:
            pass
        return not self.lost

    def holder(self) -> str:
        """Who holds the lock file now, in words, for the message of a holder that lost it."""
        try:
            found = _read(self.path)
        except OSError as e:
            return f"unknown ({e.strerror or e})"
        if found is None:
            return "nobody: the lock file was removed"
        record = found[0] or {}
        return f"host {record.get('host', '?')}, pid {record.get('pid', '?')}, `{record.get('command') or '?'}`"

    def describe(self, holder: dict[str, Any], age: float) -> str:
        """The live holder `holder` (a parsed record whose heartbeat is `age` s old) in words, for a refusal."""
        here = " (this machine)" if holder["host"] == socket.gethostname() else ""
        started = holder.get("started", "at an unknown time")
        return f"host {holder['host']}{here}, pid {holder['pid']}, started {started}, last heartbeat {age:.0f} s ago"

    def stale_advice(self) -> str:
        """What frees the lock of a holder that is gone, for a refusal."""
        return (f"If that process is gone (on another machine), the lock goes stale after "
                f"{_duration(self.stale_after)} without a heartbeat; or delete {self.path} yourself if you are sure.")

    def __enter__(self) -> LockFile:
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()

    # ---- acquiring ------------------------------------------------------------------------------------------

    def _content(self) -> bytes:
        record = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": datetime.now().astimezone().isoformat(timespec="seconds"),
            "token": self.token,
            "command": " ".join(sys.argv),
            **job_identity(),
        }
        return (json.dumps(record) + "\n").encode()

    def _acquire(self, content: bytes) -> None:
        # Tries end either in success or in a refusal; they repeat only while another command is in the middle
        # of creating or taking over the lock, which takes milliseconds (or TAKEOVER_GRACE if it was killed).
        deadline = time.monotonic() + TAKEOVER_GRACE + 5.0
        while time.monotonic() < deadline:
            if _create_exclusive(self.path, content):
                return
            found = _read(self.path, wait_torn=True)
            if found is None:  # released between our create and our read
                continue
            if self._stale_reason(*found) is None:
                raise MtxError(self._refusal(*found))
            if self._take_over(content):
                return
        raise MtxError(f"Could not lock {self.path}: other commands kept creating or taking it over for "
                       f"{TAKEOVER_GRACE + 5.0:.0f} s. Is a script starting the same command in a loop?")

    def _take_over(self, content: bytes) -> bool:
        """Replace a stale lock; False if the caller should look again (another command was taking over)."""
        guard = self.path.with_name(self.path.name + ".takeover")
        if not _create_exclusive(guard, content):
            age = _age(guard)
            if age is not None and age > TAKEOVER_GRACE:
                guard.unlink(missing_ok=True)
            else:
                time.sleep(RETRY_SLEEP)
            return False
        try:
            # Judged again under the guard: another command may have taken the lock since we first read it.
            found = _read(self.path, wait_torn=True)
            if found is None:
                return False
            reason = self._stale_reason(*found)
            if reason is None:
                raise MtxError(self._refusal(*found))
            atomic_write(self.path, lambda f: f.write(content))  # readers see the old lock or ours
            if _token_of(_read(self.path)) != self.token:  # only if the guard itself was broken meanwhile
                return False
            old, age = found
            self.replaced_stale = {**(old or {}), "heartbeat_age": round(age, 1), "stale_reason": reason}
            return True
        finally:
            guard.unlink(missing_ok=True)

    def _stale_reason(self, holder: dict[str, Any] | None, age: float) -> str | None:
        """Why the lock (`holder` None if unparseable; heartbeat `age` seconds) is stale, or None if it is live."""
        if holder is None:
            return f"unreadable lock file, unchanged for {age:.0f} s" if age > TORN_GRACE else None
        ours = job_identity()
        if ours and holder.get("job") == ours["job"] and _restart(holder) < ours["restart"]:
            return (f"written by restart {_restart(holder)} of this job ({ours['job']}), which is now at restart "
                    f"{ours['restart']}: that incarnation is over")
        if age > self.stale_after:
            return f"no heartbeat for {age:.0f} s (stale after {self.stale_after:g} s)"
        if holder["host"] == socket.gethostname():
            pid = holder["pid"]
            if pid == os.getpid():
                if holder["token"] not in _HELD_TOKENS:
                    return f"pid {pid} is this process, which did not take that lock"
            elif not _pid_alive(pid):
                return f"pid {pid} is not running on {holder['host']}"
        return None

    @abstractmethod
    def _refusal(self, holder: dict[str, Any] | None, age: float) -> str:
        """Why the caller may not write, while `holder` (None: a lock file being written, `age` s old) holds the
        lock, and what to do: the message of the MtxError."""

    # ---- holding --------------------------------------------------------------------------------------------

    def _beat(self) -> None:
        """Refresh the lock's mtime while it is still ours; never recreate it once it is gone or taken over."""
        while not self._stop.wait(self.heartbeat):
            if not self.still_held():
                return
            try:
                os.utime(self.path)
            except FileNotFoundError:
                self.lost = True
                return
            except OSError:
                continue  # a passing hiccup of a network filesystem: the next beat tries again


def job_identity() -> dict[str, Any]:
    """{"job": id, "restart": count} of the scheduler's job this process belongs to, or {} outside one.

    Under SLURM the job id survives a requeue and SLURM_RESTART_COUNT counts the requeues; under torchrun alone,
    its run id (--rdzv-id; "none" when not given, which names no job) survives its restarts and
    TORCHELASTIC_RESTART_COUNT counts them.
    """
    env = os.environ
    if env.get("SLURM_JOB_ID"):
        return {"job": f"slurm:{env['SLURM_JOB_ID']}", "restart": int(env.get("SLURM_RESTART_COUNT") or 0)}
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none":
        return {"job": f"torchrun:{run_id}", "restart": int(env.get("TORCHELASTIC_RESTART_COUNT") or 0)}
    return {}


def _restart(holder: dict[str, Any]) -> int:
    restart = holder.get("restart")
    return restart if isinstance(restart, int) and not isinstance(restart, bool) else 0


# ---- files ----------------------------------------------------------------------------------------------------


def _create_exclusive(path: Path, content: bytes) -> bool:
    """Create `path` holding `content` if no file of that name exists; False if one does."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
    except FileExistsError:
        return False
    try:
        os.write(fd, content)
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def _read(path: Path, wait_torn: bool = False) -> tuple[dict[str, Any] | None, float] | None:
    """(holder record, or None if unparseable; seconds since its last heartbeat), or None if there is no lock.

    With `wait_torn`, a young unparseable file is read again for a moment: its creator is usually just between
    creating it and writing it.
    """
    tries = 5 if wait_torn else 1
    for attempt in range(tries):
        try:
            with open(path, "rb") as f:
                mtime = os.fstat(f.fileno()).st_mtime
                raw = f.read()
        except FileNotFoundError:
            return None
        age = max(0.0, time.time() - mtime)
        holder = _parse(raw)
        if holder is not None or age > TORN_GRACE:
            break
        if attempt < tries - 1:
            time.sleep(RETRY_SLEEP)
    return holder, age


def _parse(raw: bytes) -> dict[str, Any] | None:
    """The lock record, or None unless it is JSON with a host, a positive pid and a token."""
    try:
        record = json.loads(raw)
    except ValueError:  # torn or not JSON (UnicodeDecodeError is a ValueError too)
        return None
    if not isinstance(record, dict):
        return None
    host, pid, token = record.get("host"), record.get("pid"), record.get("token")
    if not (isinstance(host, str) and isinstance(pid, int) and not isinstance(pid, bool) and pid > 0
            and isinstance(token, str)):
        return None
    return record


def _token_of(found: tuple[dict[str, Any] | None, float] | None) -> str | None:
    return found[0]["token"] if found is not None and found[0] is not None else None


def _age(path: Path) -> float | None:
    try:
        return max(0.0, time.time() - path.stat().st_mtime)
    except FileNotFoundError:
        return None


def _pid_alive(pid: int) -> bool:
    """Whether `pid` runs on this machine; when in doubt True, and the heartbeat decides."""
    if sys.platform == "win32":  # os.kill(pid, 0) would terminate the process there
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: alive, but another user's
        return True
    return True


def _duration(seconds: float) -> str:
    return f"{seconds / 60:g} minutes" if seconds >= 120 else f"{seconds:g} s"
